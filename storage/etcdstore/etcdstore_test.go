package etcdstore_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func set(t *testing.T, s storage.Store, key, value string) {
	t.Helper()
	if err := s.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(key, []byte(value)) }); err != nil {
		t.Fatalf("set %s: %v", key, err)
	}
}

func get(t *testing.T, s storage.Store, key string) string {
	t.Helper()
	var v []byte
	err := s.View(func(tx storage.Txn) (err error) { v, err = tx.Get(key); return err })
	if errors.Is(err, storage.ErrNotFound) {
		return "<missing>"
	}
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return string(v)
}

// readThenSet reads key, then sets it in an Update that reads it too, as a write through a mount
// follows the kernel's lookup or open. The read waits out an election: a follower asks the leader
// for its read index again until one answers. A commit proposed through a follower to a leader
// that just crashed is lost instead, and etcd answers it only after its request timeout (5 s plus
// two election timeouts): its outcome is then unknown, which the read spares every operation but
// one racing the crash. (An Update sent with no read before it within the last 100 ms reads first
// itself; one sent sooner commits at once and races the crash: tryOptimistic.)
func readThenSet(t *testing.T, s storage.Store, key, value string) {
	t.Helper()
	get(t, s, key)
	err := s.Update(context.Background(), func(tx storage.Txn) error {
		if _, err := tx.Get(key); err != nil && !errors.Is(err, storage.ErrNotFound) {
			return err
		}
		return tx.Set(key, []byte(value))
	})
	if err != nil {
		t.Fatalf("set %s: %v", key, err)
	}
}

// countScan is an fn that writes how many keys it scanned under l/, and on its first run lets
// change alter that range from another transaction before it commits.
func countScan(s storage.Store, runs *int, change func(storage.Txn) error) func(storage.Txn) error {
	return func(tx storage.Txn) error {
		*runs++
		n := 0
		if err := tx.Scan("l/", func(string, []byte) error { n++; return nil }); err != nil {
			return err
		}
		if *runs == 1 {
			if err := s.Update(context.Background(), change); err != nil {
				return err
			}
		}
		return tx.Set("count", []byte{byte('0' + n)})
	}
}

// A Scan in etcd is protected against phantoms and deletions too: the range compare and the
// per-key compares (package comment). Each case changes the range in a way the other compare
// cannot see.
func TestScanRangeConflicts(t *testing.T) {
	c := etcdtest.Start(t, 3)
	for _, tc := range []struct {
		name   string
		change func(storage.Txn) error
		want   string
	}{
		{"inserted", func(tx storage.Txn) error { return tx.Set("l/b", []byte("new")) }, "3"},
		{"deleted", func(tx storage.Txn) error { return tx.Delete("l/a") }, "1"},
		{"changed", func(tx storage.Txn) error { return tx.Set("l/a", []byte("changed")) }, "2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := c.Open(t, "scan-"+tc.name)
			set(t, s, "l/a", "1")
			set(t, s, "l/c", "1")
			runs := 0
			if err := s.Update(context.Background(), countScan(s, &runs, tc.change)); err != nil {
				t.Fatal(err)
			}
			if got := get(t, s, "count"); got != tc.want || runs != 2 {
				t.Errorf("count = %s after %d runs, want %s after 2: the range's change must conflict", got, runs, tc.want)
			}
		})
	}
}

// Keys live under the store's prefix only, and prefixes that share a stem do not mix.
func TestPrefixesAreApart(t *testing.T) {
	c := etcdtest.Start(t, 1)
	team, team2 := c.Open(t, "team"), c.Open(t, "/team2/")
	set(t, team, "k", "team")
	set(t, team2, "k", "team2")
	var keys []string
	err := team.View(func(tx storage.Txn) error {
		return tx.Scan("", func(k string, _ []byte) error { keys = append(keys, k); return nil })
	})
	if err != nil || strings.Join(keys, ",") != "k" || get(t, team, "k") != "team" {
		t.Errorf("team holds %v (%v), k=%s; want only its own k=team", keys, err, get(t, team, "k"))
	}
	resp, err := team.Client().Get(context.Background(), "team/k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "team" {
		t.Errorf("etcd key team/k = %v, %v; want the store's k", resp, err)
	}
}

