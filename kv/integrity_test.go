package kv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage"
)

// crashImage writes n keys through an open store and copies its files as a kill -9 would leave
// them (the memory-mapped logs as the page cache holds them), without closing it.
func crashImage(t *testing.T, n int) string {
	t.Helper()
	return crashImageAfter(t, n, func(*DB) {})
}

// crashImageAfter is crashImage running then before the copy.
func crashImageAfter(t *testing.T, n int, then func(*DB)) string {
	t.Helper()
	db, dir := openTemp(t)
	for i := range n {
		set(t, db, fmt.Sprintf("k%03d", i), fmt.Sprintf("value-%03d-%s", i, strings.Repeat("x", 40)))
	}
	then(db)
	image := filepath.Join(t.TempDir(), "image")
	if err := os.Mkdir(image, 0o700); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if isStoreFile(e.Name()) {
			if err := copySparse(filepath.Join(dir, e.Name()), filepath.Join(image, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	return image
}

// closedStore writes n keys and closes the store, which flushes them into a table.
func closedStore(t *testing.T, n int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	db, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		set(t, db, fmt.Sprintf("k%03d", i), fmt.Sprintf("value-%03d-%s", i, strings.Repeat("x", 40)))
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

func onlyFile(t *testing.T, dir, pattern string) string {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(dir, pattern))
	var nonEmpty []string
	for _, p := range paths {
		if info, err := os.Stat(p); err == nil && info.Size() > 0 {
			nonEmpty = append(nonEmpty, p)
		}
	}
	if len(nonEmpty) != 1 {
		t.Fatalf("want one non-empty %s in %s, got %v", pattern, dir, nonEmpty)
	}
	return nonEmpty[0]
}

// entryOffsets lists where each valid entry of a log starts.
func entryOffsets(t *testing.T, path string) []int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var offsets []int
	for off := logHeaderSize; ; {
		n, ok := entryAt(data, off)
		if !ok {
			return offsets
		}
		offsets = append(offsets, off)
		off += n
	}
}

func flipByte(t *testing.T, path string, at int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, int64(at)); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, int64(at)); err != nil {
		t.Fatal(err)
	}
}

// fingerprint is every file's name, size and content hash, to show nothing was changed.
func fingerprint(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range entries {
		if !isStoreFile(e.Name()) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %d %x\n", e.Name(), len(data), sha256.Sum256(data))
	}
	return b.String()
}

// refused opens dir both ways and wants a CorruptError naming file, with dir left unchanged.
func refused(t *testing.T, dir, file string) {
	t.Helper()
	before := fingerprint(t, dir)
	for name, open := range map[string]func(string) (*DB, error){"Open": Open, "OpenReadOnly": OpenReadOnly} {
		db, err := open(dir)
		if err == nil {
			db.Close()
			t.Fatalf("%s of a damaged store succeeded", name)
		}
		var corrupt *CorruptError
		if !errors.As(err, &corrupt) || !errors.Is(err, storage.ErrCorrupt) {
			t.Fatalf("%s: want a CorruptError, got %v", name, err)
		}
		if corrupt.File != file {
			t.Errorf("%s names %s, want %s (%v)", name, corrupt.File, file, err)
		}
		if after := fingerprint(t, dir); after != before {
			t.Fatalf("%s changed the store:\nbefore %s\nafter %s", name, before, after)
		}
	}
}

// checkpointNow runs a checkpoint to its end, as the log does every checkpointEvery commits,
// once badger has applied every commit acknowledged so far: the checkpoint covers them all.
func checkpointNow(t *testing.T, db *DB) {
	t.Helper()
	applied(t, db)
	l := db.log
	for !l.checkpointing.CompareAndSwap(false, true) {
		l.background.Wait()
	}
	l.background.Add(1)
	l.checkpoint()
	if err := l.err(); err != nil {
		t.Fatal(err)
	}
}

// A bad entry in badger's log before valid ones that a checkpoint made durable (so that the
// write-ahead log no longer holds them) is damage: badger would drop them.
func TestBadLogEntryBeforeValidOnesIsRefused(t *testing.T) {
	t.Parallel()
	image := crashImageAfter(t, 16, func(db *DB) { checkpointNow(t, db) })
	mem := onlyFile(t, image, "*.mem")
	offsets := entryOffsets(t, mem)
	if len(offsets) < 32 {
		t.Fatalf("want ≥ 32 entries (16 commits), got %d", len(offsets))
	}
	flipByte(t, mem, offsets[len(offsets)/3]+12) // in the middle of an early commit's key
	refused(t, image, mem)
}

