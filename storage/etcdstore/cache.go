package etcdstore

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// cache is the store's prefix as one watch has delivered it: every key with its value and
// ModRevision, complete through revision rev (every commit under the prefix up to rev is applied,
// none after it). It answers reads at a snapshot revision: a reader pins the revision rev had when
// it began, and the versions it may still read are kept until it is done, so a transaction reads
// one consistent snapshot however many commits arrive meanwhile.
//
// Completeness rests on etcd's watch: events come in revision order, and the server never splits
// one revision's events across responses (storage/mvcc's eventBatch adds whole revisions; a
// response is fragmented only when the watch asks for it, which this one does not). So after a
// response whose last event has revision R, every commit up to R is applied; a progress
// notification at R says the same with no events.
type cache struct {
	mu       sync.Mutex
	rev      int64
	advanced chan struct{} // closed, and replaced, when rev advances
	behind   bool          // a wait for rev to advance timed out, and it has not advanced since
	keys     []string      // sorted: every key with a version
	versions map[string][]version
	readers  map[int64]int // pinned snapshot revision → readers at it
	// superseded are keys holding a version only a pinned reader may need, or a deletion.
	superseded  map[string]bool
	subscribers []subscriber
	// keep says which keys' values the cache holds (nil: every key's); of the others it holds the
	// key and its ModRevision alone (Withhold).
	keep func(key string) bool
}

// version is a key's value from revision mod on, or its deletion at mod. withheld: the cache
// does not hold the value (keep refused the key); a read of it goes to etcd.
type version struct {
	mod      int64
	value    []byte
	deleted  bool
	withheld bool
}

type subscriber struct {
	prefix string
	fn     func(key string)
}

// change is a subscriber's call, made after the cache's lock is released.
type change struct {
	fn  func(key string)
	key string
}

func newCache() *cache {
	return &cache{
		advanced:   make(chan struct{}),
		versions:   map[string][]version{},
		readers:    map[int64]int{},
		superseded: map[string]bool{},
	}
}

// pin returns the revision the cache is complete through, if it is at least min, and keeps what
// a read at it needs until unpin.
func (c *cache) pin(min int64) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rev < min || c.rev == 0 {
		return 0, false
	}
	c.readers[c.rev]++
	return c.rev, true
}

func (c *cache) unpin(at int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.readers[at]--; c.readers[at] == 0 {
		delete(c.readers, at)
	}
	c.prune()
}