func TestParseURL(t *testing.T) {
	cfg, err := etcdconf.ParseURL("etcd://a:2379,10.0.0.2:2379/team/x")
	if err != nil || strings.Join(cfg.Endpoints, " ") != "a:2379 10.0.0.2:2379" || cfg.Prefix != "team/x" {
		t.Errorf("ParseURL = %+v, %v", cfg, err)
	}
	for _, bad := range []string{"etcd://a:2379", "etcd://a:2379/", "etcd://a/p", "http://a:2379/p", "etcd://a:2379,/p", "etcd:///p"} {
		if _, err := etcdconf.ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q) accepted", bad)
		}
	}
}

// Watch reports another store's commits, in order, from the moment it returns.
func TestWatchSeesOtherWriters(t *testing.T) {
	c := etcdtest.Start(t, 3)
	mine, theirs := c.Open(t, "w"), c.Open(t, "w")
	set(t, theirs, "s/before", "1")
	var mu sync.Mutex
	var seen []string
	got := make(chan struct{}, 10)
	if err := mine.Watch("s/", func(k string) {
		mu.Lock()
		seen = append(seen, k)
		mu.Unlock()
		got <- struct{}{}
	}); err != nil {
		t.Fatal(err)
	}
	set(t, theirs, "other/x", "1")
	set(t, theirs, "s/a", "1")
	if err := theirs.Update(context.Background(), func(tx storage.Txn) error { return tx.Delete("s/before") }); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case <-got:
		case <-time.After(30 * time.Second):
			t.Fatalf("watch saw %v, want s/a and s/before", seen)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(seen, ",") != "s/a,s/before" {
		t.Errorf("watch saw %v, want [s/a s/before]", seen)
	}
}