// The same damage where no checkpoint covers the entries is what a power cut can leave of
// badger's unsynced log: the write-ahead log holds every commit, and Open replays them.
func TestBadLogEntryAfterTheCheckpointOpens(t *testing.T) {
	t.Parallel()
	image := crashImage(t, 16)
	mem := onlyFile(t, image, "*.mem")
	offsets := entryOffsets(t, mem)
	flipByte(t, mem, offsets[len(offsets)/3]+12)
	db, err := Open(image)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer db.Close()
	for i := range 16 {
		if _, ok := get(t, db, fmt.Sprintf("k%03d", i)); !ok {
			t.Errorf("k%03d is missing", i)
		}
	}
}

// walRecords lists where each record of the log's only non-empty segment starts, and its path.
func walRecords(t *testing.T, dir string) (string, []int) {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(dir, "*"+segmentExt))
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var offsets []int
		for off := recordStart(data, 0); off >= 0; off = recordStart(data, off) {
			_, n, ok := recordAt(data, off)
			if !ok {
				t.Fatalf("%s: bad record at %d", path, off)
			}
			offsets = append(offsets, off)
			off += n
		}
		if len(offsets) > 0 {
			return path, offsets
		}
	}
	t.Fatalf("no log records in %s", dir)
	return "", nil
}

// A bad final record is what a power cut mid-sync leaves: the store opens without its commit,
// which was never acknowledged, and the rest of its segment is zeroed.
func TestTornTailOpens(t *testing.T) {
	t.Parallel()
	image := crashImage(t, 16)
	// badger's own log is not synced commit by commit: after a power cut it may hold none of the
	// commits the write-ahead log has.
	for _, mem := range globAll(t, image, "*.mem") {
		if err := os.Remove(mem); err != nil {
			t.Fatal(err)
		}
	}
	segment, offsets := walRecords(t, image)
	torn := offsets[len(offsets)-1]
	flipByte(t, segment, torn+20) // the last commit's record
	scan, err := scanLog(image)
	if err != nil {
		t.Fatal(err)
	}
	if err := truncateLog(image, scan); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(segment)
	if err != nil {
		t.Fatal(err)
	}
	if !allZero(data[torn:]) || allZero(data[:torn]) {
		t.Error("the torn record's segment is not zeroed from it on, and only from it")
	}
	db, err := Open(image)
	if err != nil {
		t.Fatalf("Open of a torn tail: %v", err)
	}
	defer db.Close()
	for i := range 15 {
		if _, ok := get(t, db, fmt.Sprintf("k%03d", i)); !ok {
			t.Errorf("k%03d, before the torn commit, is gone", i)
		}
	}
	if _, ok := get(t, db, "k015"); ok {
		t.Error("k015, whose commit is torn, is served")
	}
}

// A damaged record followed by one written once it was durable is damage, not a torn tail: the
// commit it held was acknowledged.
func TestDamagedLogRecordIsRefused(t *testing.T) {
	t.Parallel()
	image := crashImage(t, 16)
	segment, offsets := walRecords(t, image)
	flipByte(t, segment, offsets[len(offsets)/2]+20)
	refused(t, image, segment)
}

func globAll(t *testing.T, dir, pattern string) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil {
		t.Fatal(err)
	}
	return paths
}

func TestMissingManifestIsRefused(t *testing.T) {
	t.Parallel()
	dir := closedStore(t, 16)
	onlyFile(t, dir, "*.sst")
	manifest := filepath.Join(dir, manifestName)
	if err := os.Remove(manifest); err != nil {
		t.Fatal(err)
	}
	refused(t, dir, manifest)
}

func TestDamagedManifestIsRefused(t *testing.T) {
	t.Parallel()
	dir := closedStore(t, 16)
	manifest := filepath.Join(dir, manifestName)
	flipByte(t, manifest, 12) // inside the first change set
	refused(t, dir, manifest)
}

func TestTableChecksumMismatchIsRefused(t *testing.T) {
	t.Parallel()
	dir := closedStore(t, 16)
	sst, at := valueInTable(t, dir)
	flipByte(t, sst, at+7) // "value-007" → "value-037"
	refused(t, dir, sst)
}

func TestTruncatedTableIsRefused(t *testing.T) {
	t.Parallel()
	dir := closedStore(t, 16)
	sst := onlyFile(t, dir, "*.sst")
	info, err := os.Stat(sst)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(sst, info.Size()/2); err != nil {
		t.Fatal(err)
	}
	refused(t, dir, sst)
}

