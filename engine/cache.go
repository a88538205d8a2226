package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
)

// recordCache keeps decoded records for reads, so the tree renders a file without decoding the
// record again for every lookup, stat and open, and a transaction that reads the same bytes the
// cache holds need not decode them either. A commit drops its stack's entry before it writes
// anything, serves no reader from the cache until it is durable (the store may let other readers
// see it before its committer returns: a sync round another committer leads, a backend durable at
// commit), and then puts back the record it wrote; a generation per key keeps a read that raced a
// commit, or a commit overtaken by the next one on its way to disk, from storing an older record.
//
// Generations come from one counter, so a removed stack's key can be forgotten altogether (a
// thousand stacks made and removed leave nothing behind): a key without a generation has the
// counter's value at the last removal, which no read begun before that removal holds.
type recordCache struct {
	mu      sync.Mutex // guards every field below; a leaf
	counter uint64
	floor   uint64 // the generation of every key not in gen
	gen     map[string]uint64
	m       map[string]cachedRecord
	// committing counts each key's commits between begin and done: readers are served from the
	// store meanwhile.
	committing map[string]int
	// latest holds each key's last committed record, durable or not: only transactions, which
	// compare its bytes with what they read, use it.
	latest map[string]cachedRecord
}

// cachedRecord is a record and the bytes of its head it was decoded from (or encoded to).
type cachedRecord struct {
	Record
	raw    []byte
	stored storedHolders
	// checked: the record passed checkRecord when this engine saved it (or health read it), so a
	// commit that follows it checks only the holders it changes.
	checked bool
}

func (c *recordCache) get(key string) (Record, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	return e.Record, c.generation(key), ok && c.committing[key] == 0
}

// generation is key's generation; mu is held.
func (c *recordCache) generation(key string) uint64 {
	if g, ok := c.gen[key]; ok {
		return g
	}
	return c.floor
}

// committed returns key's last committed record, durable or not, if this engine knows it: a hint
// only (see recentStack), never what a reader is shown.
func (c *recordCache) committed(key string) (Record, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.latest[key]
	return e.Record, ok
}

// decoded returns the record of key cached as read with exactly raw as its head.
func (c *recordCache) decoded(key string, raw []byte) (cachedRecord, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range []cachedRecord{c.latest[key], c.m[key]} {
		if e.raw != nil && bytes.Equal(e.raw, raw) {
			return e, true
		}
	}
	return cachedRecord{}, false
}

// put stores r, read as raw at generation gen, unless a commit invalidated key since.
func (c *recordCache) put(key string, r cachedRecord, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.committing[key] == 0 {
		c.store(key, r, gen)
	}
}

// store keeps r as key's entry unless a commit invalidated key since gen; mu is held.
func (c *recordCache) store(key string, r cachedRecord, gen uint64) {
	if c.generation(key) != gen {
		return
	}
	if c.m == nil {
		c.m = map[string]cachedRecord{}
	}
	c.m[key] = r
}

// commitBegins marks a commit on key about to write, before anything it writes can be read.
func (c *recordCache) commitBegins(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.committing == nil {
		c.committing = map[string]int{}
	}
	c.committing[key]++
	c.bump(key)
}

// commitOrdered drops key's entry for readers and keeps the commit's record for transactions.
func (c *recordCache) commitOrdered(key string, o *commitOutcome) {
	o.gen = c.invalidate(key, o.written)
}

// commitEnds stores the commit's record, now durable, unless a later commit invalidated key since.
func (c *recordCache) commitEnds(key string, o *commitOutcome) { c.done(key, o.written, o.gen) }

// done ends a commit begun on key: written (nil: none, or it failed) is the record it wrote, now
// durable, stored unless a later commit invalidated key since the commit's own invalidate
// returned gen.
func (c *recordCache) done(key string, written *cachedRecord, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.committing[key]--
	if c.committing[key] <= 0 {
		delete(c.committing, key)
	}
	if written != nil {
		c.store(key, *written, gen)
	}
}

// invalidate drops key's entry for readers, keeps written (nil: unknown) as its latest commit for
// transactions, and returns the new generation.
func (c *recordCache) invalidate(key string, written *cachedRecord) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bump(key)
	delete(c.latest, key)
	if written != nil {
		c.latest[key] = *written
	}
	return c.counter
}

// bump gives key a new generation and drops its entry for readers; mu is held.
func (c *recordCache) bump(key string) {
	if c.gen == nil {
		c.gen = map[string]uint64{}
		c.latest = map[string]cachedRecord{}
	}
	c.counter++
	c.gen[key] = c.counter
	delete(c.m, key)
}

// forget drops every trace of key, a stack that was removed; a read begun before is not stored.
func (c *recordCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counter++
	c.floor = c.counter
	delete(c.gen, key)
	delete(c.m, key)
	delete(c.latest, key)
}

// drop forgets key's record, read or committed, so the next read assembles it from the store: a
// shared store's holder key changed by a commit that left the head as it was (a third party's
// delete), where head bytes seen before no longer name the same holders.
func (c *recordCache) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bump(key)
	delete(c.latest, key)
}

// dropAll is drop of every key: a shared store's watch may have missed changes.
func (c *recordCache) dropAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counter++
	c.floor = c.counter
	c.gen, c.m, c.latest = nil, nil, nil
}

