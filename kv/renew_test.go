package kv

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/storage"
)

// memtableLogs are the names of badger's memtable logs in dir, one per memtable it holds.
func memtableLogs(t *testing.T, dir string) []string {
	t.Helper()
	logs, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil {
		t.Fatal(err)
	}
	return logs
}

// markHeld reports whether badger holds memtableMark at any version.
func markHeld(t *testing.T, db *DB) bool {
	t.Helper()
	btx := db.bdb.NewTransactionAt(math.MaxUint64, false)
	defer btx.Discard()
	_, err := btx.Get(memtableMark)
	return err == nil
}

// TestSettleRenewsTheMemtable: once settled, badger serves from a new memtable (a new log)
// with what the old one held flushed into its tables, every key reads as written, and the key
// that made badger start it is gone.
func TestSettleRenewsTheMemtable(t *testing.T) {
	t.Parallel()
	db, dir := openTemp(t)
	db.log.background.Wait() // the spare segment
	for i := range 100 {
		set(t, db, fmt.Sprintf("k%03d", i), fmt.Sprintf("v%03d", i))
	}
	applied(t, db)
	before := memtableLogs(t, dir)
	for !db.log.settle() { // a checkpoint the commits began is under way
		db.log.background.Wait()
	}
	after := memtableLogs(t, dir)
	if len(after) != 1 || slices.Contains(before, after[0]) {
		t.Fatalf("settled, badger's memtable logs are %v; before %v (want one new one)", after, before)
	}
	info, err := os.Stat(after[0])
	if err != nil {
		t.Fatal(err)
	}
	if blocks := info.Sys().(*syscall.Stat_t).Blocks * 512; blocks < info.Size() {
		t.Errorf("the new memtable's log has %d of its %d bytes allocated: a full disk could meet a write through its map", blocks, info.Size())
	}
	if markHeld(t, db) {
		t.Fatal("the key that renewed the memtable is still in badger")
	}
	set(t, db, "k100", "v100")
	err = db.View(func(tx storage.Txn) error {
		got := scan(t, tx, "")
		if len(got) != 101 || got[0] != "k000=v000" || got[100] != "k100=v100" {
			t.Errorf("after the renewal the store holds %d keys: %v", len(got), got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRenewalWhileCommitting renews the memtable again and again while commits keep coming:
// badger refuses writes while it renews, and a commit it refused would stop the store, so every
// commit sequenced is handed to it first and none meanwhile.
func TestRenewalWhileCommitting(t *testing.T) {
	t.Parallel()
	db, _ := openTemp(t)
	db.log.background.Wait()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	var written int
	var werr error
	go func() {
		defer wg.Done()
		for ; ; written++ {
			select {
			case <-done:
				return
			default:
			}
			key := fmt.Sprintf("k%05d", written)
			if werr = db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(key, []byte(key)) }); werr != nil {
				return
			}
		}
	}()
	for range 20 {
		if err := db.log.renewMemtable(); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	if werr != nil {
		t.Fatalf("a commit failed while the memtable was renewed: %v", werr)
	}
	if err := db.log.err(); err != nil {
		t.Fatal(err)
	}
	err := db.View(func(tx storage.Txn) error {
		if got := scan(t, tx, ""); len(got) != written {
			t.Errorf("%d commits, %d keys read", written, len(got))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMarkLeftByACrashIsUndone: a crash between the write of the key that renews the memtable
// and its drop leaves it in a memtable log, at a version the log never sequenced; Open undoes it
// with every other version past the log's end, and no read ever sees it.
func TestMarkLeftByACrashIsUndone(t *testing.T) {
	t.Parallel()
	image := crashImageAfter(t, 20, func(db *DB) {
		db.log.mu.Lock()
		defer db.log.mu.Unlock()
		mark := db.bdb.NewTransactionAt(db.log.next, true)
		defer mark.Discard()
		if err := mark.Set(memtableMark, nil); err != nil {
			t.Fatal(err)
		}
		if err := mark.CommitAt(db.log.next, nil); err != nil {
			t.Fatal(err)
		}
	})
	db, err := Open(image)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if markHeld(t, db) {
		t.Fatal("Open kept the key a renewal left")
	}
	set(t, db, "k020", "after")
	err = db.View(func(tx storage.Txn) error {
		if got := scan(t, tx, ""); len(got) != 21 || got[20] != "k020=after" {
			t.Errorf("reopened, the store holds %v", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRenewalWaitsForSpace: on a disk with less room than a commit needs, settling leaves the
// memtable as it is (its flush would write a table, the new one a log) and the store serves on;
// once room returns, the next settle renews it.
func TestRenewalWaitsForSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	disk := t.TempDir()
	if err := unix.Mount("tmpfs", disk, "tmpfs", 0, "size=48m"); err != nil {
		t.Fatalf("mount a tmpfs: %v", err)
	}
	defer unix.Unmount(disk, unix.MNT_DETACH)
	dir := filepath.Join(disk, "data")
	db, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.log.background.Wait() // the spare segment
	for i := range 50 {
		set(t, db, fmt.Sprintf("k%03d", i), "v")
	}
	applied(t, db)
	var st unix.Statfs_t
	if err := unix.Statfs(disk, &st); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(disk, "filler")
	if err := os.WriteFile(filler, make([]byte, int64(st.Bavail)*st.Bsize-12<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	before := memtableLogs(t, dir)
	for !db.log.settle() {
		db.log.background.Wait()
	}
	if after := memtableLogs(t, dir); !slices.Equal(after, before) {
		t.Fatalf("with 12 MiB free the settle renewed the memtable: logs %v, before %v", after, before)
	}
	if err := db.log.err(); err != nil {
		t.Fatal(err)
	}
	if v, ok := get(t, db, "k049"); !ok || v != "v" {
		t.Fatalf("k049 reads %q, %v", v, ok)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	set(t, db, "k050", "v") // a commit to settle again after
	applied(t, db)
	for !db.log.settle() {
		db.log.background.Wait()
	}
	if after := memtableLogs(t, dir); len(after) != 1 || slices.Contains(before, after[0]) {
		t.Fatalf("with room again the settle left the memtable logs %v (before %v)", after, before)
	}
}
