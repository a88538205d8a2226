package engine

import "sync"

// recordCache keeps decoded records for reads, so the tree renders a file without decoding the
// record again for every lookup, stat and open. Every commit replaces (or drops) its stack's entry
// before it is acknowledged; a generation per key keeps a read that raced a commit from storing
// what it read before that commit.
type recordCache struct {
	mu  sync.Mutex
	gen map[string]uint64
	m   map[string]Record
}

func (c *recordCache) get(key string) (Record, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.m[key]
	return r, c.gen[key], ok
}

// put stores r read at generation gen, unless a commit invalidated key since.
func (c *recordCache) put(key string, r Record, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen[key] != gen {
		return
	}
	if c.m == nil {
		c.m = map[string]Record{}
	}
	c.m[key] = r
}

// fill replaces key's entry with the record a commit just wrote.
func (c *recordCache) fill(key string, r Record) {
	c.invalidate(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[key] = r
}

func (c *recordCache) invalidate(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == nil {
		c.gen = map[string]uint64{}
	}
	c.gen[key]++
	delete(c.m, key)
	if c.m == nil {
		c.m = map[string]Record{}
	}
}
