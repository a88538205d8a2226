package etcdstore

import (
	"fmt"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

func put(key, value string, rev int64) *mvccpb.Event {
	return &mvccpb.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(key), Value: []byte(value), ModRevision: rev}}
}

func del(key string, rev int64) *mvccpb.Event {
	return &mvccpb.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev}}
}

// show renders what a read at rev sees under prefix: key=value@mod, in key order.
func show(c *cache, prefix string, rev int64) string {
	var out []string
	kvs, _ := c.read(prefix, true, rev)
	for _, kv := range kvs {
		out = append(out, fmt.Sprintf("%s=%s@%d", kv.Key, kv.Value, kv.ModRevision))
	}
	return strings.Join(out, " ")
}

// A pinned reader keeps its snapshot while later revisions arrive, and what it alone needed goes
// once it unpins: superseded versions and deletions.
func TestCacheSnapshotsAndPruning(t *testing.T) {
	c := newCache()
	c.reload([]*mvccpb.KeyValue{{Key: []byte("p/a"), Value: []byte("1"), ModRevision: 3}}, 5)
	at, ok := c.pin(5)
	if !ok || at != 5 {
		t.Fatalf("pin(5) = %d, %v", at, ok)
	}
	if _, ok := c.pin(6); ok {
		t.Errorf("pinned at 6 a cache complete through 5")
	}
	c.apply([]*mvccpb.Event{put("p/a", "2", 6), put("p/b", "1", 6)}, 6)
	c.apply([]*mvccpb.Event{del("p/a", 7)}, 7)
	if got := show(c, "p/", at); got != "p/a=1@3" {
		t.Errorf("the reader at 5 sees %q, want its snapshot p/a=1@3", got)
	}
	if got := show(c, "p/", 7); got != "p/b=1@6" {
		t.Errorf("a read at 7 sees %q, want p/b=1@6", got)
	}
	c.unpin(at)
	if len(c.versions["p/a"]) != 0 || len(c.versions["p/b"]) != 1 || strings.Join(c.keys, " ") != "p/b" {
		t.Errorf("after the reader left the cache keeps %v (keys %v), want p/b's one version", c.versions, c.keys)
	}
}

// Loading the prefix again after a gap records each difference past every pinned reader's
// snapshot, and tells every subscriber that anything may have changed.
func TestCacheReload(t *testing.T) {
	c := newCache()
	var told []string
	c.reload([]*mvccpb.KeyValue{{Key: []byte("a"), Value: []byte("1"), ModRevision: 2}, {Key: []byte("b"), Value: []byte("1"), ModRevision: 2}}, 2)
	c.subscribe("", func(key string) { told = append(told, key) })
	at, _ := c.pin(2)
	notify(c.reload([]*mvccpb.KeyValue{{Key: []byte("b"), Value: []byte("2"), ModRevision: 8}, {Key: []byte("c"), Value: []byte("1"), ModRevision: 9}}, 10))
	if got := show(c, "", at); got != "a=1@2 b=1@2" {
		t.Errorf("the reader at 2 sees %q, want its snapshot", got)
	}
	if got := show(c, "", 10); got != "b=2@8 c=1@9" {
		t.Errorf("a read at 10 sees %q, want the loaded prefix", got)
	}
	if len(told) != 1 || told[0] != "" {
		t.Errorf("the subscriber was told %q, want one \"\" (anything changed)", told)
	}
}
