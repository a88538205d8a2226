package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
)

func TestEphemeralRangeParses(t *testing.T) {
	for text, want := range map[string]ephemeralRange{
		"32768\t60999\n": {32768, 60999},
		"1024 65535":     {1024, 65535},
		" 5000 5000 \n":  {5000, 5000},
	} {
		got, err := parseEphemeralRange(text)
		if err != nil || got != want {
			t.Errorf("ParseEphemeralRange(%q) = %v, %v; want %v", text, got, err, want)
		}
	}
}

func TestEphemeralRangeRefusesMalformed(t *testing.T) {
	for _, text := range []string{"", "\n", "32768", "32768 60999 1", "a b", "32768 6o999", "60999 32768", "0 100", "1 65536", "-1 5"} {
		if got, err := parseEphemeralRange(text); err == nil {
			t.Errorf("ParseEphemeralRange(%q) = %v, want an error", text, got)
		}
	}
}

func TestEphemeralRangeOfThisHost(t *testing.T) {
	r := hostEphemeralRange(t)
	if r.Low < 1 || r.Low > r.High || r.High > 65535 {
		t.Fatalf("range %v", r)
	}
}

func TestEphemeralOverlapListsCandidatesInside(t *testing.T) {
	decl := portdecl.Declaration{Step: 10, Count: 3, Bases: map[string]int{"HTTP": 100, "DB": 205}}
	// Candidates: HTTP 100 110 120, DB 205 215 225.
	got := ephemeralRange{Low: 105, High: 215}.ephemeralOverlap(decl)
	if want := []int{110, 120, 205, 215}; !slices.Equal(got, want) {
		t.Fatalf("overlap = %v, want %v", got, want)
	}
	if got := (ephemeralRange{Low: 300, High: 400}).ephemeralOverlap(decl); got != nil {
		t.Fatalf("overlap outside = %v, want none", got)
	}
	// Both ends are inside the range.
	if got := (ephemeralRange{Low: 100, High: 100}).ephemeralOverlap(decl); !slices.Equal(got, []int{100}) {
		t.Fatalf("overlap at the low end = %v", got)
	}
}

func TestEphemeralWarningSummarizesManyPorts(t *testing.T) {
	if got := summarizePorts([]int{1, 2, 3}); got != "1,2,3" {
		t.Fatalf("short = %q", got)
	}
	many := make([]int, 100)
	for i := range many {
		many[i] = 1000 + 10*i
	}
	if got, want := summarizePorts(many), "1000,1010,1020,1030,1040,…,1990 (100 ports)"; got != want {
		t.Fatalf("long = %q, want %q", got, want)
	}
}

// A config whose candidates lie in the kernel's range is accepted, and its events line warns.
func TestSetConfigWarnsOfEphemeralOverlap(t *testing.T) {
	t.Parallel()
	r := hostEphemeralRange(t)
	e := newEngine(t)
	newCockpit(t, e, "app", fmt.Sprintf("[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = %d\n", r.Low))
	warning := lastEventOf(t, e, "app", "").Warning
	want := fmt.Sprintf("candidate ports %d,%d overlap the kernel's ephemeral port range (%s); the kernel may hand them to any outgoing connection", r.Low, r.Low+10, r)
	if r.High < r.Low+10 {
		want = fmt.Sprintf("candidate ports %d overlap the kernel's ephemeral port range (%s); the kernel may hand them to any outgoing connection", r.Low, r)
	}
	if warning != want {
		t.Fatalf("warning = %q, want %q", warning, want)
	}
	// A config clear of the range carries none.
	clear := r.Low - 100
	if err := e.SetConfig(context.Background(), me("write", "app/config"), "app", fmt.Appendf(nil, "[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = %d\n", clear)); err != nil {
		t.Fatal(err)
	}
	if ev := lastEventOf(t, e, "app", ""); ev.Warning != "" || ev.Result != "ok" {
		t.Fatalf("events line of a clear config = %+v", ev)
	}
}

func hostEphemeralRange(t *testing.T) ephemeralRange {
	t.Helper()
	r, err := readEphemeralRange()
	if err != nil {
		t.Skipf("this host has no readable ephemeral range: %v", err)
	}
	if r.Low <= 200 {
		t.Skipf("ephemeral range %v leaves no room below it for the test's ports", r)
	}
	return r
}

func lastEventOf(t *testing.T, e *Engine, cockpit, stack string) event {
	t.Helper()
	data, err := e.events(cockpit, stack)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	var ev event
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &ev); err != nil {
		t.Fatalf("events line %q: %v", lines[len(lines)-1], err)
	}
	return ev
}
