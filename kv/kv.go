// Package kv is cockpitfs's durable store: a badger database in the data directory,
// guarded by a pid-bearing flock so that exactly one process uses it, sized for a
// laptop, and exposed as string-keyed transactions where Update retries write
// conflicts for up to two seconds before giving up with storage.ErrLocked.
package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/y"

	"github.com/cockpitfs/cockpitfs/storage"
)

// Backoff between conflict retries: long enough to let the winner's fdatasync
// (≈0.2 ms) land, short enough not to matter next to it.
const (
	firstBackoff = 50 * time.Microsecond
	maxBackoff   = 5 * time.Millisecond
)

var errReadOnly = errors.New("kv: store opened read-only")

var errClosed = errors.New("kv: store closed")

// DB is an open store. It is safe for concurrent use.
type DB struct {
	bdb      *badger.DB
	lock     *os.File
	readOnly bool
	// scratch is the temporary copy a read-only DB runs on, removed by Close.
	scratch string
	dir     string
	// damaged is the error VerifyTables found; once set, every View and Update returns it.
	damaged atomic.Pointer[error]
	// tables re-read what a read may have lost to a damaged block (see served.go).
	tables    tables
	log       *commitLog
	conflicts atomic.Uint64
	// open guards badger and the log against Close: every View, and every attempt of a Commit,
	// holds it for reading while it reads badger and sequences; Close takes it to wait for those
	// under way and refuse any later one. A daemon stopping while requests are still in flight
	// (a busy mount it may not detach) would otherwise send a commit to the stopped applier, a
	// panic, or read a closed badger's table maps.
	open   sync.RWMutex
	closed bool
}

// enter begins an operation that reads badger, or errClosed; the caller must call leave.
func (db *DB) enter() error {
	db.open.RLock()
	if db.closed {
		db.open.RUnlock()
		return errClosed
	}
	return nil
}

func (db *DB) leave() { db.open.RUnlock() }

// Open opens the store in dir, creating dir (mode 0700) if absent. It returns a
// *HeldError if another process, or another Open in this process, holds dir.
func Open(dir string) (*DB, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("kv: create data directory: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	// Only now that we hold the directory is it safe to read badger's files, and only once they
	// pass inspection is badger allowed to replay, truncate and delete.
	if err := Inspect(dir); err != nil {
		lock.Close()
		return nil, err
	}
	// A restore killed before its intent leaves its staged store and intent beside the store.
	os.RemoveAll(filepath.Join(dir, restoreStagedName))
	os.Remove(filepath.Join(dir, restoreIntentName+".tmp"))
	// Opening replays the logs into tables badger writes through memory maps: on a full disk,
	// SIGBUS.
	if err := checkSpace(lock, dir); err != nil {
		lock.Close()
		return nil, err
	}
	db, err := openLocked(dir, lock)
	if err != nil {
		lock.Close()
		return nil, err
	}
	return db, nil
}

// OpenReadOnly opens the store for offline tools such as cockpitfs verify. It takes the same
// exclusive lock as Open, so it refuses with *HeldError while a daemon runs. It never changes a
// byte of dir: after Inspect, it opens a copy of the store in a temporary directory (badger's own
// ReadOnly mode refuses a log a kill -9 left unreplayed, which is exactly when verify is wanted,
// and the write-ahead log is replayed into badger at every open), removed again by Close. Update
// always fails.
func OpenReadOnly(dir string) (*DB, error) {
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	if err := Inspect(dir); err != nil {
		lock.Close()
		return nil, err
	}
	copyDir, err := copyForInspection(dir)
	if err != nil {
		lock.Close()
		return nil, err
	}
	db, err := openLocked(copyDir, lock)
	if err != nil {
		lock.Close()
		os.RemoveAll(copyDir)
		return nil, err
	}
	db.readOnly, db.scratch = true, copyDir
	return db, nil
}

// openLocked opens the store in dir, which lock holds and Inspect passed: badger, then the
// write-ahead log replayed into it (see openLog).
func openLocked(dir string, lock *os.File) (*DB, error) {
	if err := removeEmptyLogs(dir); err != nil {
		return nil, err
	}
	bdb, err := openBadger(dir)
	if err != nil {
		return nil, err
	}
	log, err := openLog(dir, bdb)
	if err != nil {
		bdb.Close()
		return nil, err
	}
	if f, err := os.OpenFile(filepath.Join(dir, "DISCARD"), os.O_RDWR, 0); err == nil {
		allocate(f)
		f.Close()
	}
	return &DB{bdb: bdb, lock: lock, log: log, dir: dir, tables: tables{dir: dir}}, nil
}

// openBadger opens badger, turning a panic on damage Inspect cannot see into an error.
func openBadger(dir string) (bdb *badger.DB, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("kv: open badger in %s: %v: %w", dir, p, storage.ErrCorrupt)
		}
	}()
	bdb, err = badger.OpenManaged(badgerOptions(dir))
	if err != nil {
		return nil, fmt.Errorf("kv: open badger in %s: %w", dir, err)
	}
	return bdb, nil
}