// With one of three members down every operation works; with two down a quorum is lost and
// Update refuses within its budget with ErrLocked, applying nothing; once the members are back
// the store works again and holds exactly what was acknowledged.
//
// The Update reads before it writes, as every engine operation does: the read needs a quorum, so
// nothing is proposed. A quorum lost between the read and the commit leaves the commit's fate to
// etcd's log (it may still apply once the members return); the refusal then says so.
func TestMemberLossAndQuorumLoss(t *testing.T) {
	c := etcdtest.Start(t, 3)
	s, err := etcdstore.Open(etcdconf.Config{Endpoints: c.Endpoints(), Prefix: "quorum", Budget: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	set(t, s, "a", "1")
	for m := range 3 { // whichever was the leader
		c.Stop(m)
		readThenSet(t, s, "a", "stopped-"+string(rune('0'+m)))
		if got := get(t, s, "a"); got != "stopped-"+string(rune('0'+m)) {
			t.Errorf("with member %d down a = %s", m, got)
		}
		c.Restart(m)
	}

	c.Stop(1)
	c.Stop(2)
	// Within quorumFresh of the last answer the Update would commit on the watched copy with no
	// read first, and a commit proposed without a quorum may apply once it is back (the refusal
	// then says its outcome is unknown): this is the read-first case.
	s.QuorumAnsweredLongAgo()
	start := time.Now()
	err = s.Update(context.Background(), func(tx storage.Txn) error {
		if _, err := tx.Get("a"); err != nil {
			return err
		}
		if err := tx.Set("a", []byte("lost")); err != nil {
			return err
		}
		return tx.Set("b", []byte("lost"))
	})
	took := time.Since(start)
	if !errors.Is(err, storage.ErrLocked) || !strings.Contains(err.Error(), "quorum") {
		t.Errorf("Update without a quorum: %v, want ErrLocked naming the lost quorum", err)
	}
	// The budget per call, not a performance figure: refusing, not hanging, is the contract.
	if took > 3*time.Second+5*time.Second {
		t.Errorf("Update without a quorum took %v", took)
	}
	if err := s.View(func(tx storage.Txn) error { _, err := tx.Get("a"); return err }); !errors.Is(err, storage.ErrLocked) {
		t.Errorf("View without a quorum: %v, want ErrLocked", err)
	}
	c.Restart(1)
	c.Restart(2)
	if a, b := get(t, s, "a"), get(t, s, "b"); a != "stopped-2" || b != "<missing>" {
		t.Errorf("after the quorum came back a=%s b=%s, want stopped-2 and <missing>", a, b)
	}
	set(t, s, "b", "back")
}

// A caller whose context ends while its commit is on its way to etcd (an interrupt, the engine's
// budget running out) still learns the commit's outcome: once sent, the Txn is etcd's to decide,
// and only a cluster that does not answer may leave it unknown. The context is cancelled right
// after fn returns, before or while the Txn is under way: either nothing was sent and the refusal
// says so, or the commit's answer is waited for.
func TestCommitOutlivesCallerContext(t *testing.T) {
	c := etcdtest.Start(t, 1)
	s := c.Open(t, "outlive")
	committed := 0
	for i := range 20 {
		key := fmt.Sprintf("k%d", i)
		ctx, cancel := context.WithCancel(context.Background())
		err := s.Update(ctx, func(tx storage.Txn) error {
			if _, err := tx.Get(key); !errors.Is(err, storage.ErrNotFound) {
				return err
			}
			time.AfterFunc(time.Duration(i%4)*time.Millisecond, cancel)
			return tx.Set(key, []byte("v"))
		})
		cancel()
		got := get(t, s, key)
		if err == nil {
			committed++
		}
		switch {
		case err == nil && got != "v":
			t.Fatalf("round %d: Update returned nil and %s = %s", i, key, got)
		case err != nil && strings.Contains(err.Error(), "may or may not"):
			t.Fatalf("round %d: a healthy cluster's commit left unknown (%s = %s): %v", i, key, got, err)
		case err != nil && got != "<missing>":
			t.Fatalf("round %d: Update refused (%v) and %s = %s", i, err, key, got)
		}
	}
	// Some rounds must have sent their Txn before the cancel, or the test proved nothing.
	if committed == 0 {
		t.Errorf("no round committed: every cancel came before its Txn was sent")
	}
	t.Logf("%d of 20 rounds committed, the others sent nothing", committed)
}

// A read cut short by its caller's own deadline (the engine's budget, spent waiting for its lock
// or on conflicts) is not blamed on the cluster: only a read that had the store's whole budget
// says no quorum answered.
func TestReadOutOfCallersTimeIsNotAQuorumLoss(t *testing.T) {
	c := etcdtest.Start(t, 1)
	s := c.Open(t, "caller-time")
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	err := s.Update(ctx, func(tx storage.Txn) error {
		if _, err := tx.Get("k"); err != nil && !errors.Is(err, storage.ErrNotFound) {
			return err
		}
		return tx.Set("k", []byte("v"))
	})
	if !errors.Is(err, storage.ErrLocked) || strings.Contains(err.Error(), "quorum") {
		t.Errorf("Update whose caller's deadline had passed: %v; want ErrLocked not blaming the quorum", err)
	}
	if got := get(t, s, "k"); got != "<missing>" {
		t.Errorf("k = %s after the refused Update", got)
	}
}

// Prove renews an announcement only when its last renewal is older than half its TTL, writes it
// again under a new lease when it was lost (revoked here, as etcd does to an expired one), and
// without a quorum fails with ErrLocked.
func TestProveAnnouncement(t *testing.T) {
	c := etcdtest.Start(t, 1)
	s := c.Open(t, "prove")
	if err := s.Prove("m/a"); !errors.Is(err, storage.ErrLocked) {
		t.Fatalf("Prove of a key never announced: %v", err)
	}
	if err := s.Announce("m/a", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	leaseOf := func() clientv3.LeaseID {
		resp, err := s.Client().Get(context.Background(), "prove/m/a")
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("the announced key: %v %v", resp, err)
		}
		return clientv3.LeaseID(resp.Kvs[0].Lease)
	}
	first := leaseOf()
	provenAt := s.AgeAnnouncement("m/a", 0)
	if err := s.Prove("m/a"); err != nil {
		t.Fatal(err)
	}
	if now := s.AgeAnnouncement("m/a", 0); now != provenAt {
		t.Errorf("a Prove within half the TTL renewed (proven moved)")
	}
	aged := s.AgeAnnouncement("m/a", time.Second) // past half the TTL
	if err := s.Prove("m/a"); err != nil {
		t.Fatal(err)
	}
	if now := s.AgeAnnouncement("m/a", 0); now <= aged {
		t.Errorf("a Prove past half the TTL did not renew")
	}
	s.AgeAnnouncement("m/a", time.Second)
	if _, err := s.Client().Revoke(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	if err := s.Prove("m/a"); err != nil {
		t.Fatalf("Prove of a lost announcement: %v", err)
	}
	if again := leaseOf(); again == first {
		t.Fatalf("the key is under the revoked lease %x", first)
	}

	s.AgeAnnouncement("m/a", time.Second)
	quick, err := etcdstore.Open(etcdconf.Config{Endpoints: c.Endpoints(), Prefix: "prove", Budget: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer quick.Close()
	if err := quick.Announce("m/b", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	quick.AgeAnnouncement("m/b", time.Second)
	c.Stop(0)
	if err := quick.Prove("m/b"); !errors.Is(err, storage.ErrLocked) {
		t.Fatalf("Prove without a quorum: %v", err)
	}
}

// An announced key deleted behind the store's back (a teammate tidying the prefix with etcdctl), or
// overwritten without its lease, is written again under the store's lease: gone, every other
// machine would read this one's holders dead, and their next claim release them while their
// processes run.
func TestAnnouncementDeletedIsWrittenAgain(t *testing.T) {
	c := etcdtest.Start(t, 1)
	s := c.Open(t, "keep")
	if err := s.Announce("m/a", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	cli := s.Client()
	ctx := context.Background()
	get := func() *mvccpb.KeyValue {
		resp, err := cli.Get(ctx, "keep/m/a")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		return resp.Kvs[0]
	}
	lease := clientv3.LeaseID(get().Lease)
	waitFor := func(what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			kv := get()
			if kv != nil && clientv3.LeaseID(kv.Lease) == lease {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the key is %v, not under the store's lease %x, after 5 s", what, kv, lease)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if _, err := cli.Delete(ctx, "keep/m/a"); err != nil {
		t.Fatal(err)
	}
	waitFor("deleted")
	if _, err := cli.Delete(ctx, "keep/m/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	waitFor("deleted with its prefix")
	if _, err := cli.Put(ctx, "keep/m/a", "x"); err != nil {
		t.Fatal(err)
	}
	waitFor("overwritten without a lease")
}

// A cluster Open cannot reach is refused with why, as etcdctl and Go's TLS say it, and the flag
// that fixes it, not a bare deadline.
func TestOpenSaysWhyItCannotConnect(t *testing.T) {
	plain := etcdtest.Start(t, 1)
	secure, files := etcdtest.StartTLS(t, 1, false)
	mutual, mutualFiles := etcdtest.StartTLS(t, 1, true)
	tlsOf := func(f etcdconf.TLSFiles) *tls.Config {
		c, err := f.Config()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nobody := free.Addr().String()
	free.Close()
	for _, c := range []struct {
		name      string
		endpoints []string
		tls       *tls.Config
		want      []string
	}{
		{"nothing listens", []string{nobody}, nil, []string{"connection refused", "--store"}},
		{"plain client, TLS server", secure.Endpoints(), nil, []string{"speaks TLS", "--cacert"}},
		{"another CA", secure.Endpoints(), tlsOf(etcdconf.TLSFiles{CACert: files.OtherCA}), []string{"x509: certificate signed by unknown authority", "--cacert"}},
		{"a name the certificate does not name", []string{strings.Replace(secure.Endpoints()[0], "127.0.0.1", "localhost", 1)},
			tlsOf(etcdconf.TLSFiles{CACert: files.CA}), []string{"x509: certificate is not valid for any names, but wanted to match localhost", "--store"}},
		{"no client certificate", mutual.Endpoints(), tlsOf(etcdconf.TLSFiles{CACert: mutualFiles.CA}), []string{"requires a client certificate", "--cert and --key"}},
		{"TLS client, plain server", plain.Endpoints(), tlsOf(etcdconf.TLSFiles{CACert: files.CA}), []string{"does not speak TLS", "leave out --cacert"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// A budget long enough for a loaded machine's handshakes, short for the cases that wait it out.
			s, err := etcdstore.Open(etcdconf.Config{Endpoints: c.endpoints, Prefix: "p", TLS: c.tls, Budget: 3 * time.Second})
			if err == nil {
				s.Close()
				t.Fatal("opened")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	// The right flags open both.
	for _, c := range []struct {
		cluster *etcdtest.Cluster
		files   etcdconf.TLSFiles
	}{
		{secure, etcdconf.TLSFiles{CACert: files.CA}},
		{mutual, etcdconf.TLSFiles{CACert: mutualFiles.CA, Cert: mutualFiles.ClientCert, Key: mutualFiles.ClientKey}},
	} {
		s, err := etcdstore.Open(etcdconf.Config{Endpoints: c.cluster.Endpoints(), Prefix: "p", TLS: tlsOf(c.files), Budget: etcdtest.Budget})
		if err != nil {
			t.Fatalf("with the right flags: %v", err)
		}
		s.Close()
	}
}

// With authentication on, a wrong password or none names the flags to fix.
func TestOpenSaysWhyAuthenticationFailed(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Open(t, "auth").Client()
	ctx := context.Background()
	for _, step := range []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", "secret"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		user, password string
		want           []string
	}{
		{"root", "wrong", []string{"authentication failed", "--user and --password"}},
		{"", "", []string{"--user USER[:PASSWORD]"}},
	} {
		// etcd answers a wrong password at once: the budget only bounds a loaded machine's dial.
		s, err := etcdstore.Open(etcdconf.Config{Endpoints: c.Endpoints(), Prefix: "p", Username: tc.user, Password: tc.password, Budget: etcdtest.Budget})
		if err == nil {
			s.Close()
			t.Fatalf("opened as %q", tc.user)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("as %q: error %q does not say %q", tc.user, err, w)
			}
		}
	}
	s, err := etcdstore.Open(etcdconf.Config{Endpoints: c.Endpoints(), Prefix: "p", Username: "root", Password: "secret", Budget: etcdtest.Budget})
	if err != nil {
		t.Fatalf("with the right password: %v", err)
	}
	s.Close()
}

// A cluster restored from an older snapshot behind the same endpoints (etcd's revision goes
// backward) is detected at the next read of a store that saw later revisions: it refuses that read
// and every one after it, naming the condition and the restart that reads the prefix anew, instead
// of serving keys the cluster no longer has. A store opened after the restore serves it.
func TestRestoredClusterIsRefused(t *testing.T) {
	c := etcdtest.Start(t, 1)
	s := c.Open(t, "restored")
	set(t, s, "k1", "v1")
	snap := c.Snapshot()
	for _, k := range []string{"k2", "k3", "k4"} {
		set(t, s, k, "v")
	}
	if got := get(t, s, "k4"); got != "v" {
		t.Fatalf("k4 before the restore: %q", got)
	}
	c.RestoreFrom(snap)
	for range 2 { // refused, and still refused
		err := s.View(func(tx storage.Txn) error { _, err := tx.Get("k4"); return err })
		if err == nil || !strings.Contains(err.Error(), "revision went backward") || !strings.Contains(err.Error(), "restart it") {
			t.Fatalf("a read after the restore: %v", err)
		}
		if err := s.Update(context.Background(), func(tx storage.Txn) error { return tx.Set("k5", []byte("v")) }); err == nil {
			t.Fatal("a commit after the restore was accepted")
		}
	}
	fresh := c.Open(t, "restored")
	if got := get(t, fresh, "k1"); got != "v1" {
		t.Fatalf("k1 after the restore: %q", got)
	}
	if err := fresh.View(func(tx storage.Txn) error { _, err := tx.Get("k4"); return err }); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("k4, written after the snapshot, read by a fresh store: %v", err)
	}
}

// A refusal decided on the watched copy is returned only once a quorum confirms what it read: a
// lone member, its peers gone, must not confirm it from its own state. Without a quorum the
// Update refuses with ErrLocked, not with fn's refusal.
func TestRefusalIsConfirmedByAQuorum(t *testing.T) {
	c := etcdtest.Start(t, 3)
	s, err := etcdstore.Open(etcdconf.Config{Endpoints: c.Endpoints(), Prefix: "confirm", Budget: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	set(t, s, "a", "1")
	c.Stop(1)
	c.Stop(2)
	refused := errors.New("refused")
	s.QuorumAnsweredNow()
	err = s.Update(context.Background(), func(tx storage.Txn) error {
		if _, err := tx.Get("a"); err != nil {
			return err
		}
		return refused
	})
	if !errors.Is(err, storage.ErrLocked) || !strings.Contains(err.Error(), "quorum") {
		t.Fatalf("a refusal without a quorum: %v, want ErrLocked naming the quorum", err)
	}
}
