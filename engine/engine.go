// Package engine is cockpitfs's domain: coordination records and their invariants, claims, port
// leases, holder liveness and drains, each operation one compare-and-swap transaction on the
// store. It knows nothing of FUSE or errno; refusals are values the adapter maps.
package engine

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
)

// Store is what the engine needs of a store (the contract is storage's package comment).
type Store = storage.Store

// Engine applies operations to one store. It is safe for concurrent use.
type Engine struct {
	db       Store
	now      func() time.Time
	locks    keyedLocks
	changes  notifier
	records  recordCache
	cockpits cockpitCache
	// staged holds the record the transaction under way on a stack wrote, keyed by the stack's
	// lock key (held by that transaction), so the cache takes it once the commit succeeds.
	staged sync.Map
}

// New returns an engine over db.
func New(db Store) *Engine {
	return &Engine{db: db, now: time.Now}
}

// Changed returns a channel closed at the next committed change of the stack.
func (e *Engine) Changed(cockpit, stack string) <-chan struct{} {
	return e.changes.next(stackKey(cockpit, stack))
}

// Wait blocks until the stack's revision differs from seen and returns it, or until ctx ends.
func (e *Engine) Wait(ctx context.Context, cockpit, stack string, seen int64) (int64, error) {
	for {
		changed := e.Changed(cockpit, stack)
		r, err := e.Stack(cockpit, stack)
		if err != nil {
			return 0, err
		}
		if r.Revision != seen {
			return r.Revision, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// CockpitInfo is a cockpit as the tree shows it.
type CockpitInfo struct {
	Name      string
	UID       uint32
	CreatedAt string
	UpdatedAt string
	Config    string
}

func (m cockpitMeta) info() CockpitInfo {
	return CockpitInfo{Name: m.Name, UID: m.UID, CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt, Config: m.Config}
}

// Cockpits lists every cockpit, by name.
func (e *Engine) Cockpits() ([]CockpitInfo, error) {
	var out []CockpitInfo
	err := e.db.View(func(tx storage.Txn) error {
		return tx.Scan("c/", func(_ string, v []byte) error {
			var m cockpitMeta
			if err := jsonUnmarshal(v, &m); err != nil {
				return err
			}
			out = append(out, m.info())
			return nil
		})
	})
	return out, err
}

// Cockpit returns one cockpit.
func (e *Engine) Cockpit(name string) (CockpitInfo, error) {
	key := cockpitKey(name)
	if m, ok := e.cockpits.current(key); ok {
		return m.info(), nil
	}
	at := e.cockpits.since()
	var m cockpitMeta
	var raw []byte
	err := e.db.View(func(tx storage.Txn) (err error) {
		m, raw, err = e.readCockpit(tx, name)
		return err
	})
	if err == nil {
		e.cockpits.read(key, raw, at)
	}
	return m.info(), err
}

// Stacks lists a cockpit's stack names in order.
func (e *Engine) Stacks(cockpit string) ([]string, error) {
	var out []string
	err := e.db.View(func(tx storage.Txn) error {
		if _, err := e.loadCockpit(tx, cockpit); err != nil {
			return err
		}
		return tx.Scan(stacksPrefix(cockpit), func(k string, _ []byte) error {
			_, stack := splitStackKey(k)
			out = append(out, stack)
			return nil
		})
	})
	return out, err
}

// Stack returns the stack's record.
// The record is shared with other readers: treat it as read-only.
func (e *Engine) Stack(cockpit, stack string) (Record, error) {
	key := stackKey(cockpit, stack)
	r, gen, ok := e.records.get(key)
	if ok {
		return r, nil
	}
	var read cachedRecord
	err := e.db.View(func(tx storage.Txn) (err error) {
		read, err = e.readRecord(tx, cockpit, stack)
		return err
	})
	if err == nil {
		e.records.put(key, read, gen)
	}
	return read.Record, err
}

// Ports lists every port of every active lease on the machine, in port order.
func (e *Engine) Ports() ([]PortOwner, error) {
	var out []PortOwner
	err := e.db.View(func(tx storage.Txn) error {
		return tx.Scan(portsPrefix, func(_ string, v []byte) error {
			var o PortOwner
			if err := jsonUnmarshal(v, &o); err != nil {
				return err
			}
			out = append(out, o)
			return nil
		})
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out, err
}

// Events returns the events lines of a stack, or of the cockpit itself when stack is "".
func (e *Engine) Events(cockpit, stack string) ([]byte, error) {
	if stack == "" {
		stack = cockpitLevel
	}
	var out []byte
	err := e.db.View(func(tx storage.Txn) (err error) {
		out, err = readEvents(tx, cockpit, stack)
		return err
	})
	return out, err
}

// LogRefusal records a refused operation in the events file of the stack, or of the cockpit when
// stack is "" or no longer exists (the nearest one), errno named by the adapter that chose it. A
// cockpit that does not exist has no events file, and then nothing is recorded.
func (e *Engine) LogRefusal(c Caller, cockpit, stack string, r *Refusal, errno string) error {
	key := cockpitKey(cockpit)
	if stack != "" {
		key = stackKey(cockpit, stack)
	}
	return e.update(context.Background(), key, func(tx storage.Txn, now time.Time) error {
		level := stack
		if stack == "" || !exists(tx, stackKey(cockpit, stack)) {
			level = cockpitLevel
		}
		if !exists(tx, cockpitKey(cockpit)) {
			return errUnchanged
		}
		return appendEvent(tx, cockpit, level, Event{
			At: Stamp(now), Op: c.Op, Path: c.Path, PID: c.PID, UID: c.UID, Result: "refused",
			Code: r.Code, Errno: errno, Message: r.Message, Fix: r.Fix,
		})
	})
}

// exists reads key with Get, so the transaction conflicts with its creation or removal.
func exists(tx storage.Txn, key string) bool {
	_, err := tx.Get(key)
	return err == nil
}
