package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// The port declaration (SPEC §3) written the ways people and tools write files. Port bases here
// are 35xxx-36xxx.

// configGood is short, so that a refused document is rarely shorter than it (see
// TestConfigShorterDocumentReplaces for why that matters).
const configGood = "[ports]\nstep=1\ncount=1\n[ports.bases]\nA=35000\n"

// configSetup makes cockpit app with configGood accepted.
func configSetup(t *testing.T) *mount {
	t.Helper()
	m := newMount(t)
	m.ok("mkdir $M/app")
	claimsConfig(m, "app", configGood)
	if got := m.read("app/config"); got != configGood {
		t.Fatalf("config = %q", got)
	}
	return m
}

// Every invalid declaration is refused with EINVAL, for the reason named in events, and leaves
// the accepted config as it was.
func TestConfigRefusals(t *testing.T) {
	t.Parallel()
	m := configSetup(t)
	ports := func(body string) string { return "[ports]\nstep = 10\ncount = 4\n[ports.bases]\n" + body }
	for _, tc := range []struct{ name, doc, why string }{
		{"step 0", "[ports]\nstep = 0\ncount = 4\n[ports.bases]\nHTTP = 35000\n", "ports.step: 0 is less than 1"},
		{"count 0", "[ports]\nstep = 10\ncount = 0\n[ports.bases]\nHTTP = 35000\n", "ports.count: 0 is less than 1"},
		{"no bases table", "[ports]\nstep = 10\ncount = 4\n# no bases at all, padded to length\n", "at least one base"},
		{"empty bases", ports("# an empty table, padded to length\n"), "at least one base"},
		{"lowercase key", ports("http = 35000\n"), "ports.bases.http: key does not match"},
		{"key with dash", ports("HTTP-2 = 35000\n"), "key does not match"},
		{"base 0", ports("HTTP = 0\n"), "ports.bases.HTTP: 0 is outside 1-65535"},
		{"base 70000", ports("HTTP = 70000\n"), "ports.bases.HTTP: 70000 is outside 1-65535"},
		{"candidate beyond 65535", ports("HTTP = 65510\n"), "65540"},
		{"duplicate bases", ports("HTTP = 35000\nDB = 35000\n"), "bases must be distinct"},
		{"overlapping families", ports("HTTP = 35000\nDB = 35020\n"), "port 35020 is in two candidate families"},
		{"count x bases over 1024", "[ports]\nstep = 1\ncount = 513\n[ports.bases]\nHTTP = 40000\nDB = 41000\n", "more than 1024"},
		{"entrypoint to undeclared key", ports("HTTP = 35000\n") + "[entrypoints.web]\nport = \"API\"\npath = \"/\"\n", `"API" is not a key of [ports.bases]`},
		{"entrypoint path without slash", ports("HTTP = 35000\n") + "[entrypoints.web]\nport = \"HTTP\"\npath = \"app\"\n", `does not start with "/"`},
		{"entrypoint named like a default", ports("HTTP = 35000\n") + "[entrypoints.http]\nport = \"HTTP\"\npath = \"/x\"\n", "taken by the default entrypoint"},
		{"entrypoint bad scheme", ports("HTTP = 35000\n") + "[entrypoints.web]\nport = \"HTTP\"\npath = \"/\"\nscheme = \"f t p\"\n", "not a URL scheme"},
		{"entrypoint not loopback", ports("HTTP = 35000\n") + "[entrypoints.web]\nport = \"HTTP\"\npath = \"/\"\nhostname = \"example.com\"\n", "not a loopback"},
		{"toml syntax error", "[ports\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 35000\n", "toml"},
		{"unknown key", "[ports]\nstep = 10\ncount = 4\nfoo = 1\n[ports.bases]\nHTTP = 35000\n", "ports.foo: unknown key"},
		{"unknown table", ports("HTTP = 35000\n") + "[services]\nx = 1\n", "services: unknown key"},
		{"string step", "[ports]\nstep = \"10\"\ncount = 4\n[ports.bases]\nHTTP = 35000\n", "must be an integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := claimsEventCount(m, "app/events")
			m.refused("cat > $M/app/config <<'EOF'\n"+tc.doc+"EOF", syscall.EINVAL)
			ev := claimsRefusalEvent(t, m, "app/events", "PORT_FAMILY_OUT_OF_RANGE", "EINVAL")
			if ev["op"] != "write" || ev["path"] != "app/config" || ev["fix"] == "" {
				t.Errorf("event = %v", ev)
			}
			if msg := fmt.Sprint(ev["message"]); !strings.Contains(msg, tc.why) {
				t.Errorf("refused for %q, want a message naming %q", msg, tc.why)
			}
			if got := claimsEventCount(m, "app/events"); got != lines+1 {
				t.Errorf("events lines %d -> %d, want one more", lines, got)
			}
			if got := m.read("app/config"); got != configGood {
				t.Fatalf("a refused config replaced the accepted one: %q", got)
			}
		})
	}
}

