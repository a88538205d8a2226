// Package kv is cockpitfs's durable store: a badger database in the data directory,
// guarded by a pid-bearing flock so that exactly one process uses it, sized for a
// laptop, and exposed as string-keyed transactions where Update retries write
// conflicts for up to two seconds before giving up with storage.ErrLocked.
package kv

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"

	"github.com/cockpitfs/cockpitfs/storage"
)

// lockWait bounds how long Update keeps retrying conflicts (SPEC: STATE_LOCKED).
const lockWait = 2 * time.Second

// Backoff between conflict retries: long enough to let the winner's fdatasync
// (≈0.2 ms) land, short enough not to matter next to it.
const (
	firstBackoff = 50 * time.Microsecond
	maxBackoff   = 5 * time.Millisecond
)

var errReadOnly = errors.New("kv: store opened read-only")

// DB is an open store. It is safe for concurrent use.
type DB struct {
	bdb       *badger.DB
	lock      *os.File
	readOnly  bool
	sync      *groupSync
	conflicts atomic.Uint64
}

// Open opens the store in dir, creating dir (mode 0700) if absent. It returns a
// *HeldError if another process, or another Open in this process, holds dir.
func Open(dir string) (*DB, error) {
	return open(dir, false)
}

// OpenReadOnly opens the store for offline tools such as cockpitfs verify. It takes
// the same exclusive lock as Open, so it refuses with *HeldError while a daemon
// runs, and Update always fails.
func OpenReadOnly(dir string) (*DB, error) {
	return open(dir, true)
}

func open(dir string, readOnly bool) (*DB, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("kv: create data directory: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	// Only now that we hold the directory is it safe to touch badger's files.
	if err := removeEmptyLogs(dir); err != nil {
		lock.Close()
		return nil, err
	}
	bdb, err := badger.Open(badgerOptions(dir))
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("kv: open badger in %s: %w", dir, err)
	}
	return &DB{bdb: bdb, lock: lock, readOnly: readOnly, sync: newGroupSync(dir)}, nil
}

// badgerOptions trades throughput for footprint (FIELD-NOTES: ≈35 MiB idle instead
// of ≈77 MiB, 15 MiB on disk instead of 2.2 GiB of sparse files).
//
// Read-only mode is deliberately badger's normal mode: badger's ReadOnly refuses
// to open after a kill -9 (the write-ahead log would need truncating), which is
// exactly when verify is wanted. OpenReadOnly's guarantee is that Update refuses,
// so no record is ever written; badger may still replay and flush its own log.
func badgerOptions(dir string) badger.Options {
	return badger.DefaultOptions(dir).
		// Commits are made durable by groupSync, not by badger.
		WithSyncWrites(false).
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
		WithLogger(errorLogger{log.New(os.Stderr, "badger: ", log.LstdFlags)})
}

// errorLogger passes badger's errors to stderr and drops the rest, which is
// routine chatter (table flushes, compactions, replay progress).
type errorLogger struct{ *log.Logger }

func (l errorLogger) Errorf(format string, args ...any) { l.Printf(format, args...) }
func (errorLogger) Warningf(string, ...any)             {}
func (errorLogger) Infof(string, ...any)                {}
func (errorLogger) Debugf(string, ...any)               {}

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
// LSM. Badger requires it ≤ 15 % of the memtable (≈614 KiB here). 256 KiB keeps every record we
// write (≤ ~64 KiB) in the LSM, so the value log stays empty, never needs GC, and needs no sync;
// a transaction can still carry two values just under it.
const valueThreshold = 256 << 10

// Close closes badger, then releases the directory lock.
func (db *DB) Close() error {
	err := db.bdb.Close()
	db.sync.close()
	if lockErr := db.lock.Close(); err == nil {
		err = lockErr
	}
	if err != nil {
		return fmt.Errorf("kv: close: %w", err)
	}
	return nil
}

type txn struct {
	btx *badger.Txn
	// wroteValueLog is set by a Set whose value badger puts in its value log.
	wroteValueLog *bool
}