// verify's store must not replay, flush or delete the log a crash left: the files stay as they
// were, byte for byte, and every acknowledged key is read.
func TestOpenReadOnlyChangesNothing(t *testing.T) {
	t.Parallel()
	image := crashImage(t, 16)
	before := fingerprint(t, image)
	db, err := OpenReadOnly(image)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		if _, ok := get(t, db, fmt.Sprintf("k%03d", i)); !ok {
			t.Errorf("k%03d is missing", i)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if after := fingerprint(t, image); after != before {
		t.Fatalf("OpenReadOnly changed the store:\nbefore %s\nafter %s", before, after)
	}
	if db.scratch == "" {
		t.Fatal("no scratch copy was used")
	}
	if _, err := os.Stat(db.scratch); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the scratch copy %s is left behind", db.scratch)
	}
}

// A table damaged while the store is open: badger would read its records as missing; the next
// rolling backup's verification finds it, writes no backup, and from then on every read and
// write fails with ErrCorrupt.
func TestTableDamagedWhileOpenFailsClosed(t *testing.T) {
	t.Parallel()
	dir := closedStore(t, 16)
	db, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.KeepBackup(dir); err != nil {
		t.Fatalf("a backup of a sound store: %v", err)
	}
	damageInPlace(t, dir)
	backups, _ := filepath.Glob(filepath.Join(dir, BackupDirName, "*.backup"))
	if _, err := db.KeepBackup(dir); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("a backup of a damaged store: want ErrCorrupt, got %v", err)
	}
	if after, _ := filepath.Glob(filepath.Join(dir, BackupDirName, "*.backup")); len(after) != len(backups) {
		t.Errorf("a backup was written of the damaged store: %v", after)
	}
	if err := db.View(func(storage.Txn) error { return nil }); !errors.Is(err, storage.ErrCorrupt) {
		t.Errorf("View after the damage was found: %v", err)
	}
	if err := db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set("k", nil) }); !errors.Is(err, storage.ErrCorrupt) {
		t.Errorf("Update after the damage was found: %v", err)
	}
}

// damageInPlace overwrites one byte of value-007 in the store's only table, in place: the table
// is mapped by the open store, which sees the change at once.
func damageInPlace(t *testing.T, dir string) {
	t.Helper()
	sst, at := valueInTable(t, dir)
	f, err := os.OpenFile(sst, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{'9'}, int64(at+8)); err != nil {
		t.Fatal(err)
	}
}

// A read that meets a table damaged after the store opened is damage (ErrCorrupt), never a
// missing key nor a shorter scan — badger alone answers "not found" and a scan without the
// block's keys — and the store fails closed from then on.
func TestTableDamagedWhileOpenReadsAsDamage(t *testing.T) {
	t.Parallel()
	for _, read := range []struct {
		name string
		fn   func(tx storage.Txn) error
	}{
		{"get", func(tx storage.Txn) error { _, err := tx.Get("k007"); return err }},
		{"scan", func(tx storage.Txn) error {
			return tx.Scan("k", func(string, []byte) error { return nil })
		}},
	} {
		t.Run(read.name, func(t *testing.T) {
			t.Parallel()
			dir := closedStore(t, 16)
			db, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			// Sound: a missing key is missing, a scan finds every key.
			if _, ok := get(t, db, "k999"); ok {
				t.Fatal("k999 exists")
			}
			n := 0
			if err := db.View(func(tx storage.Txn) error {
				return tx.Scan("k", func(string, []byte) error { n++; return nil })
			}); err != nil || n != 16 {
				t.Fatalf("scan of the sound store: %d keys, %v", n, err)
			}

			damageInPlace(t, dir)
			err = db.View(read.fn)
			if !errors.Is(err, storage.ErrCorrupt) || errors.Is(err, storage.ErrNotFound) {
				t.Fatalf("%s of a key in the damaged block: want ErrCorrupt, got %v", read.name, err)
			}
			if !strings.Contains(err.Error(), ".sst") {
				t.Errorf("the error does not name the table: %v", err)
			}
			if err := db.View(func(storage.Txn) error { return nil }); !errors.Is(err, storage.ErrCorrupt) {
				t.Errorf("View after the damage was met: %v", err)
			}
		})
	}
}

// valueInTable finds value-007 in the store's only table: the table's path and the value's offset.
func valueInTable(t *testing.T, dir string) (sst string, at int) {
	t.Helper()
	sst = onlyFile(t, dir, "*.sst")
	data, err := os.ReadFile(sst)
	if err != nil {
		t.Fatal(err)
	}
	if at = bytes.Index(data, []byte("value-007-")); at < 0 {
		t.Fatal("value-007 is not in the table")
	}
	return sst, at
}
