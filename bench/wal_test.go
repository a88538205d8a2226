package bench

import (
	bin "encoding/binary"
	"hash/crc32"
	"path/filepath"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"golang.org/x/sys/unix"
)

// walSize is the write-ahead log file's preallocated size, as etcd preallocates its segments, so
// an fdatasync never has a file size to write.
const walSize = 64 << 20

// walStore is the design issue 17 asks to measure before building (etcd's WAL): each commit is
// appended to a log file with pwrite(2) and made durable by its fdatasync, and badger, with no
// sync of its own, holds the materialised state (replayed from the log on start, not built here).
// Its figure is one such commit: badger's in-memory commit, then the log record's pwrite and
// fdatasync.
type walStore struct {
	db     *badger.DB
	log    int
	offset int64
	record []byte
}

func newWALStore(b *testing.B) *walStore {
	dir := filepath.Join(workDir, "wal")
	db, err := badger.Open(badger.DefaultOptions(filepath.Join(dir, "state")).
		WithSyncWrites(false).WithMemTableSize(4 << 20).WithNumMemtables(2).WithNumLevelZeroTables(2).
		WithBaseTableSize(1 << 20).WithBaseLevelSize(4 << 20).WithValueThreshold(256 << 10).WithValueLogFileSize(16 << 20).
		WithCompression(options.None).WithBlockCacheSize(0).WithIndexCacheSize(0).WithLogger(nil))
	if err != nil {
		b.Fatal(err)
	}
	cleanups = append(cleanups, func() { db.Close() })
	fd, err := unix.Open(filepath.Join(dir, "wal"), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	cleanups = append(cleanups, func() { unix.Close(fd) })
	if err := unix.Fallocate(fd, 0, 0, walSize); err != nil {
		b.Fatal(err)
	}
	// Written once, so later writes land on allocated, initialised blocks (no unwritten-extent
	// conversion, which is metadata) as in a recycled segment.
	zero := make([]byte, 1<<20)
	for off := int64(0); off < walSize; off += int64(len(zero)) {
		if _, err := unix.Pwrite(fd, zero, off); err != nil {
			b.Fatal(err)
		}
	}
	if err := unix.Fsync(fd); err != nil {
		b.Fatal(err)
	}
	return &walStore{db: db, log: fd}
}

// commit sets key to value: the badger transaction, then its log record (length, CRC, key, value)
// written in place and fdatasync'd.
func (w *walStore) commit(key string, value []byte) error {
	if err := w.apply(key, value); err != nil {
		return err
	}
	w.record = bin.LittleEndian.AppendUint32(w.record[:0], uint32(len(key)+len(value)))
	w.record = bin.LittleEndian.AppendUint32(w.record, crc32.ChecksumIEEE(value))
	w.record = append(append(w.record, key...), value...)
	if w.offset+int64(len(w.record)) > walSize {
		w.offset = 0
	}
	if _, err := unix.Pwrite(w.log, w.record, w.offset); err != nil {
		return err
	}
	w.offset += int64(len(w.record))
	return unix.Fdatasync(w.log)
}

// apply is commit's badger part alone: the materialised state's unsynced commit.
func (w *walStore) apply(key string, value []byte) error {
	txn := w.db.NewTransaction(true)
	defer txn.Discard()
	if err := txn.Set([]byte(key), value); err != nil {
		return err
	}
	return txn.Commit()
}
