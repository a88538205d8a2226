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
// no round trip) before the next claim; there a commit whose record is unknown marks its stack
// stale too.
type leaseHolders struct {
	// shared: other daemons write the store too (NewShared). Over this daemon's own store nothing
	// but its own commits changes a lease, and each sets its stack here, so no stack is stale.
	shared bool
	stale  staleKeys   // stacks to read again
	reload atomic.Bool // the watch may have missed changes: read every record again
	// refreshing: a refresh is reading the store, and may read a record older than a commit
	// ordered meanwhile: that commit's stack is in wrote, which the refresh leaves as the commit
	// set it (over a shared store it is marked stale as well: the watch's mark of another
	// daemon's later commit of it may have been taken by this refresh).
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
	wrote  map[string]bool  // stacks whose commits were ordered during the refresh under way
}

// holders are the keys of the stacks whose records last held port in an active lease.
func (l *leaseHolders) holders(port int) []string {
	l.portsMu.Lock()
	defer l.portsMu.Unlock()
	return slices.Clone(l.ports[port])
}

// read is set with what a refresh read, unless a commit ordered during the refresh set it.
func (l *leaseHolders) read(key string, lease *Lease) {
	l.portsMu.Lock()
	defer l.portsMu.Unlock()
	if !l.wrote[key] {
		l.set(key, lease)
	}
}

// set gives the stack under key the ports of lease (none when it is not active); portsMu is held.
func (l *leaseHolders) set(key string, lease *Lease) {
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

// forgetAllBut drops every stack that keep does not name, but those committed during the refresh.
func (l *leaseHolders) forgetAllBut(keep map[string]bool) {
	l.portsMu.Lock()
	var gone []string
	for key := range l.stacks {
		if !keep[key] && !l.wrote[key] {
			gone = append(gone, key)
		}
	}
	l.portsMu.Unlock()
	for _, key := range gone {
		l.read(key, nil)
	}
}

func (l *leaseHolders) commitBegins(string) {}

// commitOrdered takes the record a stack's commit wrote. A commit that wrote none left the
// stack's lease as it was over this daemon's own store (a failed one applied nothing; one that
// made or removed a stack, or only logged, is of a stack with no active lease); over a shared
// store it marks the stack stale (a failed one may have applied). So over badger no claim reads
// the store for this (a read there waits for every commit under way to sync).
func (l *leaseHolders) commitOrdered(key string, o *commitOutcome) {
	if !strings.HasPrefix(key, allStacksPrefix) {
		return
	}
	refreshing := l.refreshing.Load()
	if o.written != nil {
		l.portsMu.Lock()
		l.set(key, o.written.Value.Lease)
		if refreshing {
			if l.wrote == nil {
				l.wrote = map[string]bool{}
			}
			l.wrote[key] = true
		}
		l.portsMu.Unlock()
	}
	if l.shared && (o.written == nil || refreshing) {
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
	defer func() {
		l.refreshing.Store(false)
		l.portsMu.Lock()
		l.wrote = nil
		l.portsMu.Unlock()
	}()
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
					l.read(key, r.Value.Lease)
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
				l.read(key, nil)
			case err != nil:
				return err
			default:
				if r, err := decodeHead(head); err == nil {
					l.read(key, r.Value.Lease)
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
