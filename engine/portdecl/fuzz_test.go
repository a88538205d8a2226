package portdecl

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzParse checks that Parse never panics and that whatever it accepts is a declaration whose
// candidate families are in range, disjoint and found again by FamilyAt, with entrypoints that
// render to distinct names and env variables; and that ParsePrefix never refuses the beginning
// of a document Parse accepts.
func FuzzParse(f *testing.F) {
	f.Add([]byte(specExample))
	f.Add([]byte(portsWith("10", "2", "HTTP = 8080", "DB = 8090")))
	f.Add([]byte("[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 8080\n[entrypoints.web]\nport = \"HTTP\"\npath = \"\"\"/a\n\"\"\"\n"))
	f.Fuzz(func(t *testing.T, text []byte) {
		config, err := Parse(text)
		// A prefix ParsePrefix refuses is the beginning of no valid document.
		for end := bytes.IndexByte(text, '\n'); end >= 0 && err == nil; {
			if refused := ParsePrefix(text[:end+1]); refused != nil {
				t.Fatalf("ParsePrefix refused %q (%v), the beginning of a valid document", text[:end+1], refused)
			}
			next := bytes.IndexByte(text[end+1:], '\n')
			if next < 0 {
				break
			}
			end += 1 + next
		}
		if err != nil {
			return
		}
		d := config.Declaration
		if err := d.Validate(); err != nil {
			t.Fatalf("Parse accepted a declaration Validate refuses: %v", err)
		}
		families := d.Candidates()
		if len(families) != d.Count {
			t.Fatalf("Candidates has %d families, want %d", len(families), d.Count)
		}
		seen := map[int]bool{}
		for index, family := range families {
			if family.Offset != index*d.Step {
				t.Fatalf("family %d has offset %d, want %d", index, family.Offset, index*d.Step)
			}
			if again, ok := d.FamilyAt(family.Offset); !ok || len(again.Ports) != len(family.Ports) {
				t.Fatalf("FamilyAt(%d) does not find candidate %d", family.Offset, index)
			}
			for key, port := range family.Ports {
				if port < 1 || port > 65535 || port != d.Bases[key]+family.Offset {
					t.Fatalf("candidate %s=%d at offset %d is wrong", key, port, family.Offset)
				}
				if seen[port] {
					t.Fatalf("port %d is in two families", port)
				}
				seen[port] = true
			}
		}
		resolved := Entrypoints(config.Entrypoints, families[0].Ports)
		if len(resolved) != len(d.Bases)+len(config.Entrypoints) {
			t.Fatalf("Entrypoints rendered %d of %d", len(resolved), len(d.Bases)+len(config.Entrypoints))
		}
		variables := map[string]bool{}
		for key := range d.Bases {
			variables[key] = true
		}
		for _, entrypoint := range resolved {
			if variables[EnvName(entrypoint.Name)] {
				t.Fatalf("env variable %s is set twice", EnvName(entrypoint.Name))
			}
			variables[EnvName(entrypoint.Name)] = true
			if strings.ContainsAny(entrypoint.URL, " \t\r\n") {
				t.Fatalf("entrypoint %s URL %q has white space", entrypoint.Name, entrypoint.URL)
			}
		}
	})
}
