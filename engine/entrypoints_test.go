package engine

import (
	"errors"
	"slices"
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

// The seeds' deriveEntrypoints lists the default entrypoints in the order of the lease's ports,
// which is the declaration's bases order (HTTP, DB, API -> http, db, api), not sorted.
func TestDeriveEntrypointsDefaultOrder(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", "[ports]\nstep = 10\ncount = 20\n[ports.bases]\nHTTP = 18080\nDB = 15432\nAPI = 19000\n", "s")
	claimStack(t, e, "s", "me", untracked("me"))
	info, err := e.Cockpit("app")
	if err != nil {
		t.Fatal(err)
	}
	result := stackOf(t, e).DeriveEntrypoints(info.Entrypoints, info.BaseOrder, nil)
	var names []string
	for _, v := range result.Values {
		names = append(names, v.Name)
	}
	if want := []string{"http", "db", "api"}; !slices.Equal(names, want) {
		t.Fatalf("default entrypoints %v, want %v", names, want)
	}
}
