package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
)

// recordCache keeps decoded records for reads, so the tree renders a file without decoding the
// record again for every lookup, stat and open, and a transaction that reads the same bytes the
// cache holds need not decode them either. Every commit replaces (or drops) its stack's entry
// before it is acknowledged; a generation per key keeps a read that raced a commit from storing
// what it read before that commit.
type recordCache struct {
	mu  sync.Mutex
	gen map[string]uint64
	m   map[string]cachedRecord
}

// cachedRecord is a record and the bytes it was decoded from (or encoded to).
type cachedRecord struct {
	Record
	raw []byte
}

func (c *recordCache) get(key string) (Record, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	return e.Record, c.gen[key], ok
}

// decoded returns the cached record of key if it was decoded from exactly raw.
func (c *recordCache) decoded(key string, raw []byte) (Record, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || !bytes.Equal(e.raw, raw) {
		return Record{}, false
	}
	return e.Record, true
}

// put stores r, read as raw at generation gen, unless a commit invalidated key since.
func (c *recordCache) put(key string, r cachedRecord, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen[key] != gen {
		return
	}
	if c.m == nil {
		c.m = map[string]cachedRecord{}
	}
	c.m[key] = r
}

// fill replaces key's entry with the record a commit just wrote.
func (c *recordCache) fill(key string, r cachedRecord) {
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
		c.m = map[string]cachedRecord{}
	}
}

// cockpitCache keeps each cockpit's metadata decoded, with the bytes it came from: every file
// rendered asks for its cockpit's owner, and decoding the parsed declaration each time cost more
// than the rest of an open. A hit needs the very bytes read, so an entry is never stale.
type cockpitCache struct {
	mu sync.Mutex
	m  map[string]cachedCockpit
}

type cachedCockpit struct {
	cockpitMeta
	raw []byte
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
		return m, fmt.Errorf("decode %s: %w", key, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]cachedCockpit{}
	}
	c.m[key] = cachedCockpit{m, raw}
	return m, nil
}

func (c *cockpitCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}