// badgerOptions trades throughput for footprint (FIELD-NOTES: ≈35 MiB idle instead
// of ≈77 MiB, 15 MiB on disk instead of 2.2 GiB of sparse files), and verifies every block and
// value it reads against its checksum, so damage is an error instead of a wrong answer.
func badgerOptions(dir string) badger.Options {
	return badger.DefaultOptions(dir).
		// Commits are made durable by the write-ahead log (durable.go), not by badger, and
		// checked for conflicts by kv, which sequences them.
		WithSyncWrites(false).
		WithDetectConflicts(false).
		WithMemTableSize(4 << 20).
		WithNumMemtables(2).
		WithNumLevelZeroTables(2).
		// Same 3:1 ratio as badger's defaults (5 and 15): room for a burst while
		// the compactors catch up before writes stall.
		WithNumLevelZeroTablesStall(6).
		WithBaseTableSize(1 << 20).
		WithBaseLevelSize(4 << 20).
		WithValueThreshold(valueThreshold).
		WithValueLogFileSize(16 << 20).
		WithNumCompactors(2).
		WithCompression(options.None).
		WithBlockCacheSize(0).
		WithIndexCacheSize(0).
		WithChecksumVerificationMode(options.OnTableAndBlockRead).
		WithVerifyValueChecksum(true).
		WithLogger(warningLogger{log.New(os.Stderr, "badger: ", log.LstdFlags)})
}

// warningLogger passes badger's errors and warnings to stderr (a warning is how badger reports
// data it skipped) and drops the rest, which is routine chatter (flushes, compactions, replay).
type warningLogger struct{ *log.Logger }

func (l warningLogger) Errorf(format string, args ...any)   { l.Printf("error: "+format, args...) }
func (l warningLogger) Warningf(format string, args ...any) { l.Printf("warning: "+format, args...) }
func (warningLogger) Infof(string, ...any)                  {}
func (warningLogger) Debugf(string, ...any)                 {}

// removeEmptyLogs deletes zero-length memtable and value-log files. A kill between
// badger creating the next file and sizing it leaves one behind, and badger then
// refuses to open (badger issue #2207). An empty file holds no records.
func removeEmptyLogs(dir string) error {
	for _, pattern := range []string{"*.mem", "*.vlog"} {
		paths, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return fmt.Errorf("kv: %w", err)
		}
		for _, path := range paths {
			info, err := os.Stat(path)
			if err != nil {
				return fmt.Errorf("kv: %w", err)
			}
			if info.Mode().IsRegular() && info.Size() == 0 {
				if err := os.Remove(path); err != nil {
					return fmt.Errorf("kv: remove empty %s: %w", path, err)
				}
			}
		}
	}
	return nil
}

