package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
)

// deadlines is a store that records the deadline of every commit's context.
type deadlines struct {
	storage.Store
	seen []time.Time // zero: none
}

func (d *deadlines) Update(ctx context.Context, fn func(storage.Txn) error) error {
	at, _ := ctx.Deadline()
	d.seen = append(d.seen, at)
	return d.Store.Update(ctx, fn)
}

func (d *deadlines) Commit(ctx context.Context, fn func(storage.Txn) error) (func() error, error) {
	at, _ := ctx.Deadline()
	d.seen = append(d.seen, at)
	return d.Store.Commit(ctx, fn)
}

func TestOneBudgetForTheLockAndTheStore(t *testing.T) {
	t.Parallel()
	base := newEngine(t)
	store := &deadlines{Store: base.db}
	e := New(store)
	before := time.Now()
	if err := e.CreateCockpit(context.Background(), me("mkdir", "app"), "app"); err != nil {
		t.Fatal(err)
	}
	if len(store.seen) != 1 {
		t.Fatalf("%d updates, want 1", len(store.seen))
	}
	// The store's conflict retries end where the wait for the lock would have: not a budget of
	// their own after it.
	if at := store.seen[0]; at.IsZero() || at.After(time.Now().Add(storage.Budget)) || at.Before(before.Add(storage.Budget)) {
		t.Fatalf("the store's deadline is %v, want the operation's own, within %v of its start %v", at, storage.Budget, before)
	}
}

func TestStateLockedWhileTheStackIsLocked(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	e.budget = 50 * time.Millisecond
	newCockpit(t, e, "app", exampleConfig, "s")
	unlock, err := e.locks.lock(context.Background(), stackKey("app", "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	refusedUnchanged(t, e, "app", "s", StateLocked, func() error { return claimErr(e, "app", "s", "alice") })

	// The refusal is recorded while the contention lasts: logging it does not queue behind it.
	c := me("create", "app/stacks/s/holders/alice")
	seen := e.CockpitSeen("app")
	if err := e.LogRefusal(c, "app", "s", refuse(StateLocked, "", "retry", "contention"), "EAGAIN", 0); err != nil {
		t.Fatalf("logging the refusal: %v", err)
	}
	events, err := e.events("app", "s")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(events), `"code":"STATE_LOCKED","errno":"EAGAIN"`) {
		t.Fatalf("no STATE_LOCKED line in the events:\n%s", events)
	}
	// The line wakes the cockpit's waiters, naming the events file it went to.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if change, err := e.WaitCockpit(ctx, "app", seen); err != nil || change.Events != "stacks/s/events" {
		t.Fatalf("the cockpit's waiters heard %+v, %v; want the stack's events", change, err)
	}
}

func TestInterruptedWaitIsNotStateLocked(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "s")
	unlock, err := e.locks.lock(context.Background(), stackKey("app", "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.Release(ctx, me("unlink", "app/stacks/s/holders/alice"), "app", "s", "alice"); err != context.Canceled {
		t.Fatalf("got %v, want the caller's cancellation", err)
	}
}
