// Package etcdtest runs a real etcd cluster inside a test process: members on loopback with free
// ports, each with its own data directory, which a test can stop and start again. Only tests
// import it, so the etcd server is never linked into cockpitfs.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/cockpitfs/cockpitfs/storage/etcdstore"
)

// MaxTxnOps is what the members allow in one transaction: removing a stack deletes its events
// (up to engine.EventsKept) in the same transaction, beyond etcd's default of 128.
const MaxTxnOps = 2048

// Budget is the stores' budget (etcdstore.Config.Budget) in tests: members in the test process are
// built with the race detector and share two CPUs with everything else, and a commit then takes
// ≈100 ms instead of ≈10 ms, so contention that clears in 2 s on a real cluster may not here.
const Budget = 10 * time.Second

// Cluster is a running cluster. Stop and Start take one member down and back up.
type Cluster struct {
	t       testing.TB
	mu      sync.Mutex
	configs []*embed.Config
	members []*embed.Etcd // nil while stopped
}

// Start starts n members and waits until they serve; they stop when the test ends.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{t: t, members: make([]*embed.Etcd, n)}
	root := t.TempDir()
	var initial []string
	for i := range n {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = filepath.Join(root, cfg.Name)
		peer, client := freeURL(t), freeURL(t)
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
		cfg.InitialClusterToken = t.Name()
		cfg.ClusterState = embed.ClusterStateFlagNew
		// Short elections, so a test that stops the leader waits a second, not ten.
		cfg.TickMs, cfg.ElectionMs = 50, 500
		cfg.MaxTxnOps = MaxTxnOps
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		c.configs = append(c.configs, cfg)
		initial = append(initial, cfg.Name+"="+peer.String())
	}
	for _, cfg := range c.configs {
		cfg.InitialCluster = strings.Join(initial, ",")
	}
	t.Cleanup(c.stopAll)
	// Members of a new cluster wait for each other, so they start together.
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = c.start(i) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// freeURL is a loopback address no one listened on a moment ago.
func freeURL(t testing.TB) url.URL {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}
}

func (c *Cluster) start(i int) error {
	e, err := embed.StartEtcd(c.configs[i])
	if err != nil {
		return fmt.Errorf("etcd member %d: %w", i, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcd member %d: %w", i, err)
	case <-time.After(30 * time.Second):
		e.Close()
		return fmt.Errorf("etcd member %d did not become ready", i)
	}
	c.mu.Lock()
	c.members[i] = e
	c.mu.Unlock()
	return nil
}

// Endpoints lists every member's client address, stopped ones included.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, cfg := range c.configs {
		out = append(out, cfg.AdvertiseClientUrls[0].Host)
	}
	return out
}

// URL is the --store value naming every member and prefix.
func (c *Cluster) URL(prefix string) string {
	return "etcd://" + strings.Join(c.Endpoints(), ",") + "/" + prefix
}

// Open opens prefix of the cluster, closed when the test ends.
func (c *Cluster) Open(t testing.TB, prefix string) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.Open(etcdstore.Config{Endpoints: c.Endpoints(), Prefix: prefix, Budget: Budget})
	if err != nil {
		t.Fatalf("open etcd store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Stop stops member i (as a crash would, but letting it flush: its data directory stays).
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	e := c.members[i]
	c.members[i] = nil
	c.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts stopped member i again on its data directory.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if err := c.start(i); err != nil {
		c.t.Fatal(err)
	}
}

func (c *Cluster) stopAll() {
	for i := range c.members {
		c.Stop(i)
	}
}
