package engine

import (
	"errors"
	"slices"
	"sort"
	"sync"

	"github.com/cockpitfs/cockpitfs/storage"
)

// portKeeper is the machine's port index (p/) kept from commits, as health's inventory keeps the
// records: read whole at the first read of ports, then only the entries a stack's commits since
// may have changed. Only a stack's commit changes the index (reindexLease), and only the entries
// of the ports its lease had and has; so for each stack committed since the last read, the
// entries of the ports the keeper gave it and of its record's lease now are read again. `ls -l
// ports` then costs a map lookup per entry, not a read through the store's tables, however many
// ports are leased. Over a shared store other daemons' commits mark nothing here: every read
// reads the store, as before.
type portKeeper struct {
	// the stack keys committed since the last read took them
	staleStacks
	// mu orders reads of the index: each takes the stale keys and reads them in one View. It
	// guards the fields below and is held across that View (LOCK ORDERING 3).
	mu     sync.Mutex
	loaded bool
	owners map[int]keptPort
	stacks map[string]*keptStack // by stack key: each stack owners gives a port
	names  map[string]*keptName  // the leases' names for ports, each kept once
}

// keptPort, keptStack and keptName hold an entry in about half a PortOwner's bytes: its stack's
// names once per stack, its own name once while any lease uses it (10,000 stacks of eight ports:
// 7 MiB of heap, where PortOwners took 13).
type keptPort struct {
	stack  *keptStack
	key    *keptName
	offset int
}

type keptStack struct {
	cockpit, stack string
	ports          []int
}

type keptName struct {
	name string
	uses int // the entries that name their port so
}

func (p keptPort) owner(port int) PortOwner {
	return PortOwner{Port: port, Cockpit: p.stack.cockpit, Stack: p.stack.stack, Key: p.key.name, Offset: p.offset}
}

// Ports lists every port of every active lease on the machine, in port order.
func (e *Engine) Ports() ([]PortOwner, error) {
	var out []PortOwner
	var err error
	if e.shared {
		err = e.db.View(func(tx storage.Txn) error {
			return tx.Scan(portsPrefix, func(key string, v []byte) error {
				port, ok := portOfKey(key)
				if !ok {
					return nil // a key outside the layout: verify names it
				}
				var o PortOwner
				if err := decodeJSON(key, v, &o); err != nil || o.Port != port {
					// Damaged (a shared store's values are anyone's input): listed by its
					// key's port alone, whose own read says what is wrong, so one entry hides
					// no other port from the listing.
					o = PortOwner{Port: port}
				}
				out = append(out, o)
				return nil
			})
		})
	} else {
		err = e.portIndex(func(owners map[int]keptPort) {
			out = make([]PortOwner, 0, len(owners))
			for port, p := range owners {
				out = append(out, p.owner(port))
			}
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out, err
}

// PortOwner is the lease holding port, as the port index gives it.
func (e *Engine) PortOwner(port int) (owner PortOwner, ok bool, err error) {
	if e.shared { // one read by its key, whatever the number of leased ports
		err = e.db.View(func(tx storage.Txn) error {
			ok, err = getJSON(tx, portKey(port), &owner)
			return err
		})
		return owner, ok, err
	}
	err = e.portIndex(func(owners map[int]keptPort) {
		var p keptPort
		if p, ok = owners[port]; ok {
			owner = p.owner(port)
		}
	})
	return owner, ok, err
}

// portIndex calls fn with the port index as the store holds it, kept (not over a shared store);
// fn must not keep the map.
func (e *Engine) portIndex(fn func(owners map[int]keptPort)) error {
	k := &e.ports
	k.mu.Lock()
	defer k.mu.Unlock()
	stale := k.stale.take()
	if !k.loaded || len(stale) > 0 {
		err := e.db.View(func(tx storage.Txn) error {
			if !k.loaded {
				return k.load(tx)
			}
			for key := range stale {
				if err := k.refresh(e, tx, key); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			for key := range stale { // read again next time: this View may have applied only some
				k.stale.mark(key)
			}
			return err
		}
	}
	fn(k.owners)
	return nil
}

// load reads the whole index.
func (k *portKeeper) load(tx storage.Txn) error {
	k.loaded = false
	k.owners, k.stacks, k.names = map[int]keptPort{}, map[string]*keptStack{}, map[string]*keptName{}
	if err := tx.Scan(portsPrefix, func(key string, v []byte) error {
		var o PortOwner
		if err := decodeJSON(key, v, &o); err != nil {
			return err
		}
		k.set(o.Port, o, true)
		return nil
	}); err != nil {
		return err
	}
	k.loaded = true
	return nil
}

// refresh reads again the entries of the ports the stack under key had and has: those the keeper
// gives it, and those of its record's active lease.
func (k *portKeeper) refresh(e *Engine, tx storage.Txn, key string) error {
	var ports []int
	if s, ok := k.stacks[key]; ok {
		ports = slices.Clone(s.ports)
	}
	head, err := tx.Get(key)
	switch {
	case errors.Is(err, storage.ErrNotFound):
	case err != nil:
		return err
	default:
		r, ok := e.records.decoded(key, head)
		if !ok {
			if r.Record, err = decodeHead(head); err != nil && !isMalformed(err) {
				return err
			}
		}
		// A record that does not decode changed nothing of the index: no commit saves one.
		if err == nil && r.Value.Lease.Active() {
			for _, port := range r.Value.Lease.Ports {
				ports = append(ports, port)
			}
		}
	}
	for _, port := range ports {
		var o PortOwner
		found, err := getJSON(tx, portKey(port), &o)
		if err != nil {
			return err
		}
		k.set(port, o, found)
	}
	return nil
}

// set gives port to o, or to no stack when !found.
func (k *portKeeper) set(port int, o PortOwner, found bool) {
	if old, ok := k.owners[port]; ok {
		s := old.stack
		if s.ports = slices.DeleteFunc(s.ports, func(p int) bool { return p == port }); len(s.ports) == 0 {
			delete(k.stacks, stackKey(s.cockpit, s.stack))
		}
		if old.key.uses--; old.key.uses == 0 {
			delete(k.names, old.key.name)
		}
		delete(k.owners, port)
	}
	if !found {
		return
	}
	key := stackKey(o.Cockpit, o.Stack)
	s, ok := k.stacks[key]
	if !ok {
		s = &keptStack{cockpit: o.Cockpit, stack: o.Stack}
		k.stacks[key] = s
	}
	s.ports = append(s.ports, port)
	name, ok := k.names[o.Key]
	if !ok {
		name = &keptName{name: o.Key}
		k.names[o.Key] = name
	}
	name.uses++
	k.owners[port] = keptPort{stack: s, key: name, offset: o.Offset}
}