func (t txn) Get(key string) ([]byte, error) {
	item, err := t.btx.Get([]byte(key))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, storage.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("kv: get %q: %w", key, err)
	}
	value, err := item.ValueCopy(nil)
	if err != nil {
		return nil, fmt.Errorf("kv: read value of %q: %w", key, err)
	}
	return value, nil
}

// Set and Delete wrap badger's errors; badger.ErrTxnTooBig stays visible to errors.Is.
func (t txn) Set(key string, value []byte) error {
	if err := t.btx.Set([]byte(key), value); err != nil {
		return fmt.Errorf("kv: set %q: %w", key, err)
	}
	if len(value) >= valueThreshold {
		*t.wroteValueLog = true
	}
	return nil
}

func (t txn) Delete(key string) error {
	if err := t.btx.Delete([]byte(key)); err != nil {
		return fmt.Errorf("kv: delete %q: %w", key, err)
	}
	return nil
}

func (t txn) Scan(prefix string, fn func(key string, value []byte) error) error {
	opts := badger.DefaultIteratorOptions
	opts.Prefix = []byte(prefix)
	it := t.btx.NewIterator(opts)
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		value, err := item.ValueCopy(nil)
		if err != nil {
			return fmt.Errorf("kv: read value of %q: %w", item.Key(), err)
		}
		if err := fn(string(item.Key()), value); err != nil {
			return err
		}
	}
	return nil
}

// View runs fn in a read-only transaction on one consistent snapshot, which holds
// only durable commits. fn's error is returned unchanged.
func (db *DB) View(fn func(storage.Txn) error) error {
	btx := db.bdb.NewTransaction(false)
	defer btx.Discard()
	// Every commit the snapshot can see took its ticket before the snapshot began.
	if err := db.sync.visible(); err != nil {
		return err
	}
	return fn(txn{btx: btx})
}

// Update runs fn in a read-write transaction and commits it. If the commit
// conflicts with a concurrent one, fn runs again on a fresh transaction, so fn
// must be safe to re-run. After 2 s, or once ctx is done, Update gives up with an
// error wrapping storage.ErrLocked (and ctx's error, if that was the cause). An error from
// fn discards the transaction and is returned unchanged. A nil return means the
// commit is on disk.
func (db *DB) Update(ctx context.Context, fn func(storage.Txn) error) error {
	if db.readOnly {
		return errReadOnly
	}
	deadline := time.Now().Add(lockWait)
	backoff := firstBackoff
	for attempt := 1; ; attempt++ {
		conflicted, err := db.tryUpdate(fn)
		if !conflicted {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %d attempts conflicted over %v", storage.ErrLocked, attempt, lockWait)
		}
		db.conflicts.Add(1)
		if err := sleep(ctx, rand.N(backoff)+backoff/2); err != nil {
			return fmt.Errorf("%w: %d attempts conflicted: %w", storage.ErrLocked, attempt, err)
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// tryUpdate is one attempt. It commits by hand, unlike badger's Update, so that
// only a conflict at commit is retried, never an error of fn's.
func (db *DB) tryUpdate(fn func(storage.Txn) error) (conflicted bool, err error) {
	btx := db.bdb.NewTransaction(true)
	defer btx.Discard()
	var wroteValueLog bool
	if err := fn(txn{btx: btx, wroteValueLog: &wroteValueLog}); err != nil {
		// fn decided on what it read, which must be durable before anyone acts on the decision.
		if syncErr := db.sync.visible(); syncErr != nil {
			return false, syncErr
		}
		return false, err
	}
	ticket := db.sync.begin()
	if err := btx.Commit(); err != nil {
		db.sync.abandon(ticket)
		if errors.Is(err, badger.ErrConflict) {
			return true, err
		}
		return false, fmt.Errorf("kv: commit: %w", err)
	}
	return false, db.sync.durable(ticket, wroteValueLog)
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

// Syncs returns how many fdatasync rounds made commits durable since Open.
func (db *DB) Syncs() uint64 {
	return db.sync.rounds.Load()
}

// Conflicts returns how many times Update retried because of a conflict since Open.
func (db *DB) Conflicts() uint64 {
	return db.conflicts.Load()
}
