package engine

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// Printable leaves printable text as it is and spells everything else as Go's strconv.Quote does,
// so strconv.Unquote gives the value back.
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"/src/app feature é": "/src/app feature é",
		`C:\dir`:             `C:\\dir`,
		"/a\nstate=dead":     `/a\nstate=dead`,
		"/a\tb\r":            `/a\tb\r`,
		"/\x1b[31mred":       `/\x1b[31mred`,
		"/del\x7f":           `/del\x7f`,
		"/csi\u009b2J":       `/csi\u009b2J`,
		"/rlo\u202eexe.txt":  `/rlo\u202eexe.txt`,
		"/ls\u2028":          `/ls\u2028`,
		"/bad\xff\xfe":       `/bad\xff\xfe`,
		"/quote\"'":          `/quote"'`,
		"":                   "",
	} {
		got := Printable(in)
		if got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
		for i := 0; i < len(got); i++ {
			if got[i] < ' ' || got[i] == 0x7f {
				t.Errorf("Printable(%q) holds byte %#x", in, got[i])
			}
		}
		if back, err := strconv.Unquote(`"` + strings.ReplaceAll(got, `"`, `\"`) + `"`); err != nil || back != in {
			t.Errorf("Printable(%q) = %q unquotes to %q, %v", in, got, back, err)
		}
	}
}

// PrintableJSON escapes what a terminal acts on and JSON leaves raw; a JSON reader reads the same.
func TestPrintableJSON(t *testing.T) {
	value := map[string]string{"checkout": "/del\x7f/csi\u009b2J/rlo\u202e/tag\U000e0001/é ok"}
	data, err := json.Marshal(value)
	if err != nil {
		t.Fatal(err)
	}
	got := PrintableJSON(data)
	if want := `{"checkout":"/del\u007f/csi\u009b2J/rlo\u202e/tag\udb40\udc01/é ok"}`; string(got) != want {
		t.Fatalf("PrintableJSON = %s, want %s", got, want)
	}
	var back map[string]string
	if err := json.Unmarshal(got, &back); err != nil || back["checkout"] != value["checkout"] {
		t.Fatalf("PrintableJSON reads back as %q, %v", back, err)
	}
}
