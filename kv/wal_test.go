package kv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage"
)

// conflictCase commits, from inside fn's first run, a write another transaction makes between
// fn's reads and its commit.
func conflictCase(t *testing.T, read func(tx storage.Txn) error, concurrent func(tx storage.Txn) error) (runs int, conflicts uint64) {
	t.Helper()
	db, _ := openTemp(t)
	set(t, db, "p/a", "1")
	before := db.Conflicts()
	err := db.Update(context.Background(), func(tx storage.Txn) error {
		runs++
		if err := read(tx); err != nil {
			return err
		}
		if runs == 1 {
			if err := db.Update(context.Background(), concurrent); err != nil {
				return err
			}
		}
		return tx.Set("out", []byte(fmt.Sprint(runs)))
	})
	if err != nil {
		t.Fatal(err)
	}
	return runs, db.Conflicts() - before
}

func getKey(key string) func(tx storage.Txn) error {
	return func(tx storage.Txn) error {
		_, err := tx.Get(key)
		if errors.Is(err, storage.ErrNotFound) {
			return nil
		}
		return err
	}
}

func setKey(key string) func(tx storage.Txn) error {
	return func(tx storage.Txn) error { return tx.Set(key, []byte("2")) }
}

func scanPrefix(tx storage.Txn) error {
	return tx.Scan("p/", func(string, []byte) error { return nil })
}

// kv finds conflicts itself (badger's detection is off): a key read with Get, found or not, or
// returned by a Scan, written by a commit sequenced after the transaction's snapshot makes it run
// again; writes to keys it did not read do not.
func TestConflicts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		read       func(tx storage.Txn) error
		concurrent func(tx storage.Txn) error
		conflict   bool
	}{
		{"key read, found", getKey("p/a"), setKey("p/a"), true},
		{"key read, missing", getKey("p/missing"), setKey("p/missing"), true},
		{"key scanned", scanPrefix, setKey("p/a"), true},
		{"key scanned, deleted", scanPrefix, func(tx storage.Txn) error { return tx.Delete("p/a") }, true},
		{"another key", getKey("p/a"), setKey("q"), false},
		// No phantom protection (storage's contract): a key inserted under a scanned prefix.
		{"key inserted under a scanned prefix", scanPrefix, setKey("p/b"), false},
		{"blind write", func(storage.Txn) error { return nil }, setKey("out"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runs, conflicts := conflictCase(t, c.read, c.concurrent)
			want := 1
			if c.conflict {
				want = 2
			}
			if runs != want || conflicts != uint64(want-1) {
				t.Errorf("fn ran %d times, %d conflicts; want %d runs", runs, conflicts, want)
			}
		})
	}
}