// The config is accepted however a whole document arrives: cp, cat, dd with fsync, python with
// fsync; sync of the file succeeds; truncation alone changes nothing; >> continues the document.
// Every document here has the same length, so this test does not depend on O_TRUNC discarding
// the previous one (TestConfigShorterDocumentReplaces covers that).
func TestConfigWriters(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app")
	dir := t.TempDir()
	doc := func(n int) string {
		return fmt.Sprintf("[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = %d\n", 35100+n*100)
	}
	file := func(content string) string {
		f, err := os.CreateTemp(dir, "*.toml")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(content); err != nil {
			t.Fatal(err)
		}
		return f.Name()
	}
	current := ""
	accepted := func(t *testing.T, want string) {
		t.Helper()
		if got := m.read("app/config"); got != want {
			t.Fatalf("config = %q, want %q", got, want)
		}
		ev := claimsEvent(t, m, "app/events")
		if ev["result"] != "ok" || ev["path"] != "app/config" {
			t.Fatalf("last event %v", ev)
		}
		current = want
	}
	t.Run("cp", func(t *testing.T) {
		m.ok("cp " + file(doc(1)) + " $M/app/config")
		accepted(t, doc(1))
	})
	t.Run("cat", func(t *testing.T) {
		m.ok("cat > $M/app/config < " + file(doc(2)))
		accepted(t, doc(2))
	})
	t.Run("dd conv=fsync", func(t *testing.T) {
		m.ok("dd status=none conv=fsync if=" + file(doc(3)) + " of=$M/app/config")
		accepted(t, doc(3))
	})
	t.Run("python fsync", func(t *testing.T) {
		testtool.Need(t, "python3")
		py := "import os, sys\nwith open(sys.argv[1], 'w') as f:\n    f.write(sys.argv[2]); f.flush(); os.fsync(f.fileno())\n"
		m.ok("python3 -c \"" + py + "\" $M/app/config '" + doc(4) + "'")
		accepted(t, doc(4))
	})
	t.Run("sync and truncation change nothing", func(t *testing.T) {
		want, lines := current, claimsEventCount(m, "app/events")
		mtime := m.ok("stat -c %Y $M/app/config")
		m.ok("sync $M/app/config && sync -d $M/app/config")
		m.ok(": > $M/app/config")
		m.ok("truncate -s 0 $M/app/config")
		if got := m.read("app/config"); got != want {
			t.Fatalf("config = %q, want %q", got, want)
		}
		if got := claimsEventCount(m, "app/events"); got != lines {
			t.Fatalf("sync or truncation logged changes: %d -> %d lines", lines, got)
		}
		if got := m.ok("stat -c %Y $M/app/config"); got != mtime {
			t.Fatalf("mtime moved %s -> %s", mtime, got)
		}
	})
	t.Run("append", func(t *testing.T) {
		// >> continues the document: the appended table joins what is there.
		extra := "[entrypoints.x]\nport = \"HTTP\"\npath = \"/x\"\n"
		base := current
		m.ok("cat >> $M/app/config <<'EOF'\n" + extra + "EOF")
		accepted(t, base+extra)
		// The appended entrypoint is in force: a claim renders it.
		m.ok("mkdir $M/app/stacks/s && touch $M/app/stacks/s/holders/me")
		port := strings.TrimSpace(m.read("app/stacks/s/ports/HTTP"))
		if got := m.read("app/stacks/s/entrypoints/x"); got != "http://127.0.0.1:"+port+"/x\n" {
			t.Fatalf("entrypoints/x = %q (HTTP %s)", got, port)
		}
	})
}