// valueThreshold is the size from which badger stores a value in its value log instead of the
// LSM. Badger requires it ≤ 15 % of the memtable (≈614 KiB here). 512 KiB keeps every value the
// engine writes in the LSM — holders under keys of their own, and a stack's record with the
// largest drain a request can carry (≈300 KB, engine's TestLargestDrainStaysOutOfTheValueLog) —
// so the value log, which nothing reclaims, stays empty.
const valueThreshold = 512 << 10

// closeStore closes the log and badger, and removes a read-only DB's copy; the lock stays.
func (db *DB) closeStore() error {
	db.log.stop() // the applier and a checkpoint use badger
	db.tables.closeAll()
	err := db.bdb.Close()
	if err == nil && !db.readOnly {
		// badger's Close flushed and synced everything it applied: the next Open replays nothing.
		err = db.log.finalCheckpoint()
	}
	db.log.close()
	if db.scratch != "" {
		if rmErr := os.RemoveAll(db.scratch); err == nil {
			err = rmErr
		}
	}
	return err
}

// Close closes badger, then releases the directory lock.
func (db *DB) Close() error {
	db.open.Lock()
	db.closed = true
	db.open.Unlock()
	// Every later View and Update answers errClosed: a Get that latest answers would otherwise
	// still succeed once badger is closed.
	defer db.log.fail(errClosed)
	if db.scratch == "" && checkSpace(db.lock, db.dir) != nil {
		// badger's Close flushes the memtable into a table it writes through a memory map: on a
		// full disk, SIGBUS. Every acknowledged commit is in the write-ahead log, which the next
		// Open replays, as after a crash. badger's goroutines end with the process.
		db.log.close()
		db.lock.Close()
		return fmt.Errorf("kv: closed %s without flushing, the disk being full: the write-ahead log replays at the next open", db.dir)
	}
	err := db.closeStore()
	if lockErr := db.lock.Close(); err == nil {
		err = lockErr
	}
	if err != nil {
		return fmt.Errorf("kv: close: %w", err)
	}
	return nil
}

// txn is a transaction at read version rts. An Update's keeps what kv's conflict check needs (the
// keys it read) and what its log record holds (its writes, in order).
type txn struct {
	db     *DB
	btx    *badger.Txn
	rts    uint64
	gen    uint64 // the generation of pending's latest when it began, before rts was chosen
	update bool
	reads  []string
	writes []write
}

// ownWrite is the transaction's last write of key.
func (t *txn) ownWrite(key string) (write, bool) {
	for i := len(t.writes) - 1; i >= 0; i-- {
		if t.writes[i].key == key {
			return t.writes[i], true
		}
	}
	return write{}, false
}

func (t *txn) Get(key string) (value []byte, err error) {
	// A damaged table can make badger index past a block; that is a damaged read, not a crash.
	defer func() {
		if p := recover(); p != nil {
			value, err = nil, fmt.Errorf("kv: get %q: %v: %w", key, p, storage.ErrCorrupt)
		}
	}()
	// Its own writes, then commits badger has yet to apply or the latest it applied, then badger.
	// (A View's read version is applied: nothing it reads is pending.)
	var w write
	var ok bool
	if t.update {
		t.reads = append(t.reads, key)
		w, ok = t.ownWrite(key)
	}
	if !ok {
		var v pendingVersion
		if v, ok = t.db.log.pending.at(key, t.rts); ok {
			w = write{key: key, value: v.value, delete: v.del}
		}
	}
	if ok {
		if w.delete {
			return nil, storage.ErrNotFound
		}
		return bytes.Clone(w.value), nil
	}
	item, err := t.btx.Get([]byte(key))
	if errors.Is(err, badger.ErrKeyNotFound) {
		// Missing, or in a block badger could not read and said nothing about.
		if err := t.db.checkMissing([]byte(key)); err != nil {
			return nil, err
		}
		return nil, storage.ErrNotFound
	}
	if err != nil {
		return nil, readError("get", key, err)
	}
	value, err = item.ValueCopy(nil)
	if err != nil {
		return nil, readError("read value of", key, err)
	}
	t.db.log.pending.read(key, item.Version(), value, t.gen)
	return bytes.Clone(value), nil
}

