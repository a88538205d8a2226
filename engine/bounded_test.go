package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// Create, configure with a large document, and remove cockpits and stacks: nothing of them stays
// in memory — neither the decoded cockpit, nor a lock per key, nor a record's cache entry or
// generation, nor a stale mark for a health read nobody makes, nor a status row.
func TestRemovedCockpitsLeaveNothingInMemory(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	config := exampleConfig + strings.Repeat("# padding of a large config\n", 2000)
	// A status read keeps every cockpit's rows from here on.
	if _, _, err := e.StatusFile(StatusTable); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		name := fmt.Sprintf("app%d", i)
		newCockpit(t, e, name, config, "one")
		if err := e.RemoveStack(ctx, me("rmdir", name+"/stacks/one"), name, "one"); err != nil {
			t.Fatal(err)
		}
		if err := e.RemoveCockpit(ctx, me("rmdir", name), name); err != nil {
			t.Fatal(err)
		}
	}
	e.cockpits.mu.Lock()
	cached := len(e.cockpits.m)
	e.cockpits.mu.Unlock()
	e.locks.mu.Lock()
	locks := len(e.locks.m)
	e.locks.mu.Unlock()
	if cached != 0 || locks != 0 {
		t.Fatalf("after removing every cockpit: %d cockpits cached, %d key locks kept", cached, locks)
	}
	e.records.mu.Lock()
	records := len(e.records.gen) + len(e.records.m) + len(e.records.latest)
	e.records.mu.Unlock()
	stale := e.inventory.stale.count()
	if records != 0 || stale != 0 {
		t.Fatalf("after removing every stack: %d record cache entries, %d stale marks kept", records, stale)
	}
	if _, _, err := e.StatusFile(StatusTable); err != nil {
		t.Fatal(err)
	}
	if kept, stale := len(e.status.cockpits), e.status.stale.count(); kept != 0 || stale != 0 {
		t.Fatalf("after removing every cockpit and reading status: %d cockpits' rows, %d stale marks kept", kept, stale)
	}
}

// What health keeps of the store for each stack read goes at the next commit, so the stacks it
// was read for, once removed, leave nothing there either.
func TestHealthKeepsNoReadsOfRemovedStacks(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "one", "two")
	for _, s := range []string{"one", "two"} {
		if _, err := e.Health("app", s); err != nil {
			t.Fatal(err)
		}
	}
	kept := func() int {
		e.healthCache.mu.Lock()
		defer e.healthCache.mu.Unlock()
		return len(e.healthCache.m)
	}
	if kept := kept(); kept != 2 {
		t.Fatalf("after two health reads with no commit between: %d stacks' reads kept, want 2", kept)
	}
	if err := e.RemoveStack(ctx, me("rmdir", "app/stacks/one"), "app", "one"); err != nil {
		t.Fatal(err)
	}
	if kept := kept(); kept != 0 {
		t.Fatalf("after a commit: %d stacks' reads kept, want 0", kept)
	}
}

// count is how many keys are marked.
func (s *staleKeys) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.stale)
}
