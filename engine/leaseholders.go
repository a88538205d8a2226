package engine

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cockpitfs/cockpitfs/storage"
)

// leaseHolders says, for each port, which stacks' records hold it in an active lease, as the
// records themselves say: the port index (p/) is kept beside them, and on a shared store anyone
// may delete an entry of it by hand while the lease it indexed is active. A claim takes a port
// with no index entry as free only once the records this names for it, if any, are read (a Get
// each) and hold it no more: a missing entry never hands out a port an active lease holds.
//
// It is read whole from the records at the first claim, then kept: this daemon's commits set
// their stack's entry as they are ordered (the record they wrote), and over a shared store the
// watch marks every daemon's committed stacks stale, read again (from the store's own copy, with
// no round trip) before the next claim. A commit whose record is unknown marks its stack stale too.
type leaseHolders struct {
	stale  staleKeys   // stacks to read again
	reload atomic.Bool // the watch may have missed changes: read every record again
	// refreshing: a refresh is reading the store, and may store a record older than a commit
	// ordered meanwhile, which marks its stack stale as well.
	refreshing atomic.Bool
	// mu orders refreshes: each takes the stale stacks and reads them in one read of the store.
	// It is held across that read (LOCK ORDERING 3) and guards loaded.
	mu     sync.Mutex
	loaded bool
	// portsMu guards ports and stacks: a leaf (LOCK ORDERING 7), taken by a claim's transaction.
	portsMu sync.Mutex
	// ports: every stack, not the last one read: a second record holding a port (a copy put by
	// hand, a restored one) that goes must leave the first one holding it.
	ports  map[int][]string // port → the keys of the stacks whose active leases hold it
	stacks map[string][]int // stack key → the ports ports gives it
}

// holders are the keys of the stacks whose records last held port in an active lease.
func (l *leaseHolders) holders(port int) []string {
	l.portsMu.Lock()
	defer l.portsMu.Unlock()
	return slices.Clone(l.ports[port])
}

// set gives the stack under key the ports of lease (none when it is not active).
func (l *leaseHolders) set(key string, lease *Lease) {
	l.portsMu.Lock()
	defer l.portsMu.Unlock()
	for _, port := range l.stacks[key] {
		if keys := slices.DeleteFunc(l.ports[port], func(k string) bool { return k == key }); len(keys) > 0 {
			l.ports[port] = keys
		} else {
			delete(l.ports, port)
		}
	}
	delete(l.stacks, key)
	if !lease.Active() {
		return
	}
	if l.ports == nil {
		l.ports, l.stacks = map[int][]string{}, map[string][]int{}
	}
	ports := slices.Collect(maps.Values(lease.Ports))
	for _, port := range ports {
		l.ports[port] = append(l.ports[port], key)
	}
	l.stacks[key] = ports
}

// forgetAllBut drops every stack that keep does not name.
func (l *leaseHolders) forgetAllBut(keep map[string]bool) {
	l.portsMu.Lock()
	var gone []string
	for key := range l.stacks {
		if !keep[key] {
			gone = append(gone, key)
		}
	}
	l.portsMu.Unlock()
	for _, key := range gone {
		l.set(key, nil)
	}
}

func (l *leaseHolders) commitBegins(string) {}

// commitOrdered takes the record a stack's commit wrote, or marks the stack stale when the
// commit's record is unknown (it failed, perhaps after applying).
func (l *leaseHolders) commitOrdered(key string, o *commitOutcome) {
	if !strings.HasPrefix(key, allStacksPrefix) {
		return
	}
	if o.written != nil {
		l.set(key, o.written.Value.Lease)
	}
	if o.written == nil || l.refreshing.Load() {
		l.stale.mark(key)
	}
}

func (l *leaseHolders) commitEnds(string, *commitOutcome) {}

// refreshLeaseHolders reads the records leaseHolders must read before a claim: every one at the
// first claim or after the watch missed changes, else the stale ones. Over a shared store it
// reads the store's own copy (Recent): what it may miss is a lease committed since, whose index
// entries its commit wrote.
func (e *Engine) refreshLeaseHolders() error {
	l := &e.leaseHolders
	l.mu.Lock()
	defer l.mu.Unlock()
	stale := l.stale.take()
	reload := l.reload.Swap(false) || !l.loaded
	if !reload && len(stale) == 0 {
		return nil
	}
	l.refreshing.Store(true)
	defer l.refreshing.Store(false)
	read := e.db.View
	if shared, ok := e.db.(storage.Shared); ok {
		read = shared.Recent
	}
	err := read(func(tx storage.Txn) error {
		if reload {
			// Stack by stack, then the stacks gone: a claim's transaction may ask meanwhile,
			// and must not find the ports emptied.
			read := map[string]bool{}
			err := tx.Scan(allStacksPrefix, func(key string, head []byte) error {
				read[key] = true
				if r, err := decodeHead(head); err == nil { // damage keeps what it held, as below
					l.set(key, r.Value.Lease)
				}
				return nil
			})
			if err == nil {
				l.forgetAllBut(read)
			}
			return err
		}
		for key := range stale {
			head, err := tx.Get(key)
			switch {
			case errors.Is(err, storage.ErrNotFound):
				l.set(key, nil)
			case err != nil:
				return err
			default:
				if r, err := decodeHead(head); err == nil {
					l.set(key, r.Value.Lease)
				} // a record that no longer decodes keeps what it held: its Get says the rest
			}
		}
		return nil
	})
	if err != nil { // read again next time: this read may have applied only some
		if reload {
			l.reload.Store(true)
		}
		for key := range stale {
			l.stale.mark(key)
		}
		return err
	}
	l.loaded = true
	return nil
}