// A writer's next transaction reads the commit just sequenced before it, durable or not, and so
// does not conflict with it: writers queued on one key share syncs without retrying.
func TestUpdateSeesTheCommitBeforeIt(t *testing.T) {
	t.Parallel()
	db, _ := openTemp(t)
	durable, err := db.Commit(context.Background(), setKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	var seen string
	second, err := db.Commit(context.Background(), func(tx storage.Txn) error {
		v, err := tx.Get("k")
		seen = string(v)
		if err != nil {
			return err
		}
		return tx.Set("k", []byte("3"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := durable(); err != nil {
		t.Fatal(err)
	}
	if err := second(); err != nil {
		t.Fatal(err)
	}
	if seen != "2" || db.Conflicts() != 0 {
		t.Errorf("the second commit read %q with %d conflicts; want 2 and none", seen, db.Conflicts())
	}
	if v, _ := get(t, db, "k"); v != "3" {
		t.Errorf("k = %q, want 3", v)
	}
}

// A View begun after a commit was sequenced sees it, once it is durable, even while its committer
// has yet to wait for the sync: the View leads the round itself.
func TestViewSeesEveryCommitSequencedBeforeIt(t *testing.T) {
	t.Parallel()
	db, _ := openTemp(t)
	durable, err := db.Commit(context.Background(), setKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	before := db.Syncs()
	if v, _ := get(t, db, "k"); v != "2" {
		t.Errorf("a View after the commit read k = %q, want 2", v)
	}
	if db.Syncs() == before {
		t.Error("the View read the commit without a sync making it durable")
	}
	if err := durable(); err != nil {
		t.Fatal(err)
	}
}

// Records of every size are found again where placeRecord put them: ones that leave the rest of
// a page too short for a record's length (1–3 bytes), or just long enough, ones that fill a page
// exactly, ones larger than a page.
func TestRecordsScanWhereTheyWerePlaced(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := make([]byte, segmentSize)
	var want []uint64
	off := 0
	// Value lengths: a record is 31 bytes more (30 under 128), so 4063 leaves a 2-byte gap at the
	// page's end, 4062 3 bytes, 4065 fills a page, 5000 and 9000 are larger than one.
	for i, size := range []int{4063, 4030, 4062, 100, 5000, 4065, 3, 9000, 4040, 4064, 1} {
		ts := uint64(i + 1)
		rec := appendRecord(nil, &record{ts: ts, kind: kindCommit, writes: []write{{key: "k", value: make([]byte, size)}}})
		at := placeRecord(off, len(rec))
		if at%pageSize != 0 && at/pageSize != (at+len(rec)-1)/pageSize {
			t.Fatalf("record %d (%d bytes) placed at %d straddles a page boundary", ts, len(rec), at)
		}
		copy(data[at:], rec)
		off = at + len(rec)
		want = append(want, ts)
	}
	if err := os.WriteFile(filepath.Join(dir, segmentName(1)), data, 0o600); err != nil {
		t.Fatal(err)
	}
	scan, err := scanLog(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, r := range scan.records {
		got = append(got, r.ts)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || scan.badSegment != 0 {
		t.Errorf("scanned %v (bad record in segment %d at %d), want %v", got, scan.badSegment, scan.badOffset, want)
	}
}

// An Update reads the writes of commits badger has yet to apply from pending, merged into its
// Gets and Scans over badger's versions: sets of keys badger has, of keys it has not, deletes;
// its own writes win over both.
func TestUpdateReadsCommitsNotYetApplied(t *testing.T) {
	t.Parallel()
	db, _ := openTemp(t)
	for _, k := range []string{"p/a", "p/c", "p/e"} {
		set(t, db, k, "old")
	}
	// What a commit sequenced after those leaves in pending while badger applies it.
	ts := db.log.sequenced.Load()
	writes := []write{{key: "p/a", value: []byte("new")}, {key: "p/b", value: []byte("new")},
		{key: "p/c", delete: true}, {key: "p/d", value: []byte("new")}}
	db.log.pending.add(ts, writes)
	defer db.log.pending.applied(ts, writes)
	var scanned []string
	var got string
	err := db.Update(context.Background(), func(tx storage.Txn) error {
		if err := tx.Set("p/d", []byte("own")); err != nil {
			return err
		}
		scanned = scan(t, tx, "p/")
		v, err := tx.Get("p/b")
		got = string(v)
		if err != nil {
			return err
		}
		if _, err := tx.Get("p/c"); !errors.Is(err, storage.ErrNotFound) {
			return fmt.Errorf("p/c, deleted by the commit not yet applied: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "[p/a=new p/b=new p/d=own p/e=old]"; fmt.Sprint(scanned) != want || got != "new" {
		t.Errorf("scan %v, get p/b %q; want %s and new", scanned, got, want)
	}
}

// killEnv names the directory TestHelperCommitUntilKilled writes to in a child process.
const killEnv = "COCKPITFS_KV_KILL_DIR"

// TestHelperCommitUntilKilled is not a test: started by TestAcknowledgedCommitsSurviveSIGKILL,
// it commits from four goroutines, each key its own, and prints "acked KEY" once each Update
// returns, until it is killed.
func TestHelperCommitUntilKilled(t *testing.T) {
	db := helperStore(t, killEnv)
	var out sync.Mutex
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				key := fmt.Sprintf("w%d/%06d", w, i)
				value := strings.Repeat(key, 40)
				if err := db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(key, []byte(value)) }); err != nil {
					fmt.Println(err)
					os.Exit(1)
				}
				out.Lock()
				fmt.Println("acked", key)
				out.Unlock()
			}
		})
	}
	wg.Wait()
}

// commitUntilKilled runs TestHelperCommitUntilKilled on dir until it has acknowledged at least n
// commits, SIGKILLs it and returns the keys it acknowledged.
func commitUntilKilled(t *testing.T, dir string, n int) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCommitUntilKilled$")
	cmd.Env = append(os.Environ(), killEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acked []string
	lines := bufio.NewScanner(stdout)
	for len(acked) < n && lines.Scan() {
		key, ok := strings.CutPrefix(lines.Text(), "acked ")
		if !ok {
			t.Fatalf("child: %s", lines.Text())
		}
		acked = append(acked, key)
	}
	cmd.Process.Kill()
	for lines.Scan() { // acknowledged before the kill landed
		if key, ok := strings.CutPrefix(lines.Text(), "acked "); ok {
			acked = append(acked, key)
		}
	}
	cmd.Wait()
	return acked
}

// openHolding opens dir and checks that it holds every acknowledged key.
func openHolding(t *testing.T, dir string, acked []string) *DB {
	t.Helper()
	db, err := Open(dir)
	if err != nil {
		t.Fatalf("Open after SIGKILL: %v", err)
	}
	for _, key := range acked {
		if v, ok := get(t, db, key); !ok || v != strings.Repeat(key, 40) {
			t.Errorf("acknowledged %s is missing or wrong after SIGKILL", key)
		}
	}
	return db
}

// Every commit a process acknowledged before SIGKILL is in the store its next Open replays, and
// the log keeps going after it.
func TestAcknowledgedCommitsSurviveSIGKILL(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	for round := range 3 {
		db := openHolding(t, dir, commitUntilKilled(t, dir, 400+round*700))
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
}

// A log written by a version whose segments were 4 MiB (the last one a spare never written) is
// replayed, and left for segments of today's size.
func TestOpensSegmentsOfTheEarlierSize(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	acked := commitUntilKilled(t, dir, 600)
	for _, index := range segmentsIn(t, dir) {
		if err := os.Truncate(filepath.Join(dir, segmentName(index)), 4<<20); err != nil {
			t.Fatal(err)
		}
	}
	db := openHolding(t, dir, acked)
	set(t, db, "after", "reopened")
	// After Close: until then the spare segment Open prepares may still be being written.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	for _, index := range segmentsIn(t, dir) {
		if info, err := os.Stat(filepath.Join(dir, segmentName(index))); err != nil || info.Size() != segmentSize {
			t.Errorf("segment %d after Open: %v %v, want %d bytes", index, info.Size(), err, segmentSize)
		}
	}
	db = openHolding(t, dir, acked)
	defer db.Close()
	if v, _ := get(t, db, "after"); v != "reopened" {
		t.Errorf("the commit after the reopen read %q", v)
	}
}

// segmentsIn lists the log's segment files in dir.
func segmentsIn(t *testing.T, dir string) []uint64 {
	t.Helper()
	indexes, err := segmentIndexes(dir)
	if err != nil {
		t.Fatal(err)
	}
	return indexes
}

// A checkpoint removes the segments whose every record badger now holds durably; what they held
// is still read, also after a reopen.
func TestCheckpointRemovesSegments(t *testing.T) {
	t.Parallel()
	db, dir := openTemp(t)
	// 50 commits of 200 KiB fill five segments (10 a segment): the checkpoints the rotations
	// brought (checkpointSegments) may have removed some already, and this one removes the rest.
	big := strings.Repeat("v", 200<<10)
	for i := range 50 {
		set(t, db, fmt.Sprint("k", i), big)
	}
	checkpointNow(t, db)
	db.log.background.Wait() // the spare
	// The segment written to, and the spare prepared after it.
	if got := segmentsIn(t, dir); len(got) != 2 || got[1] != got[0]+1 {
		t.Errorf("segments after a checkpoint: %v, want the current one and its spare", got)
	}
	for i := range 50 {
		if v, _ := get(t, db, fmt.Sprint("k", i)); v != big {
			t.Fatalf("k%d is lost", i)
		}
	}
}

// After a power cut badger's unsynced files may hold a commit whose record the log lost (the
// apply runs during the sync): Open writes back what the log's end has for every such key.
func TestOpenUndoesVersionsBeyondTheLog(t *testing.T) {
	t.Parallel()
	image := crashImageAfter(t, 0, func(db *DB) {
		set(t, db, "k", "1")
		set(t, db, "gone", "x")
		if err := db.Update(context.Background(), func(tx storage.Txn) error {
			if err := tx.Set("k", []byte("2")); err != nil {
				return err
			}
			if err := tx.Set("new", []byte("3")); err != nil {
				return err
			}
			return tx.Delete("gone")
		}); err != nil {
			t.Fatal(err)
		}
	})
	// The last commit's record never reached the disk; badger's log, as the page cache had it,
	// holds the commit.
	segment, offsets := walRecords(t, image)
	f, err := os.OpenFile(segment, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, pageSize), int64(offsets[len(offsets)-1])); err != nil {
		t.Fatal(err)
	}
	f.Close()
	db, err := Open(image)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	check := func(when string) {
		t.Helper()
		if v, _ := get(t, db, "k"); v != "1" {
			t.Errorf("%s: k = %q, want 1 (the log's end)", when, v)
		}
		if _, ok := get(t, db, "new"); ok {
			t.Errorf("%s: new, beyond the log's end, is served", when)
		}
		if v, _ := get(t, db, "gone"); v != "x" {
			t.Errorf("%s: gone = %q, want x (its delete is beyond the log's end)", when, v)
		}
	}
	check("after Open")
	// Later commits take versions above every one badger held.
	set(t, db, "after", "y")
	check("after a commit")
	if v, _ := get(t, db, "after"); v != "y" {
		t.Errorf("after = %q, want y", v)
	}
}

// A commit is acknowledged once it is durable, without waiting for badger to apply it: the next
// Update reads it from pending, and a View, which reads badger, waits for badger itself. (While
// this test holds the applied watermark, badger's callbacks cannot mark anything applied: an
// Update that waited for that would never return.)
func TestCommitIsAcknowledgedBeforeBadgerAppliesIt(t *testing.T) {
	t.Parallel()
	db, _ := openTemp(t)
	db.log.applied.mu.Lock()
	set(t, db, "k", "1")
	var seen string
	err := db.Update(context.Background(), func(tx storage.Txn) error {
		v, err := tx.Get("k")
		seen = string(v)
		if err != nil {
			return err
		}
		return tx.Set("k", []byte("2"))
	})
	db.log.applied.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := get(t, db, "k"); seen != "1" || v != "2" {
		t.Errorf("the second Update read %q, a View after both %q; want 1 and 2", seen, v)
	}
}

// A round writes the pages records went into since the last one, as the segment holds them: a
// record that does not fit in the rest of a page begins the next, and the page it left, on disk
// as it is, is not written again.
func TestRoundWritesOnlyThePagesRecordsWentInto(t *testing.T) {
	t.Parallel()
	s := &segment{}
	image := make([]byte, 4*pageSize) // the segment as its records placed it
	put := func(size int) {
		rec := appendRecord(nil, &record{ts: 1, kind: kindCommit, writes: []write{{key: "k", value: make([]byte, size)}}})
		at := placeRecord(s.off, len(rec))
		copy(image[at:], rec)
		s.put(rec, at)
	}
	for _, round := range []struct {
		sizes     []int
		at, pages int
	}{
		{[]int{3000}, 0, 1},
		{[]int{3000}, pageSize, 1},      // did not fit: page 0 is left as written
		{[]int{100}, pageSize, 1},       // fits in the rest of page 1, which goes again
		{[]int{100, 3000}, pageSize, 2}, // the rest of page 1, then page 2
		{[]int{3500}, 3 * pageSize, 1},
	} {
		for _, size := range round.sizes {
			put(size)
		}
		w, _, ok := s.take(nil)
		if !ok || w.at != round.at || len(w.pages) != round.pages*pageSize {
			t.Fatalf("after records of %v bytes: a write of %d bytes at %d (%v), want %d pages at %d", round.sizes, len(w.pages), w.at, ok, round.pages, round.at)
		}
		if !bytes.Equal(w.pages, image[w.at:w.at+len(w.pages)]) {
			t.Fatalf("after records of %v bytes: the pages written differ from the segment's", round.sizes)
		}
	}
	if _, _, ok := s.take(nil); ok {
		t.Error("a round with no new record writes")
	}
}