// cockpitCache keeps each cockpit's metadata decoded, with the bytes it came from: every file
// rendered asks for its cockpit's owner, and reading and decoding it each time cost more than the
// rest of an open. A transaction, which must read the bytes anyway, skips only the decode when
// they are the bytes cached. A read outside a transaction is served from the cache while no
// commit has begun since the entry was read with none under way: any commit counts, since
// cockpits change rarely and a stack's mkdir or rmdir changes its cockpit too, and it counts from
// before it writes, since the store may let readers see it before its committer is back.
//
// A removed cockpit's key stays marked gone until a cockpit of that name is made again: a read
// whose snapshot is older than the removal decodes the cockpit after the removal forgot it, and
// would keep it for good, since nothing reads a removed cockpit again (a listing of the root beside
// 3,000 churned cockpits of 60 KB configs kept 180 of them, 21 MiB). The newest goneKept marks
// are kept: a read still running after goneKept removals since its own began (each a durable
// commit) could keep its cockpit.
type cockpitCache struct {
	mu       sync.Mutex // guards every field below; a leaf
	commits  uint64     // every commit bumps it as it begins and as it ends
	underway int
	m        map[string]cachedCockpit
	gone     map[string]uint64 // key → the removal's turn in goneOrder
	// goneOrder is the keys marked gone, oldest first, with their turns (an entry whose key was
	// made again or marked anew since is skipped).
	goneOrder []goneMark
	removals  uint64
}

// goneKept is how many removed cockpits' marks the cache keeps.
const goneKept = 4096

type goneMark struct {
	key  string
	turn uint64
}

type cachedCockpit struct {
	cockpitMeta
	raw []byte
	// current: read by a View at commits == readAt, so it is the cockpit until the next commit.
	current bool
	readAt  uint64
}

// decode returns raw, key's value, decoded. The Declared it shares must not be modified.
func (c *cockpitCache) decode(key string, raw []byte) (cockpitMeta, error) {
	c.mu.Lock()
	e, ok := c.m[key]
	c.mu.Unlock()
	if ok && bytes.Equal(e.raw, raw) {
		return e.cockpitMeta, nil
	}
	var m cockpitMeta
	if err := json.Unmarshal(raw, &m); err != nil {
		return m, fmt.Errorf("decode %s: %w", key, malformedValue{err})
	}
	if name := key[len(cockpitsPrefix):]; m.Name != name {
		// A shared store's values are anyone's input: served, it would show another cockpit's
		// name, or none, under this one.
		return cockpitMeta{}, fmt.Errorf("decode %s: %w", key, malformedValue{fmt.Errorf("it names cockpit %q", m.Name)})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, gone := c.gone[key]; gone {
		return m, nil
	}
	if c.m == nil {
		c.m = map[string]cachedCockpit{}
	}
	c.m[key] = cachedCockpit{cockpitMeta: m, raw: raw}
	return m, nil
}

// listed is key's cockpit as a listing of every cockpit shows it: ok is false for a key no cockpit
// may have (verify names it); damage is why a value does not decode or names another cockpit,
// and m then holds the key's name alone, so that one damaged cockpit hides no other.
func (c *cockpitCache) listed(key string, raw []byte) (m cockpitMeta, damage error, ok bool) {
	name := key[len(cockpitsPrefix):]
	if !ValidCockpitName(name) {
		return m, nil, false
	}
	if m, damage = c.decode(key, raw); damage != nil {
		return cockpitMeta{Name: name}, damage, true
	}
	return m, nil, true
}

// current returns key's cockpit if no commit happened since it was read.
func (c *cockpitCache) current(key string) (cockpitMeta, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	return e.cockpitMeta, ok && e.current && e.readAt == c.commits
}

// since returns the commit count to pass to read.
func (c *cockpitCache) since() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.commits
}

// read marks key's entry current if it holds raw, the bytes a View begun after since returned at
// read, and no commit began meanwhile or was under way. (A transaction may have decoded other
// bytes since: ones not yet acknowledged, or its own uncommitted write.)
func (c *cockpitCache) read(key string, raw []byte, at uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[key]; ok && at == c.commits && c.underway == 0 && bytes.Equal(e.raw, raw) {
		e.current, e.readAt = true, at
		c.m[key] = e
	}
}

// begin and end bracket a commit (or a refusal's events line): each ends every entry's currency.
func (c *cockpitCache) begin() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commits++
	c.underway++
}

func (c *cockpitCache) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commits++
	c.underway--
}

func (c *cockpitCache) commitBegins(string)                  { c.begin() }
func (c *cockpitCache) commitOrdered(string, *commitOutcome) {}
func (c *cockpitCache) commitEnds(string, *commitOutcome)    { c.end() }

// forget drops key's entry: a read found the cockpit missing.
func (c *cockpitCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}

// removed drops key's entry and marks it gone: the cockpit was removed.
func (c *cockpitCache) removed(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
	if c.gone == nil {
		c.gone = map[string]uint64{}
	}
	c.removals++
	c.gone[key] = c.removals
	c.goneOrder = append(c.goneOrder, goneMark{key, c.removals})
	if len(c.goneOrder) > goneKept {
		if oldest := c.goneOrder[0]; c.gone[oldest.key] == oldest.turn {
			delete(c.gone, oldest.key)
		}
		c.goneOrder = c.goneOrder[1:] // append reallocates as it fills: no copy per removal
	}
}

// created clears key's gone mark: a cockpit of that name was made.
func (c *cockpitCache) created(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.gone, key)
}
