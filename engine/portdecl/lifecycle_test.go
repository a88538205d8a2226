package portdecl

import (
	"strings"
	"testing"
	"time"
)

func TestParseLifecycle(t *testing.T) {
	for doc, want := range map[string]Lifecycle{
		ports:                              {},
		ports + "[gc]\n":                   {},
		ports + "[gc]\ngrace = \"90s\"\n":  {GC: 90 * time.Second},
		ports + "[stop]\ngrace = \"1s\"\n": {Stop: time.Second},
		ports + "[gc]\ngrace = \"720h\"\n[stop]\ngrace = \"1m\"\n": {GC: 720 * time.Hour, Stop: time.Minute},
	} {
		cfg, err := Parse([]byte(doc))
		if err != nil || cfg.Lifecycle != want {
			t.Errorf("%q: %+v, %v; want %+v", doc, cfg.Lifecycle, err, want)
		}
	}
	if l := (Lifecycle{}); l.GCGrace() != DefaultGCGrace || l.StopGrace() != DefaultStopGrace {
		t.Errorf("defaults: %v %v", l.GCGrace(), l.StopGrace())
	}
}

func TestParseLifecycleRefuses(t *testing.T) {
	for doc, want := range map[string]string{
		ports + "[gc]\ngrace = \"soon\"\n":  `gc.grace: "soon" is not a duration`,
		ports + "[gc]\ngrace = 600\n":       "gc.grace: must be a string, got integer 600",
		ports + "[gc]\ngrace = \"500ms\"\n": "gc.grace: 500ms is outside 1s-720h0m0s",
		ports + "[gc]\ngrace = \"721h\"\n":  "gc.grace: 721h0m0s is outside 1s-720h0m0s",
		ports + "[stop]\ngrace = \"2m\"\n":  "stop.grace: 2m0s is outside 1s-1m0s",
		ports + "[stop]\nafter = \"1s\"\n":  "stop.after: unknown key (expected one of grace)",
		"gc = 1\n" + ports:                  "gc: must be a table",
	} {
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", doc, err, want)
		}
	}
}