// await waits until the cache is complete through rev, for at most bound.
func (c *cache) await(ctx context.Context, rev int64, bound time.Duration) bool {
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		c.mu.Lock()
		current, advanced := c.rev, c.advanced
		c.mu.Unlock()
		if current >= rev && current != 0 {
			return true
		}
		select {
		case <-advanced:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// read returns key (or every key under it, with prefix) as of revision at, sorted by key; held
// is false when a value read is one the cache withholds: the read must go to etcd.
func (c *cache) read(key string, prefix bool, at int64) (kvs []*mvccpb.KeyValue, held bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !prefix {
		if v, ok := visible(c.versions[key], at); ok {
			return []*mvccpb.KeyValue{{Key: []byte(key), Value: v.value, ModRevision: v.mod}}, !v.withheld
		}
		return nil, true
	}
	for i := sort.SearchStrings(c.keys, key); i < len(c.keys) && strings.HasPrefix(c.keys[i], key); i++ {
		if v, ok := visible(c.versions[c.keys[i]], at); ok {
			if v.withheld {
				return nil, false
			}
			kvs = append(kvs, &mvccpb.KeyValue{Key: []byte(c.keys[i]), Value: v.value, ModRevision: v.mod})
		}
	}
	return kvs, true
}

// withhold has the cache hold no value of a key keep refuses, from now on and of what it holds.
func (c *cache) withhold(keep func(key string) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keep = keep
	for key, vs := range c.versions {
		if !keep(key) {
			for i := range vs {
				vs[i].value, vs[i].withheld = nil, !vs[i].deleted
			}
		}
	}
}

// visible is the version a read at revision at sees, if the key existed then.
func visible(vs []version, at int64) (version, bool) {
	for i := len(vs) - 1; i >= 0; i-- {
		if vs[i].mod <= at {
			return vs[i], !vs[i].deleted
		}
	}
	return version{}, false
}

// apply adds a watch response's events, completing the cache through through, and returns the
// subscribers' calls.
func (c *cache) apply(events []*mvccpb.Event, through int64) []change {
	c.mu.Lock()
	defer c.mu.Unlock()
	var changes []change
	for _, ev := range events {
		key := string(ev.Kv.Key)
		if ev.Type == mvccpb.DELETE {
			c.add(key, version{mod: ev.Kv.ModRevision, deleted: true})
		} else {
			c.add(key, version{mod: ev.Kv.ModRevision, value: ev.Kv.Value})
		}
		for _, s := range c.subscribers {
			if strings.HasPrefix(key, s.prefix) {
				changes = append(changes, change{s.fn, key})
			}
		}
	}
	c.advance(through)
	return changes
}

// reload replaces what the cache holds with kvs, the whole prefix at revision at, which lies past
// a gap the watch could not deliver (compacted history). It records each difference as a change
// at a revision no pinned reader reads at, so those readers keep their snapshots; every
// subscriber is told to treat every key as changed.
func (c *cache) reload(kvs []*mvccpb.KeyValue, at int64) []change {
	c.mu.Lock()
	defer c.mu.Unlock()
	loaded := make(map[string]bool, len(kvs))
	for _, kv := range kvs {
		loaded[string(kv.Key)] = true
		c.add(string(kv.Key), version{mod: kv.ModRevision, value: kv.Value})
	}
	for _, key := range append([]string{}, c.keys...) {
		if !loaded[key] {
			c.add(key, version{mod: at, deleted: true})
		}
	}
	c.advance(at)
	changes := make([]change, 0, len(c.subscribers))
	for _, s := range c.subscribers {
		changes = append(changes, change{s.fn, ""})
	}
	return changes
}

// add appends v to key's versions unless key already has it (or a later one).
func (c *cache) add(key string, v version) {
	vs, known := c.versions[key]
	if known && vs[len(vs)-1].mod >= v.mod {
		return
	}
	if !v.deleted && c.keep != nil && !c.keep(key) {
		v.value, v.withheld = nil, true
	}
	if !known {
		if v.deleted {
			return // never seen, so already missing
		}
		i := sort.SearchStrings(c.keys, key)
		c.keys = append(c.keys, "")
		copy(c.keys[i+1:], c.keys[i:])
		c.keys[i] = key
	}
	c.versions[key] = append(vs, v)
	if len(vs) > 0 || v.deleted {
		c.superseded[key] = true
	}
}

func (c *cache) advance(rev int64) {
	if rev <= c.rev {
		return
	}
	c.rev = rev
	c.behind = false
	close(c.advanced)
	c.advanced = make(chan struct{})
	c.prune()
}

// prune drops the versions no reader can see any more: those older than the newest version at or
// below the oldest pinned revision (or the cache's revision, with none pinned).
func (c *cache) prune() {
	floor := c.rev
	for at := range c.readers {
		floor = min(floor, at)
	}
	for key := range c.superseded {
		vs := c.versions[key]
		keep := 0
		for i, v := range vs {
			if v.mod <= floor {
				keep = i
			}
		}
		vs = vs[keep:]
		switch {
		case len(vs) == 1 && vs[0].deleted && vs[0].mod <= floor:
			delete(c.versions, key)
			delete(c.superseded, key)
			i := sort.SearchStrings(c.keys, key)
			c.keys = append(c.keys[:i], c.keys[i+1:]...)
		case len(vs) == 1:
			c.versions[key] = vs
			delete(c.superseded, key)
		default:
			c.versions[key] = vs
		}
	}
}

// subscribe calls fn with every key under prefix changed after the cache's current revision.
func (c *cache) subscribe(prefix string, fn func(key string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.subscribers = append(c.subscribers, subscriber{prefix, fn})
}

// revision is the revision the cache is complete through.
func (c *cache) revision() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rev
}

// lag records that a wait for the cache timed out: the watch is cut off or slow.
func (c *cache) lag() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.behind = true
}

// lagging says whether the last wait timed out and the cache has not advanced since.
func (c *cache) lagging() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.behind
}
