// Package storage is the contract between the engine and a durable store: the transaction a
// file operation runs in, the errors a backend reports, and what a backend must guarantee.
// kv (badger, the default) implements it; any other backend implements the same interface and
// passes the same conformance suite (storage/storagetest).
//
// What a backend must keep:
//
//   - Serializable read-compare-write. Update runs fn against one snapshot and commits its writes
//     only if no key fn read with Get, or that a Scan returned, was changed by another commit since
//     the snapshot; otherwise fn runs again on a fresh snapshot (fn must be safe to re-run). Scan
//     need not protect against phantoms: a key inserted under a scanned prefix may cause no
//     conflict, so a decision that depends on a key's absence Gets that key.
//   - Durable before acknowledgement. Update returns nil only once the commit survives a crash of
//     the process and of the machine; View sees only such commits.
//   - Bounded waiting. Update gives up with an error wrapping ErrLocked once conflicts have kept
//     it from committing for its budget, or once ctx is done.
//   - Errors of fn are returned unchanged, and nothing fn wrote is applied.
//
// The engine caches decoded records and wakes waiters on its own commits. That is correct only
// while this process is the only writer of the store (badger: the data directory's flock). A
// backend that other processes write too implements Shared, and the engine then reads through
// its caches and wakes its waiters from Watch.
package storage

import (
	"context"
	"errors"
	"time"
)

// Budget is how long an operation may wait — for its stack, its lock and the store's conflicts
// together — before it is refused with STATE_LOCKED (SPEC): the engine's bound on one operation,
// and a backend's bound on Update's retries and on any call waiting for its server.
const Budget = 2 * time.Second

// ErrNotFound is returned (unwrapped) by Txn.Get for a missing key.
var ErrNotFound = errors.New("storage: key not found")

// ErrLocked means Update could not commit because concurrent transactions kept conflicting with
// it until its deadline. The engine reports it as STATE_LOCKED.
var ErrLocked = errors.New("storage: contention did not clear")

// ErrCorrupt means the store's files are damaged: a read met a failed checksum, or Open found
// damage it would otherwise have repaired by discarding data. Nothing is served from a damaged
// record; the fs adapter answers EIO.
var ErrCorrupt = errors.New("storage: the store is damaged")

// ErrNoSpace means Update refused to commit because the store's disk is (nearly) full. Nothing
// was written; reads go on, and writes succeed again once space returns. The fs adapter answers
// ENOSPC.
var ErrNoSpace = errors.New("storage: no space left for the store")

// Txn is what a transaction function sees.
type Txn interface {
	// Get returns a copy of the value, safe to keep after the transaction, or ErrNotFound. In
	// Update it records the read, so a concurrent commit to key makes this transaction conflict
	// and retry.
	Get(key string) ([]byte, error)
	Set(key string, value []byte) error
	Delete(key string) error
	// Scan calls fn for each key starting with prefix, in ascending key order, with a copy of its
	// value. fn returning an error stops the scan and Scan returns that error. Scan does NOT
	// protect against phantoms (see the package comment).
	Scan(prefix string, fn func(key string, value []byte) error) error
}

// Store is a durable, transactional key-value store.
type Store interface {
	// View runs fn in a read-only transaction on one consistent snapshot of durable commits.
	// fn's error is returned unchanged.
	View(fn func(Txn) error) error
	// Update runs fn in a read-write transaction and commits it (see the package comment).
	Update(ctx context.Context, fn func(Txn) error) error
	// Commit is Update returning once the commit is made, before it is durable: a later Update's
	// fn sees its writes, View does not until they are durable. durable returns what Update would
	// have (nil: on disk) and must be called, and soon, since Views wait for the commit. When err
	// is not nil nothing was committed and durable is nil. It lets a writer release its own locks
	// while the sync is under way, so that writers queued behind it share that sync.
	Commit(ctx context.Context, fn func(Txn) error) (durable func() error, err error)
}

// Shared is implemented by a Store that other processes write too (etcd: the daemons of other
// machines mounting the same prefix).
type Shared interface {
	Store
	// Watch calls fn, from another goroutine, with the key of every change under prefix committed
	// after Watch returns, by any writer, until the store closes. fn("") means changes may have
	// been missed (a lost connection, a compacted history): treat every key as changed.
	Watch(prefix string, fn func(key string)) error
	// Recent runs fn, read-only like View, on the latest snapshot this process already holds,
	// without asking the store: it may miss the latest commits of other processes, and of this
	// one. It serves hints only, such as what to observe before an Update, which reads again
	// whatever it decides on. fn may run again, on View's snapshot, when a read it made could
	// not be served at the snapshot it holds (a withheld value that history no longer has).
	Recent(fn func(Txn) error) error
	// Withhold has the store keep in memory no value of a key keep refuses: keys outside the
	// caller's layout, which it never reads, so what others put under the prefix costs this
	// process their keys alone. Reads are unchanged: one that meets such a key reads its value
	// from the store.
	Withhold(keep func(key string) bool)
	// Announce keeps key in the store while this process keeps renewing it: the store deletes it
	// once the process has not renewed it for ttl (killed, its machine down, cut off from the
	// store), and the process writes it again if it reaches the store after that.
	Announce(key string, ttl time.Duration) error
	// Prove makes sure key, announced by this process, stays in the store for at least ttl/2
	// more: unless a renewal sent within the last ttl/2 (by a clock that runs through a suspend)
	// proves it, it renews it now, and writes it again if it was lost (this process was paused or
	// cut off past ttl). An error wraps ErrLocked: the store did not answer.
	Prove(key string) error
}
