package engine

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A budget is context.WithTimeout's context whether or not its timer was armed: its deadline, its
// end at the deadline, its parent's cancellation and values, and contexts derived from it.
func TestBudgetContextIsWithTimeouts(t *testing.T) {
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")

	began := time.Now()
	b, release := withBudget(parent, time.Hour)
	if d, ok := b.Deadline(); !ok || d.Before(began.Add(time.Hour)) || d.After(time.Now().Add(time.Hour)) {
		t.Errorf("Deadline() = %v, %v; want an hour from now", d, ok)
	}
	if err := b.Err(); err != nil || b.current() != nil {
		t.Errorf("Err() = %v (armed: %v) before the deadline", err, b.current() != nil)
	}
	if b.Value(key{}) != "v" {
		t.Error("the parent's value is lost")
	}
	derived, cancelDerived := context.WithCancel(b)
	defer cancelDerived()
	release()
	if err := waitDone(derived); !errors.Is(err, context.Canceled) {
		t.Errorf("a context derived from a released budget ends with %v, want Canceled", err)
	}

	b, release = withBudget(parent, time.Millisecond)
	defer release()
	if err := waitDone(b); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(b.Err(), context.DeadlineExceeded) {
		t.Errorf("a budget past its deadline ends with %v (Err %v), want DeadlineExceeded", err, b.Err())
	}

	b, release = withBudget(parent, 0) // past its deadline, never waited on
	defer release()
	if err := b.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Err() past the deadline = %v, want DeadlineExceeded", err)
	}

	cancelled, cancel := context.WithCancel(parent)
	b, release = withBudget(cancelled, time.Hour)
	defer release()
	cancel()
	if err := b.Err(); !errors.Is(err, context.Canceled) {
		t.Errorf("Err() of a budget whose parent was cancelled = %v, want Canceled", err)
	}
	if err := waitDone(b); !errors.Is(err, context.Canceled) {
		t.Errorf("Done of a budget whose parent was cancelled ends with %v", err)
	}

	soon, cancelSoon := context.WithTimeout(parent, time.Minute)
	defer cancelSoon()
	b, release = withBudget(soon, time.Hour)
	defer release()
	if d, _ := b.Deadline(); d.After(time.Now().Add(time.Minute)) {
		t.Errorf("Deadline() = %v, later than the parent's", d)
	}
}

// waitDone is ctx's error once it is done (a test failure past a bound no healthy run reaches).
func waitDone(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(30 * time.Second):
		return errors.New("not done after 30 s")
	}
}
