package engine

import (
	"errors"
	"testing"
)

func TestParseDeclaredValues(t *testing.T) {
	got, err := parseDeclaredValues([]byte("# recorded\r\n\n web=http://localhost:1/a \ncb=https://x.example/cb\n"))
	if err != nil || len(got) != 2 || got["web"] != "http://localhost:1/a" || got["cb"] != "https://x.example/cb" {
		t.Fatalf("parseDeclaredValues = %v, %v", got, err)
	}
	// What another user's cat would show a terminal: ESC, BEL, a lone CR, C1 CSI, in a comment too.
	for _, bad := range []string{"web", "=x", "web=", "web=a b", "web=1\nweb=2", ".x=1", "w\xffb=1",
		"# \x1b]0;pwned\x07\nweb=x", "# fine\rforged\nweb=x", "# \u009b2J\nweb=x", "# \x7f\nweb=x"} {
		var r *Refusal
		if _, err := parseDeclaredValues([]byte(bad)); !errors.As(err, &r) || r.Code != StateRecordMalformed {
			t.Errorf("parseDeclaredValues(%q) = %v, want STATE_RECORD_MALFORMED", bad, err)
		}
	}
}

func TestIsLoopbackURL(t *testing.T) {
	for value, want := range map[string]bool{
		"http://localhost:8080/":      true,
		"http://127.0.0.1:8080/a":     true,
		"http://127.9.0.1/":           true,
		"http://[::1]:80/":            true,
		"https://auth.example.com/cb": false,
		"http://10.0.0.1:8080/":       false,
		"::not a url":                 false,
	} {
		if got := isLoopbackURL(value); got != want {
			t.Errorf("isLoopbackURL(%q) = %v, want %v", value, got, want)
		}
	}
}
