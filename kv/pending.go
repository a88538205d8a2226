package kv

import (
	"sort"
	"strings"
	"sync"
)

// pending holds the writes of commits sequenced but not yet applied by badger, so that an Update
// reads them without waiting for badger: the next writer on a stack reads the commit just before
// it while badger's write goroutine is still on it. A key is in pending from its commit's
// sequencing until badger has applied it; a read at version rts takes a key's newest pending
// version up to rts, and badger's at rts for a key with none (no commit up to rts that badger
// has yet to apply wrote it).
//
// It also remembers the newest applied version of the keys written or read lately (latest), so
// that a Get of one is a map lookup instead of badger's walk of its memtables and levels, each
// table block read decoded and its checksum verified: a claim reads six keys, most of them
// written by the commit before. The newest applied version of a key is what badger holds at any
// read version at or above it, up to the key's next commit, which is pending until it is applied
// and then replaces it here (under mu, in the same step that takes it out of pending).
type pending struct {
	mu   sync.Mutex
	keys map[string][]pendingVersion // oldest first

	latest      map[string]pendingVersion
	latestBytes int
	// generation counts the times latest forgot keys. A version read from badger is remembered
	// only if nothing was forgotten since its transaction began: a newer version, committed
	// since, is then in pending or in latest, and no older one can take its place.
	generation uint64
}

type pendingVersion struct {
	ts    uint64
	value []byte
	del   bool
	// uncached marks a version too large to keep: reads at or above it go to badger.
	uncached bool
}

// Bounds of latest: past latestBudget bytes it starts again empty; a value larger than
// latestValueMax is not kept. An entry costs its key, its value's allocation and
// latestEntryCost for the map, so that deleted keys (an events file deletes a line at every
// commit) count too.
const (
	latestBudget    = 1 << 20
	latestValueMax  = 64 << 10
	latestEntryCost = 64
)

func latestCost(key string, v pendingVersion) int {
	return len(key) + cap(v.value) + latestEntryCost
}

// add records the writes of the commit of version ts; the log's mu is held, and ts is not yet
// sequenced for readers.
func (p *pending) add(ts uint64, writes []write) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keys == nil {
		p.keys = map[string][]pendingVersion{}
	}
	for _, w := range writes {
		p.keys[w.key] = append(p.keys[w.key], pendingVersion{ts: ts, value: w.value, del: w.delete})
	}
}

// applied drops the commit of version ts, which badger now holds, and every older version of its
// keys: badger applies commits in order, but their callbacks (this) may run out of order, and an
// older version left behind would be read instead of this one. Its writes become their keys'
// latest.
func (p *pending) applied(ts uint64, writes []write) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range writes {
		p.remember(w.key, pendingVersion{ts: ts, value: w.value, del: w.delete})
		versions := p.keys[w.key]
		kept := versions[:0]
		for _, v := range versions {
			if v.ts > ts {
				kept = append(kept, v)
			}
		}
		if len(kept) == 0 {
			delete(p.keys, w.key)
		} else {
			p.keys[w.key] = kept
		}
	}
}

// remember makes v key's latest unless latest holds a newer version (a later write of the key in
// the same commit, at the same version, replaces an earlier one). mu is held.
func (p *pending) remember(key string, v pendingVersion) {
	old, known := p.latest[key]
	if known && old.ts > v.ts {
		return
	}
	if len(v.value) > latestValueMax {
		v.value, v.uncached = nil, true
	}
	if known {
		p.latestBytes -= latestCost(key, old)
	}
	if p.latestBytes+latestCost(key, v) > latestBudget {
		p.latest, p.latestBytes = nil, 0
		p.generation++
	}
	if p.latest == nil {
		p.latest = map[string]pendingVersion{}
	}
	p.latest[key] = v
	p.latestBytes += latestCost(key, v)
}

// at returns key's version at read version rts when pending or latest knows it: its newest
// pending version up to rts, else its latest if that is at or below rts.
func (p *pending) at(key string, rts uint64) (pendingVersion, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	versions := p.keys[key]
	for i := len(versions) - 1; i >= 0; i-- {
		if versions[i].ts <= rts {
			return versions[i], true
		}
	}
	if v, ok := p.latest[key]; ok && v.ts <= rts && !v.uncached {
		return v, true
	}
	return pendingVersion{}, false
}

// forget empties latest, and pending's map if no commit is pending, when the store settles
// (settle.go): a map keeps the room of its busiest moment, and the next commits read badger
// once to fill latest again.
func (p *pending) forget() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latest, p.latestBytes = nil, 0
	p.generation++
	if len(p.keys) == 0 {
		p.keys = nil
	}
}

// gen is the generation of latest, taken when a transaction begins.
func (p *pending) gen() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.generation
}

// read remembers value, key's version ts as badger returned it to a transaction begun at
// generation gen: the newest version up to the transaction's read version, and (latest having
// forgotten nothing since) the newest applied one unless latest holds a newer.
func (p *pending) read(key string, ts uint64, value []byte, gen uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.generation == gen {
		p.remember(key, pendingVersion{ts: ts, value: value})
	}
}

// prefixed returns, in key order, the newest pending version up to rts of every key starting
// with prefix.
func (p *pending) prefixed(prefix string, rts uint64) ([]string, map[string]pendingVersion) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var keys []string
	var versions map[string]pendingVersion
	for key, vs := range p.keys {
		if !strings.HasPrefix(key, prefix) {
			continue
		}
		for i := len(vs) - 1; i >= 0; i-- {
			if vs[i].ts <= rts {
				if versions == nil {
					versions = map[string]pendingVersion{}
				}
				keys = append(keys, key)
				versions[key] = vs[i]
				break
			}
		}
	}
	sort.Strings(keys)
	return keys, versions
}
