package kv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dgraph-io/badger/v4/table"

	"github.com/cockpitfs/cockpitfs/storage"
)

// TestServedChecksRaceCompactions drives compactions hard (large values written and deleted)
// while negative Gets and Scans re-read the tables through kv's own handles (served.go). A
// compaction drops tables by truncating their files: a check reading one through a map must
// not fault (SIGBUS kills the process) or call the store damaged.
func TestServedChecksRaceCompactions(t *testing.T) {
	db, _ := openTemp(t)
	big := strings.Repeat("x", 60<<10)
	rounds := 1500
	if testing.Short() {
		rounds = 300
	}
	var done atomic.Bool
	var checks, written atomic.Int64 // written: keys written and deleted
	var wg sync.WaitGroup
	// reader runs read in a View, over and over; read is made before the View begins, so that
	// it names only keys deleted before the View's snapshot.
	reader := func(read func() func(storage.Txn) error) {
		defer wg.Done()
		for !done.Load() {
			if err := db.View(read()); err != nil {
				t.Errorf("read during compactions: %v", err)
				return
			}
			checks.Add(1)
		}
	}
	// Gets of keys inside the tables' ranges, so that every table is read: a deleted one, and
	// one beside it never written.
	missing := func() func(storage.Txn) error {
		n := written.Load()
		return func(tx storage.Txn) error {
			if n == 0 {
				return nil
			}
			i := checks.Load() % n
			for _, key := range []string{fmt.Sprintf("churn/%05d", i), fmt.Sprintf("churn/%05d-", i)} {
				if _, err := tx.Get(key); !errors.Is(err, storage.ErrNotFound) {
					return fmt.Errorf("get of %s, deleted or never written: %v", key, err)
				}
			}
			return nil
		}
	}
	scanAll := func() func(storage.Txn) error {
		return func(tx storage.Txn) error {
			return tx.Scan("churn/", func(string, []byte) error { return nil })
		}
	}
	for range 4 {
		wg.Add(2)
		go reader(missing)
		go reader(scanAll)
	}
	for i := 0; i < rounds && !t.Failed(); i++ {
		key := fmt.Sprintf("churn/%05d", i)
		set(t, db, key, big)
		if err := db.Update(context.Background(), func(tx storage.Txn) error { return tx.Delete(key) }); err != nil {
			t.Fatalf("delete %s: %v", key, err)
		}
		written.Store(int64(i + 1))
	}
	done.Store(true)
	wg.Wait()
	if db.damaged.Load() != nil {
		t.Fatalf("the store failed closed: %v", *db.damaged.Load())
	}
	t.Logf("%d checks raced %d rounds of writes", checks.Load(), rounds)
}

// TestServedCheckOutlivesCompaction drops every table in the middle of a check, after it pinned
// them and before it reads them: what it reads is still there (before the pin, this was SIGBUS),
// and once the check ends the dropped tables' files go.
func TestServedCheckOutlivesCompaction(t *testing.T) {
	db, dir := openTemp(t)
	big := strings.Repeat("y", 60<<10)
	// Badger flushes full memtables to tables on a goroutine of its own, which under -race on a
	// busy machine may not have run after the 200th write: keep writing until a table is there.
	for i := 0; i < 200 || len(db.bdb.Tables()) == 0 && i < 20000; i++ {
		set(t, db, fmt.Sprintf("churn/%05d", i), big)
	}
	var files []string
	for _, info := range db.bdb.Tables() {
		files = append(files, table.NewFilename(info.ID, dir))
	}
	if len(files) == 0 {
		t.Fatal("no tables to drop")
	}
	dropped := false
	testHookChecking = func() {
		if dropped {
			return
		}
		dropped = true
		if err := db.bdb.DropPrefix([]byte("churn/")); err != nil {
			t.Errorf("drop: %v", err)
		}
		if n := len(db.bdb.Tables()); n != 0 {
			t.Errorf("%d tables left after the drop", n)
		}
	}
	t.Cleanup(func() { testHookChecking = nil })
	if _, ok := get(t, db, "churn/00007-"); ok {
		t.Fatal("a key never written was found")
	}
	if !dropped {
		t.Fatal("the check never ran")
	}
	if db.damaged.Load() != nil {
		t.Fatalf("the store failed closed: %v", *db.damaged.Load())
	}
	for _, f := range files {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s of a dropped table outlived the check: %v", f, err)
		}
	}
}
