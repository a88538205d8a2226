package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
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

// viewHookedStore runs inView once, inside the next View, after its snapshot is taken.
type viewHookedStore struct {
	*kv.DB
	inView func()
}

func (s *viewHookedStore) View(fn func(storage.Txn) error) error {
	hook := s.inView
	s.inView = nil
	return s.DB.View(func(tx storage.Txn) error {
		if hook != nil {
			hook()
		}
		return fn(tx)
	})
}

// A read whose snapshot is older than a cockpit's removal (a listing of the root, a lookup) put
// the cockpit back into the cache after the removal dropped it, for good: a listing beside
// 3,000 churned cockpits of 60 KB configs kept 180 of them (21 MiB).
func TestRemovedCockpitIsNotKeptByAnOlderRead(t *testing.T) {
	t.Parallel()
	for _, read := range []struct {
		name string
		read func(e *Engine) (listed int, err error)
	}{
		{"listing", func(e *Engine) (int, error) { l, err := e.Cockpits(); return len(l), err }},
		{"lookup", func(e *Engine) (int, error) { _, err := e.Cockpit("gone"); return 1, err }},
	} {
		t.Run(read.name, func(t *testing.T) {
			db, err := kv.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			s := &viewHookedStore{DB: db}
			e := New(s)
			newCockpit(t, e, "gone", exampleConfig+strings.Repeat("# padding of a large config\n", 2000))
			s.inView = func() {
				if err := e.RemoveCockpit(context.Background(), me("rmdir", "gone"), "gone"); err != nil {
					t.Error(err)
				}
			}
			// The read's snapshot is older than the removal: it still shows the cockpit.
			if listed, err := read.read(e); err != nil || listed != 1 {
				t.Fatalf("the read: %d listed, %v", listed, err)
			}
			if s.inView != nil {
				t.Fatal("the read ran no View")
			}
			// Nothing reads the removed cockpit again (a lookup finding it missing would drop it).
			e.cockpits.mu.Lock()
			cached := len(e.cockpits.m)
			e.cockpits.mu.Unlock()
			if cached != 0 {
				t.Fatalf("%d cockpits cached after the only one was removed", cached)
			}
		})
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
