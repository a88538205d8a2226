package engine

import (
	"context"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage"
)

// countedViews is a store that counts its Views.
type countedViews struct {
	storage.Store
	views int
}

func (s *countedViews) View(fn func(storage.Txn) error) error {
	s.views++
	return s.Store.View(fn)
}

// TestLeaseHoldersReadNothingOverBadger: over this daemon's own store every lease changes by
// its own commits, which set what leases hold as they are ordered. A commit that wrote no record
// (a stack made or removed, a claim that changed nothing, a refusal) marked its
// stack stale all the same, and the next claim read it with a View, which over badger waits for
// every commit under way to sync before the claim takes its lock.
func TestLeaseHoldersReadNothingOverBadger(t *testing.T) {
	db := &countedViews{Store: newEngine(t).db}
	e := New(db)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "a")
	if err := e.Claim(ctx, me("create", "h"), "app", "a", "h", untracked("h")); err != nil {
		t.Fatal(err)
	}
	if err := e.CreateStack(ctx, me("mkdir", "app/stacks/b"), "app", "b"); err != nil {
		t.Fatal(err)
	}
	if err := e.Claim(ctx, me("create", "h"), "app", "a", "h", untracked("h")); err != nil { // unchanged
		t.Fatal(err)
	}
	if err := e.RemoveStack(ctx, me("rmdir", "app/stacks/b"), "app", "b"); err != nil {
		t.Fatal(err)
	}
	if err := e.CreateStack(ctx, me("mkdir", "app/stacks/c"), "app", "c"); err != nil {
		t.Fatal(err)
	}
	before := db.views
	if err := e.refreshLeaseHolders(); err != nil {
		t.Fatal(err)
	}
	if db.views != before {
		t.Errorf("a claim after commits that changed no lease read the store %d times for what leases hold", db.views-before)
	}
}
