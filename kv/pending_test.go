package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage"
)

// fillLatest commits values to other keys until latest has forgotten everything it held once.
func fillLatest(t *testing.T, db *DB) {
	t.Helper()
	before := db.log.pending.gen()
	value := make([]byte, latestValueMax)
	for i := 0; db.log.pending.gen() == before; i++ {
		if i > 2*latestBudget/latestValueMax {
			t.Fatalf("latest did not start again after %d values of %d bytes", i, len(value))
		}
		err := db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(fmt.Sprintf("fill/%d", i), value) })
		if err != nil {
			t.Fatal(err)
		}
		applied(t, db)
	}
}

// applied returns once badger has applied every commit acknowledged so far, as a View waits for.
func applied(t *testing.T, db *DB) {
	t.Helper()
	if err := db.View(func(storage.Txn) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// A transaction that began before latest forgot a key's newest version reads an older one from
// badger, and must not leave it behind as the key's latest: the next read would get it instead of
// the newest.
func TestLatestKeepsNoVersionOlderThanOneItForgot(t *testing.T) {
	t.Parallel()
	db, _ := openTemp(t)
	set(t, db, "k", "1")
	var old string
	err := db.View(func(tx storage.Txn) error {
		set(t, db, "k", "2") // after this View's read version
		fillLatest(t, db)
		v, err := tx.Get("k")
		old = string(v)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := get(t, db, "k"); old != "1" || v != "2" {
		t.Errorf("the View begun before k=2 read %q, a View after it %q; want 1 and 2", old, v)
	}
}

// A version too large to keep still replaces the key's smaller one as what a read finds.
func TestLatestLetsALargeVersionReplaceItsKey(t *testing.T) {
	t.Parallel()
	db, _ := openTemp(t)
	set(t, db, "k", "small")
	if v, _ := get(t, db, "k"); v != "small" {
		t.Fatalf("k = %q, want small", v)
	}
	large := bytes.Repeat([]byte("L"), latestValueMax+1)
	set(t, db, "k", string(large))
	if v, _ := get(t, db, "k"); v != string(large) {
		t.Errorf("k = %d bytes, want the %d written after the small value", len(v), len(large))
	}
}

// A key read from badger, written before this Open, is read from latest next time, and latest
// holds each key's newest version: what was read, deleted, written again.
func TestLatestRemembersReadsAndCommits(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	db, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	set(t, db, "k", "before")
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if db, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	latest := func() string {
		db.log.pending.mu.Lock()
		defer db.log.pending.mu.Unlock()
		v, ok := db.log.pending.latest["k"]
		if !ok {
			return "none"
		}
		return fmt.Sprintf("%s deleted=%v", v.value, v.del)
	}
	steps := []struct {
		name string
		do   func() error
		want string
	}{
		{"read", func() error { _, ok := get(t, db, "k"); return check(ok, true) }, "before deleted=false"},
		{"delete", func() error {
			return db.Update(context.Background(), func(tx storage.Txn) error { return tx.Delete("k") })
		}, " deleted=true"},
		{"read deleted", func() error { _, ok := get(t, db, "k"); return check(ok, false) }, " deleted=true"},
		{"set", func() error { set(t, db, "k", "after"); return nil }, "after deleted=false"},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		applied(t, db)
		if got := latest(); got != s.want {
			t.Errorf("after %s, latest of k = %q, want %q", s.name, got, s.want)
		}
	}
}

func check(found, want bool) error {
	if found != want {
		return fmt.Errorf("found %v, want %v", found, want)
	}
	return nil
}

// A closed store answers no read, not even one latest could answer without badger.
func TestClosedStoreAnswersNothing(t *testing.T) {
	t.Parallel()
	db, err := Open(filepath.Join(t.TempDir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	set(t, db, "k", "1")
	if v, _ := get(t, db, "k"); v != "1" {
		t.Fatalf("k = %q, want 1", v)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	err = db.View(func(tx storage.Txn) error { _, err := tx.Get("k"); return err })
	if !errors.Is(err, errClosed) {
		t.Errorf("a read of k after Close: %v, want %v", err, errClosed)
	}
}

// The last write of a key in a commit is what a read finds, as in badger.
func TestLatestTakesACommitsLastWriteOfAKey(t *testing.T) {
	t.Parallel()
	db, _ := openTemp(t)
	err := db.Update(context.Background(), func(tx storage.Txn) error {
		if err := tx.Set("k", []byte("1")); err != nil {
			return err
		}
		if err := tx.Set("gone", []byte("1")); err != nil {
			return err
		}
		if err := tx.Delete("gone"); err != nil {
			return err
		}
		return tx.Set("k", []byte("2"))
	})
	if err != nil {
		t.Fatal(err)
	}
	applied(t, db)
	k, _ := get(t, db, "k")
	if _, found := get(t, db, "gone"); k != "2" || found {
		t.Errorf("k = %q, gone found: %v; want 2 and not found", k, found)
	}
}

// Deleted keys count against latest's budget too: an events file deletes a line at every commit.
func TestLatestStaysBoundedWithDeletedKeys(t *testing.T) {
	t.Parallel()
	db, _ := openTemp(t)
	for c := range 20 {
		err := db.Update(context.Background(), func(tx storage.Txn) error {
			for i := range 1000 {
				key := fmt.Sprintf("line/%d/%d", c, i)
				if err := tx.Set(key, []byte("x")); err != nil {
					return err
				}
				if err := tx.Delete(key); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	applied(t, db)
	db.log.pending.mu.Lock()
	defer db.log.pending.mu.Unlock()
	if n := len(db.log.pending.latest); n > latestBudget/latestEntryCost {
		t.Errorf("latest holds %d keys after 20,000 deleted, more than its budget's %d entries", n, latestBudget/latestEntryCost)
	}
}

// Close while commits and reads are under way (a daemon stopping with a mount it may not detach
// still serving): each one finishes before the store closes, or is refused with errClosed; none
// reaches the stopped applier or a closed badger.
func TestCloseWhileOperationsAreUnderWay(t *testing.T) {
	t.Parallel()
	db, err := Open(filepath.Join(t.TempDir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	set(t, db, "k0", "v")
	var wg sync.WaitGroup
	running := make(chan struct{}, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				err := db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(fmt.Sprintf("k%d", g), []byte{byte(i)}) })
				if err == nil {
					err = db.View(func(tx storage.Txn) error { _, err := tx.Get("k0"); return err })
				}
				if i == 10 {
					running <- struct{}{}
				}
				if errors.Is(err, errClosed) {
					return
				}
				if err != nil {
					t.Errorf("an operation while the store closed: %v, want nil or %v", err, errClosed)
					return
				}
			}
		}()
	}
	for range 4 {
		<-running
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}
