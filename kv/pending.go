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
type pending struct {
	mu   sync.Mutex
	keys map[string][]pendingVersion // oldest first
}

type pendingVersion struct {
	ts    uint64
	value []byte
	del   bool
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
// older version left behind would be read instead of this one.
func (p *pending) applied(ts uint64, writes []write) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range writes {
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

// at returns key's newest pending version up to rts.
func (p *pending) at(key string, rts uint64) (pendingVersion, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	versions := p.keys[key]
	for i := len(versions) - 1; i >= 0; i-- {
		if versions[i].ts <= rts {
			return versions[i], true
		}
	}
	return pendingVersion{}, false
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
