package kv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
)

// allocated is the disk dir's files take (their blocks, not their sizes: the log's and badger's
// files are preallocated or sparse).
func allocated(t *testing.T, dir string) int64 {
	t.Helper()
	var total int64
	err := filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		total += info.Sys().(*syscall.Stat_t).Blocks * 512
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}

// TestSettleLeavesNothingOfDeletedKeys writes 36 MiB of 60 KB values, as 600 cockpit configs
// made and removed would, deletes them all, and settles the store as it does once idle: the
// data directory is then at most twice a fresh one's, every log segment the checkpoint no
// longer needs removed and the tables compacted without the deleted keys, and the caches of a
// store being written are empty. Without the settle the directory held the tables and segments
// of every value.
func TestSettleLeavesNothingOfDeletedKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.log.background.Wait() // the spare segment
	fresh := allocated(t, dir)
	value := []byte(strings.Repeat("x", 60000))
	for i := range 600 {
		key := fmt.Sprintf("cockpit/churn%d/config", i)
		if err := db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(key, value) }); err != nil {
			t.Fatal(err)
		}
		if err := db.Update(context.Background(), func(tx storage.Txn) error { return tx.Delete(key) }); err != nil {
			t.Fatal(err)
		}
	}
	applied(t, db)
	for !db.log.settle() { // a checkpoint the last commits began, or badger's flush, is under way
		db.log.background.Wait()
		time.Sleep(10 * time.Millisecond)
	}
	if len(db.log.pending.latest) != 0 || len(db.log.recent) != 0 {
		t.Fatalf("settled, the store still caches %d latest versions and %d recent writes", len(db.log.pending.latest), len(db.log.recent))
	}
	got := allocated(t, dir)
	if got > 2*fresh {
		entries, _ := os.ReadDir(dir) // what is left, for whoever reads the failure
		for _, e := range entries {
			info, _ := e.Info()
			t.Logf("%s %d %d", e.Name(), info.Size(), info.Sys().(*syscall.Stat_t).Blocks*512)
		}
		t.Fatalf("after 600 values of 60 KB written, deleted and settled, the data directory takes %d KiB; a fresh one %d KiB (bound: twice that)", got>>10, fresh>>10)
	}
	err = db.View(func(tx storage.Txn) error {
		return tx.Scan("cockpit/", func(key string, _ []byte) error { return fmt.Errorf("%s survived its delete", key) })
	})
	if err != nil {
		t.Fatal(err)
	}
}