// readError marks a failed checksum as damage, which the adapter answers with EIO.
func readError(what, key string, err error) error {
	if errors.Is(err, y.ErrChecksumMismatch) {
		return fmt.Errorf("kv: %s %q: %w: %w", what, key, err, storage.ErrCorrupt)
	}
	return fmt.Errorf("kv: %s %q: %w", what, key, err)
}

// Set and Delete wrap badger's errors; badger.ErrTxnTooBig stays visible to errors.Is.
func (t *txn) Set(key string, value []byte) error {
	if err := t.btx.Set([]byte(key), value); err != nil {
		return fmt.Errorf("kv: set %q: %w", key, err)
	}
	t.writes = append(t.writes, write{key: key, value: value})
	return nil
}

func (t *txn) Delete(key string) error {
	if err := t.btx.Delete([]byte(key)); err != nil {
		return fmt.Errorf("kv: delete %q: %w", key, err)
	}
	t.writes = append(t.writes, write{key: key, delete: true})
	return nil
}

func (t *txn) Scan(prefix string, fn func(key string, value []byte) error) error {
	// An Update merges in the commits badger has yet to apply (newer than badger's versions of
	// their keys); its own writes badger's iterator already merges, and they win.
	var pendingKeys []string
	var pendingVersions map[string]pendingVersion
	if t.update {
		pendingKeys, pendingVersions = t.db.log.pending.prefixed(prefix, t.rts)
		kept := pendingKeys[:0]
		for _, key := range pendingKeys {
			if _, own := t.ownWrite(key); !own {
				kept = append(kept, key)
			} else {
				delete(pendingVersions, key)
			}
		}
		pendingKeys = kept
	}
	emit := func(key string, value []byte) error {
		if t.update {
			t.reads = append(t.reads, key)
		}
		return fn(key, value)
	}
	emitPending := func(key string) error {
		if v := pendingVersions[key]; !v.del {
			return emit(key, bytes.Clone(v.value))
		}
		return nil
	}
	next := 0 // pendingKeys[next:] are not emitted yet
	opts := badger.DefaultIteratorOptions
	opts.Prefix = []byte(prefix)
	it := t.btx.NewIterator(opts)
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		key := string(item.Key())
		for ; next < len(pendingKeys) && pendingKeys[next] < key; next++ {
			if err := emitPending(pendingKeys[next]); err != nil {
				return err
			}
		}
		if _, ok := pendingVersions[key]; ok {
			next++
			if err := emitPending(key); err != nil {
				return err
			}
			continue
		}
		value, err := item.ValueCopy(nil)
		if err != nil {
			return readError("read value of", key, err)
		}
		if err := emit(key, value); err != nil {
			return err
		}
	}
	for ; next < len(pendingKeys); next++ {
		if err := emitPending(pendingKeys[next]); err != nil {
			return err
		}
	}
	// The scan may have ended early at a block badger could not read, and said nothing.
	return t.db.checkScan(opts.Prefix)
}

// View runs fn in a read-only transaction on one consistent snapshot, which holds only durable
// commits: every commit sequenced before it began, which it waits for. fn's error is returned
// unchanged.
func (db *DB) View(fn func(storage.Txn) error) error {
	if err := db.damaged.Load(); err != nil {
		return *err
	}
	if err := db.log.err(); err != nil {
		return err
	}
	if err := db.enter(); err != nil {
		return err
	}
	defer db.leave()
	gen := db.log.pending.gen()
	rts := db.log.beginRead()
	defer db.log.endRead(rts)
	// Every commit sequenced before the View began, durable and applied.
	if err := db.log.acknowledge(rts); err != nil {
		return err
	}
	btx := db.bdb.NewTransactionAt(rts, false)
	defer btx.Discard()
	return fn(&txn{db: db, btx: btx, rts: rts, gen: gen})
}

