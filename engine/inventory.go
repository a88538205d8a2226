package engine

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/cockpitfs/cockpitfs/storage"
)

// inventory is what health observes of every record on the machine (the seeds' inventories): per
// stack, whether its record decodes and keeps its invariants, and its active lease's ports. It is
// read from the store once, at the first health read, then kept: every commit marks its stack
// stale before it is acknowledged (staleKeys), and the next health read reads the stale stacks
// again, so a health read costs the stacks changed since the last one, not every stack on the
// machine. A shared store (storage.Shared) is read whole at every health read.
type inventory struct {
	// mu orders health reads: each takes the stale stacks and reads them in one View, so no read
	// stores an entry older than one another read stored. It guards the fields up to stale and
	// is held across that whole View (LOCK ORDERING 3).
	mu       sync.Mutex
	loaded   bool
	stacks   map[string]inventoryEntry    // stack key → entry
	cockpits map[string]map[string]bool   // cockpit → its stack keys
	owners   map[int]map[string]string    // port → stack key → the lease's name for the port
	unsound  map[string]map[string]string // cockpit → stack key → why its record is unsound
	shared   map[int]bool                 // ports in more than one active lease

	// the stack keys committed since the last health read took them
	staleStacks
}

type inventoryEntry struct {
	cockpit string
	problem string         // why the record is unsound; "" when sound
	ports   map[string]int // its active lease's ports; nil without one (or when unsound)
}

// observeInventory runs fn in a View with cockpit's health inventory, reading first the stacks
// that changed (taken before the View begins: see staleKeys.take).
func (e *Engine) observeInventory(cockpit string, fn func(tx storage.Txn, inv healthInventory) error) error {
	inv := &e.inventory
	inv.mu.Lock()
	defer inv.mu.Unlock()
	stale := inv.stale.take()
	refreshed := false
	err := e.db.View(func(tx storage.Txn) error {
		if err := e.refreshInventory(tx, stale); err != nil {
			return err
		}
		refreshed = true
		return fn(tx, inv.of(cockpit))
	})
	if !refreshed {
		// Read them again next time: this View may have applied only some.
		for key := range stale {
			inv.stale.mark(key)
		}
	}
	return err
}

func (e *Engine) refreshInventory(tx storage.Txn, stale map[string]bool) error {
	inv := &e.inventory
	// Other processes' commits mark nothing stale here: with a shared store, read everything.
	if _, shared := e.db.(storage.Shared); shared || !inv.loaded {
		return e.loadInventory(tx)
	}
	for key := range stale {
		raw, err := tx.Get(key)
		switch {
		case errors.Is(err, storage.ErrNotFound):
			inv.remove(key)
		case err != nil:
			return err
		default:
			entry, err := e.inventoryEntry(tx, key, raw)
			if err != nil {
				return err
			}
			inv.set(key, entry)
		}
	}
	return nil
}

// loadInventory reads every record on the machine (the first health read's cost).
func (e *Engine) loadInventory(tx storage.Txn) error {
	inv := &e.inventory
	inv.stacks = map[string]inventoryEntry{}
	inv.cockpits = map[string]map[string]bool{}
	inv.owners = map[int]map[string]string{}
	inv.unsound = map[string]map[string]string{}
	inv.shared = map[int]bool{}
	heads := map[string][]byte{}
	if err := tx.Scan(allStacksPrefix, func(key string, raw []byte) error {
		heads[key] = raw
		return nil
	}); err != nil {
		return err
	}
	records, failed, err := assembleRecords(tx, allHoldersPrefix, heads)
	if err != nil {
		return err
	}
	for key := range heads {
		inv.set(key, inventoryEntryOf(key, records[key], failed[key]))
	}
	inv.loaded = true
	return nil
}

