package portdecl

import (
	"fmt"
	"time"
)

// A stack's life beyond its lease (docs/worktrees.md): how long a stack may be stale (every holder
// dead or pid-less, every checkout gone) before the daemon drains it ([gc] grace), and how long
// a drain's stop step waits after SIGTERM before SIGKILL ([stop] grace).

const (
	// DefaultGCGrace is [gc] grace when the config gives none: long enough for a worktree moved
	// or re-created by hand to come back, short enough that a removed one frees its family the
	// same hour.
	DefaultGCGrace = 10 * time.Minute
	// DefaultStopGrace is [stop] grace when the config gives none: what a dev server needs to
	// close its connections and flush.
	DefaultStopGrace = 10 * time.Second
	minGrace         = time.Second
	maxGCGrace       = 30 * 24 * time.Hour
	maxStopGrace     = time.Minute
)

// Lifecycle is what [gc] and [stop] set; a zero field is its default (GCGrace, StopGrace).
type Lifecycle struct {
	GC   time.Duration `json:",omitempty"`
	Stop time.Duration `json:",omitempty"`
}

// GCGrace is how long a stack stays stale before the daemon drains it.
func (l Lifecycle) GCGrace() time.Duration {
	if l.GC == 0 {
		return DefaultGCGrace
	}
	return l.GC
}

// StopGrace is how long the stop step waits after SIGTERM before SIGKILL.
func (l Lifecycle) StopGrace() time.Duration {
	if l.Stop == 0 {
		return DefaultStopGrace
	}
	return l.Stop
}

// parseLifecycle reads the optional [gc] and [stop] tables, each with one optional key, grace: a
// Go duration ("90s", "10m", "1h30m") within its bounds.
func parseLifecycle(document map[string]any) (Lifecycle, error) {
	var l Lifecycle
	var err error
	if l.GC, err = graceIn(document, "gc", maxGCGrace); err != nil {
		return l, err
	}
	l.Stop, err = graceIn(document, "stop", maxStopGrace)
	return l, err
}

// graceIn is the grace of document's table name, 0 without one.
func graceIn(document map[string]any, name string, most time.Duration) (time.Duration, error) {
	raw, ok := document[name]
	if !ok {
		return 0, nil
	}
	t, err := table(raw, name)
	if err != nil {
		return 0, err
	}
	if err := onlyKeys(t, name+".", "grace"); err != nil {
		return 0, err
	}
	if _, ok := t["grace"]; !ok {
		return 0, nil // the default
	}
	where := name + ".grace"
	s, err := text(t, "grace", where)
	if err != nil {
		return 0, err
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a duration such as \"90s\", \"10m\" or \"1h30m\"", where, s)
	}
	if d < minGrace || d > most {
		return 0, fmt.Errorf("%s: %s is outside %s-%s", where, d, minGrace, most)
	}
	return d, nil
}