// Replacing the config with a shorter document: the usual case of removing a port. `cat >`, cp
// and python's open('w') all open with O_TRUNC; the result must be exactly the new document.
func TestConfigShorterDocumentReplaces(t *testing.T) {
	t.Parallel()
	long := "[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 35600\nDB = 35700\n"
	short := "[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 35800\n"
	m := newMount(t)
	m.ok("mkdir $M/app")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "short.toml"), []byte(short), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, how := range []string{
		"cat > $M/app/config < " + dir + "/short.toml",
		"cp " + dir + "/short.toml $M/app/config",
	} {
		t.Run(strings.Fields(how)[0], func(t *testing.T) {
			claimsConfig(m, "app", long)
			r := m.sh(how)
			got := m.read("app/config")
			if r.Code != 0 || got != short {
				t.Fatalf("%s after a longer config: exit %d %s\nconfig now %q\nwant %q\nlast event %s",
					how, r.Code, r.Stderr, got, short, m.lastEvent("app/events"))
			}
		})
	}
}

// Reading config returns exactly the accepted bytes: comments, blank lines, key order; st_size
// is their length.
func TestConfigReadBack(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app")
	if got := m.read("app/config"); got != "" {
		t.Fatalf("config before any write = %q", got)
	}
	doc := "# a comment\n\n[ports]\ncount = 2   # inline\nstep = 5\n\n[ports.bases]\nZ = 36500\nA = 36600\n\n[entrypoints.admin]\npath = \"/admin\"\nport = \"A\"\nscheme = \"https\"\nhostname = \"localhost\"\n"
	claimsConfig(m, "app", doc)
	if got := m.read("app/config"); got != doc {
		t.Fatalf("config = %q, want %q", got, doc)
	}
	if got := strings.TrimSpace(m.ok("stat -c %s $M/app/config")); got != strconv.Itoa(len(doc)) {
		t.Fatalf("st_size %s, document %d bytes", got, len(doc))
	}
}

// Entrypoints follow the config, as the seeds derive them at every projection: editing an
// entrypoint's path, or adding one, shows at once on a running stack (its ports stay the lease's),
// and the files' mtime moves with it so make sees the change. A co-tenant may still join: only
// [ports] is the lease's declaration.
func TestConfigEntrypointsFollowTheConfig(t *testing.T) {
	m := newMount(t)
	ports := "[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 35900\n"
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + ports + "[entrypoints.web]\nport = \"HTTP\"\npath = \"/app\"\nEOF")
	m.ok("mkdir $M/app/stacks/s && touch $M/app/stacks/s/holders/me")
	if got := m.read("app/stacks/s/entrypoints/web"); got != "http://127.0.0.1:35900/app\n" {
		t.Fatalf("entrypoints/web = %q", got)
	}
	before := m.ok("stat -c %Y.%y $M/app/stacks/s/env")
	time.Sleep(1100 * time.Millisecond) // st_mtime in whole seconds must move
	m.ok("cat > $M/app/config <<'EOF'\n" + ports + "[entrypoints.web]\nport = \"HTTP\"\npath = \"/v2\"\n[entrypoints.admin]\nport = \"HTTP\"\npath = \"/admin\"\nscheme = \"https\"\nEOF")
	if got := m.read("app/stacks/s/entrypoints/web"); got != "http://127.0.0.1:35900/v2\n" {
		t.Fatalf("entrypoints/web after the edit = %q", got)
	}
	if got := m.ok("ls $M/app/stacks/s/entrypoints"); got != "admin\nhttp\nweb\n" {
		t.Fatalf("ls entrypoints = %q", got)
	}
	if env := m.read("app/stacks/s/env"); !strings.Contains(env, "ADMIN_URL=https://127.0.0.1:35900/admin\n") || !strings.Contains(env, "WEB_URL=http://127.0.0.1:35900/v2\n") {
		t.Fatalf("env after the edit:\n%s", env)
	}
	if after := m.ok("stat -c %Y.%y $M/app/stacks/s/env"); after == before {
		t.Fatalf("env's mtime did not move: %s", after)
	}
	m.ok("touch $M/app/stacks/s/holders/co-tenant")
}