// inventoryEntry observes the record whose head is raw; an error is the store's, not the record's.
func (e *Engine) inventoryEntry(tx storage.Txn, key string, raw []byte) (inventoryEntry, error) {
	r, err := e.recordOf(tx, key, raw)
	if err != nil && !isMalformed(err) {
		return inventoryEntry{}, err
	}
	return inventoryEntryOf(key, r, err), nil
}

// inventoryEntryOf observes r, key's record, or why it could not be read (err).
func inventoryEntryOf(key string, r cachedRecord, err error) inventoryEntry {
	cockpit, _ := splitStackKey(key)
	if err == nil && !r.checked { // checked: these bytes passed checkRecord when this engine wrote them
		err = checkRecord(r.Record)
	}
	entry := inventoryEntry{cockpit: cockpit}
	switch {
	case err != nil:
		entry.problem = strings.ReplaceAll(err.Error(), "\n", "; ")
	case r.Value.Lease.Active():
		entry.ports = r.Value.Lease.Ports
	}
	return entry
}

func (inv *inventory) set(key string, entry inventoryEntry) {
	inv.remove(key)
	inv.stacks[key] = entry
	addTo(inv.cockpits, entry.cockpit, key, true)
	if entry.problem != "" {
		addTo(inv.unsound, entry.cockpit, key, entry.problem)
	}
	for name, port := range entry.ports {
		addTo(inv.owners, port, key, name)
		if len(inv.owners[port]) > 1 {
			inv.shared[port] = true
		}
	}
}

func (inv *inventory) remove(key string) {
	entry, ok := inv.stacks[key]
	if !ok {
		return
	}
	delete(inv.stacks, key)
	removeFrom(inv.cockpits, entry.cockpit, key)
	removeFrom(inv.unsound, entry.cockpit, key)
	for _, port := range entry.ports {
		removeFrom(inv.owners, port, key)
		if len(inv.owners[port]) < 2 {
			delete(inv.shared, port)
		}
	}
}

func addTo[K comparable, V any](m map[K]map[string]V, outer K, key string, v V) {
	if m[outer] == nil {
		m[outer] = map[string]V{}
	}
	m[outer][key] = v
}

func removeFrom[K comparable, V any](m map[K]map[string]V, outer K, key string) {
	delete(m[outer], key)
	if len(m[outer]) == 0 {
		delete(m, outer)
	}
}

// of is cockpit's health inventory as a scan of every record in key order finds it: the cockpit's
// first unsound record, or too many stacks; and every port two active leases share, named by its
// first holder in key order and each later one, in the order the later ones come.
func (inv *inventory) of(cockpit string) healthInventory {
	var out healthInventory
	if keys := sortedKeys(inv.unsound[cockpit]); len(keys) > 0 {
		_, stack := splitStackKey(keys[0])
		out.unsound = fmt.Sprintf("%s/%s: %s", cockpit, stack, inv.unsound[cockpit][keys[0]])
	} else if n := len(inv.cockpits[cockpit]); n > MaxStacks {
		out.unsound = fmt.Sprintf("cockpit %s has %d stacks, more than the %d its inventory reads", cockpit, n, MaxStacks)
	}
	type collision struct{ key, name, text string }
	var collisions []collision
	for port := range inv.shared {
		holders := inv.owners[port]
		keys := sortedKeys(holders)
		first := keys[0]
		firstCockpit, firstStack := splitStackKey(first)
		for _, later := range keys[1:] {
			c, s := splitStackKey(later)
			collisions = append(collisions, collision{later, holders[later],
				fmt.Sprintf("port %d (%s) is leased by %s/%s and %s/%s", port, holders[first], firstCockpit, firstStack, c, s)})
		}
	}
	sort.Slice(collisions, func(i, j int) bool {
		a, b := collisions[i], collisions[j]
		return a.key < b.key || a.key == b.key && a.name < b.name
	})
	texts := make([]string, len(collisions))
	for i, c := range collisions {
		texts[i] = c.text
	}
	out.collision = strings.Join(texts, "; ")
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