// Update runs fn in a read-write transaction and commits it. If the commit
// conflicts with a concurrent one, fn runs again on a fresh transaction, so fn
// must be safe to re-run. After 2 s, or once ctx is done, Update gives up with an
// error wrapping storage.ErrLocked (and ctx's error, if that was the cause). An error from
// fn discards the transaction and is returned unchanged. A nil return means the
// commit is on disk.
func (db *DB) Update(ctx context.Context, fn func(storage.Txn) error) error {
	durable, err := db.Commit(ctx, fn)
	if err != nil {
		return err
	}
	return durable()
}

// Commit is Update returning once the commit is sequenced, before its sync: later transactions'
// fn see the writes, and a View waits until they are durable. durable waits for the sync
// (Update's nil), leading it if no other committer or View does, and must be called.
func (db *DB) Commit(ctx context.Context, fn func(storage.Txn) error) (durable func() error, err error) {
	if db.readOnly {
		return nil, errReadOnly
	}
	if err := db.damaged.Load(); err != nil {
		return nil, *err
	}
	deadline := time.Now().Add(storage.Budget)
	backoff := firstBackoff
	for attempt := 1; ; attempt++ {
		durable, err := db.tryCommit(fn)
		if !errors.Is(err, errConflict) {
			return durable, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: %d attempts conflicted over %v", storage.ErrLocked, attempt, storage.Budget)
		}
		db.conflicts.Add(1)
		if err := sleep(ctx, rand.N(backoff)+backoff/2); err != nil {
			return nil, fmt.Errorf("%w: %d attempts conflicted: %w", storage.ErrLocked, attempt, err)
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// tryCommit is one attempt; errConflict means fn must run again.
func (db *DB) tryCommit(fn func(storage.Txn) error) (durable func() error, err error) {
	l := db.log
	if err := l.err(); err != nil {
		return nil, err
	}
	if err := db.enter(); err != nil {
		return nil, err
	}
	defer db.leave()
	gen := l.pending.gen()
	rts := l.beginRead()
	defer l.endRead(rts)
	t := &txn{db: db, btx: db.bdb.NewTransactionAt(rts, true), rts: rts, gen: gen, update: true}
	defer func() {
		if t.btx != nil { // not handed to the applier
			t.btx.Discard()
		}
	}()
	if err := fn(t); err != nil {
		// fn decided on what it read, which must be durable before anyone acts on the decision.
		if syncErr := l.waitDurable(rts); syncErr != nil {
			return nil, syncErr
		}
		return nil, err
	}
	// A commit is acknowledged once durable: badger applies it meanwhile, and a View, the only
	// read of badger that could miss it, waits for that itself.
	if len(t.writes) == 0 {
		return func() error { return l.waitDurable(rts) }, nil
	}
	// An fstatfs a commit (≈ 1 µs of a commit's ≈ 170, 7 after idle): badger writes new memtable logs through
	// maps of sparse files until the next checkpoint allocates them (see checkSpace).
	if err := checkSpace(db.lock, db.dir); err != nil {
		return nil, err
	}
	ts, err := l.sequence(t)
	if err != nil {
		return nil, err
	}
	return func() error { return l.waitDurable(ts) }, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// VerifyTables checks every table's checksums again: reads catch a damaged block only where it
// could have hidden a key (served.go), not one holding a newer version of a key an older table
// holds too. Once damage is found the store fails closed: every View and Update returns it
// (storage.ErrCorrupt), until a restart, which Open then refuses.
func (db *DB) VerifyTables() (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("kv: verify tables: %s", oneLine(p))
		}
		if err != nil {
			err = fmt.Errorf("%w: %w", err, storage.ErrCorrupt)
			db.damaged.Store(&err)
		}
	}()
	return db.bdb.VerifyChecksum()
}

// Syncs returns how many fdatasync rounds of the log made commits durable since Open.
func (db *DB) Syncs() uint64 {
	return db.log.rounds.Load()
}

// Conflicts returns how many times Update retried because of a conflict since Open.
func (db *DB) Conflicts() uint64 {
	return db.conflicts.Load()
}
