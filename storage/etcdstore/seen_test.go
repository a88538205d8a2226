package etcdstore_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
)

// What a store saw, kept in a file while it runs and when it stops, names a restore from an older
// snapshot and another cluster behind the same endpoints to a store opened afterwards, which has
// no memory of its own of what came before; a running store refuses another cluster.
func TestSeenNamesARestoreAndAnotherCluster(t *testing.T) {
	dir := t.TempDir()
	if a, b := etcdconf.SeenPath(dir, etcdconf.Config{Endpoints: []string{"h1:1", "h2:2"}, Prefix: "p"}),
		etcdconf.SeenPath(dir, etcdconf.Config{Endpoints: []string{"h2:2", "h1:1"}, Prefix: "/p/"}); a != b {
		t.Fatalf("one store, endpoints in another order: %s and %s", a, b)
	}
	if a, b := etcdconf.SeenPath(dir, etcdconf.Config{Endpoints: []string{"h1:1"}, Prefix: "p"}),
		etcdconf.SeenPath(dir, etcdconf.Config{Endpoints: []string{"h1:1"}, Prefix: "q"}); a == b {
		t.Fatalf("two prefixes share %s", a)
	}

	c := etcdtest.Start(t, 1)
	s := c.Open(t, "seen")
	path := etcdconf.SeenPath(dir, etcdconf.Config{Endpoints: c.Endpoints(), Prefix: "seen"})
	if _, ok := etcdconf.ReadSeen(path); ok {
		t.Fatal("a record before any store kept one")
	}
	set(t, s, "k1", "v1")
	stop, err := s.KeepSeen(path, etcdconf.Seen{Store: c.URL("seen"), Mount: "/m"})
	if err != nil {
		t.Fatal(err)
	}
	snap := c.Snapshot()
	set(t, s, "k2", "v")
	set(t, s, "k3", "v")
	_, high := s.Seen()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if was, _ := etcdconf.ReadSeen(path); was.Revision == high {
			break // recorded while the store runs
		}
		if time.Now().After(deadline) {
			t.Fatalf("revision %d not recorded while the store runs", high)
		}
	}
	set(t, s, "k4", "v")
	stop()
	was, ok := etcdconf.ReadSeen(path)
	if cluster, rev := s.Seen(); !ok || was.Cluster != cluster || was.Revision != rev || was.Mount != "/m" {
		t.Fatalf("recorded at stop: %+v, the store saw cluster %x revision %d", was, cluster, rev)
	}
	if err := was.Against(s.Seen()); err != nil {
		t.Fatalf("the cluster as it was: %v", err)
	}

	c.RestoreFrom(snap)
	restored := c.Open(t, "seen")
	cluster, rev := restored.Seen()
	want := fmt.Sprintf("the store's revision went backward from %d to %d: %s was restored from an older snapshot?", was.Revision, rev, c.URL("seen"))
	if err := was.Against(cluster, rev); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("after the restore: %v, want %q", err, want)
	}

	c.Replace()
	other := c.Open(t, "seen")
	cluster, rev = other.Seen()
	want = fmt.Sprintf("another etcd cluster answers at %s: cluster %x, where the daemon of this data directory saw cluster %x", c.URL("seen"), cluster, was.Cluster)
	if err := was.Against(cluster, rev); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("after the replacement: %v, want %q", err, want)
	}
	// The store opened on the restored cluster runs on into the new one, and refuses it.
	err = restored.View(func(tx storage.Txn) error { _, err := tx.Get("k1"); return err })
	if err == nil || !strings.Contains(err.Error(), "another etcd cluster") || !strings.Contains(err.Error(), "restart it") {
		t.Fatalf("a running store's read from another cluster: %v", err)
	}
	if got := get(t, other, "k1"); got != "<missing>" {
		t.Fatalf("k1 in the new cluster: %q", got)
	}
}
