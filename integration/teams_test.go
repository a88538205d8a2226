package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/liveness"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
)

// newEtcdMount starts a daemon serving prefix of the cluster. It runs in the test's network
// namespace, where the cluster listens; over etcd a daemon takes no machine-wide port holds.
func newEtcdMount(t *testing.T, store string, env ...string) *mount {
	t.Helper()
	base := t.TempDir()
	m := &mount{t: t, Dir: filepath.Join(base, "mnt"), Data: filepath.Join(base, "data"), Store: store, env: env}
	m.start("--store", store, "--command-timeout", etcdtest.Budget.String())
	t.Cleanup(m.stop)
	return m
}

// Two daemons mounting one prefix serve one namespace: each sees the other's changes at its next
// open, stat or readdir (no name kept missing), leases never overlap, and wait wakes on the other
// daemon's commit.
func TestTeamTwoDaemonsOneNamespace(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 3)
	store := cluster.URL("team")
	a, b := newEtcdMount(t, store), newEtcdMount(t, store)

	// b looks up names before a creates them: a kept negative entry would hide them.
	b.refused("ls $M/app", syscall.ENOENT)
	a.setupApp(12, map[string]int{"HTTP": 18080}, "s1")
	b.refused("ls $M/app/stacks/s2", syscall.ENOENT)
	if got := b.ok("cat $M/app/config | grep HTTP; ls $M/app/stacks"); got != "HTTP = 18080\ns1\n" {
		t.Fatalf("b sees %q, want a's cockpit and stack", got)
	}
	b.ok("mkdir $M/app/stacks/s2")
	if got := a.ok("ls $M/app/stacks; stat -c %n $M/app/stacks/s2"); got != "s1\ns2\n"+a.Path("app/stacks/s2")+"\n" {
		t.Fatalf("a sees %q, want s1 and b's s2", got)
	}

	// Each claims through its own mount; the families differ and both mounts list both.
	a.ok("touch $M/app/stacks/s1/holders/me")
	b.ok("touch $M/app/stacks/s2/holders/me")
	if pa, pb := a.read("app/stacks/s1/ports/HTTP"), b.read("app/stacks/s2/ports/HTTP"); pa == pb {
		t.Fatalf("both stacks leased HTTP=%s", pa)
	}
	if la, lb := a.ok("ls $M/ports"), b.ok("ls $M/ports"); la != lb || len(strings.Fields(la)) != 2 {
		t.Fatalf("ports/ on a = %q, on b = %q; want the same two ports", la, lb)
	}

	// A wait opened on a returns once b commits a change to the stack.
	rev := strings.TrimSpace(a.read("app/stacks/s1/revision"))
	sh := a.shell(a.Dir)
	sh.run("exec 3<$M/app/stacks/s1/wait")
	b.ok("touch $M/app/stacks/s1/holders/b")
	if got := strings.TrimSpace(sh.run("cat <&3")); got == rev || got == "" {
		t.Errorf("wait on a returned %q at b's commit, want a revision past %s", got, rev)
	}
	if got := a.ok("ls $M/app/stacks/s1/holders"); got != "b\nme\n" {
		t.Errorf("a lists holders %q, want b and me", got)
	}

	// Both machines claim at once, four stacks each: no port is leased twice. A claim that meets
	// contention past its budget is refused STATE_LOCKED (EAGAIN) and changes nothing; the user
	// tries again, as this loop does, so every stack ends up leased.
	var wg sync.WaitGroup
	for _, m := range []*mount{a, b} {
		wg.Go(func() {
			m.ok(`for i in 1 2 3 4; do (mkdir $M/app/stacks/$$-$i && for try in $(seq 20); do touch $M/app/stacks/$$-$i/holders/me 2>/dev/null && break; sleep 0.2; done) & done; wait`)
		})
	}
	wg.Wait()
	ports := strings.Fields(a.ok("cat $M/app/stacks/*/ports/HTTP"))
	seen := map[string]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Errorf("port %s leased twice: %v", p, ports)
		}
		seen[p] = true
	}
	if len(ports) != 10 {
		t.Errorf("%d stacks hold a lease, want 10: %v", len(ports), ports)
	}
}

// Each daemon sees the other's acknowledged change at its very next stat, readdir or open, issued
// the moment the writing syscall returns, with no process start between them: the reads the
// daemon serves from its watched copy of the prefix must first prove that copy current (see
// storage/etcdstore). The writer alternates between the daemons.
func TestTeamChangeSeenAtNextRead(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 3)
	store := cluster.URL("next")
	a, b := newEtcdMount(t, store), newEtcdMount(t, store)
	a.setupApp(4, map[string]int{"HTTP": 19080}, "s")
	a.ok("touch $M/app/stacks/s/holders/base")
	holders := []string{"app", "stacks", "s", "holders"}
	for round := range 24 {
		w, r := a, b
		if round%2 == 1 {
			w, r = b, a
		}
		name := fmt.Sprintf("h%d", round)
		f, err := os.OpenFile(w.Path(append(holders, name)...), os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatalf("round %d: claim %s: %v", round, name, err)
		}
		f.Close()
		if _, err := os.Stat(r.Path(append(holders, name)...)); err != nil {
			t.Fatalf("round %d: the other daemon's stat of the new holder: %v", round, err)
		}
		if got, want := r.read("app", "stacks", "s", "revision"), w.read("app", "stacks", "s", "revision"); got != want {
			t.Fatalf("round %d: the other daemon opens revision %q, the writer %q", round, got, want)
		}
		if err := os.Remove(r.Path(append(holders, name)...)); err != nil {
			t.Fatalf("round %d: release %s through the other daemon: %v", round, name, err)
		}
		entries, err := os.ReadDir(w.Path(holders...))
		if err != nil || len(entries) != 1 || entries[0].Name() != "base" {
			t.Fatalf("round %d: the writer lists holders %v (%v) after the other released %s, want only base", round, entries, err, name)
		}
	}
}

// A holder is judged by its own machine: another machine's daemon neither probes it (its pid means
// nothing here) nor releases it while that machine's daemon keeps its etcd lease; once the lease
// expires (the daemon killed) it reads dead and the next claim anywhere releases it. The two
// machines are two daemons whose boot ids are faked (liveness.TestBootIDEnv).
func TestTeamMachineLeaseReleasesHolders(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 3)
	store := cluster.URL("machines")
	a := newEtcdMount(t, store, liveness.TestBootIDEnv+"=aaaaaaaa-0000-4000-8000-000000000001")
	b := newEtcdMount(t, store, liveness.TestBootIDEnv+"=bbbbbbbb-0000-4000-8000-000000000002")
	a.setupApp(5, map[string]int{"HTTP": 18180}, "s1")

	sleeper := exec.Command("sleep", "600")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	a.ok(fmt.Sprintf("touch $M/app/stacks/s1/holders/w && echo pid=%d > $M/app/stacks/s1/holders/w", sleeper.Process.Pid))
	if got := a.read("app/stacks/s1/holders/w"); !strings.Contains(got, "process_start=proc:aaaaaaaa-") || !strings.Contains(got, "state=live\n") {
		t.Fatalf("on its own machine the holder reads\n%s\nwant machine a's boot, live", got)
	}
	// On b the pid belongs to another boot: unknown, and a claim through b keeps it.
	if got := b.read("app/stacks/s1/holders/w"); !strings.Contains(got, "state=unknown\n") {
		t.Fatalf("on the other machine the holder reads\n%s\nwant state=unknown", got)
	}
	b.ok("touch $M/app/stacks/s1/holders/x")
	if got := b.ok("ls $M/app/stacks/s1/holders"); got != "w\nx\n" {
		t.Fatalf("after b's claim the holders are %q, want w kept beside x", got)
	}

	a.Kill()
	deadline := time.Now().Add(engine.MachineTTL + 30*time.Second)
	for !strings.Contains(b.read("app/stacks/s1/holders/w"), "state=dead\n") {
		if time.Now().After(deadline) {
			t.Fatalf("w never read dead after its daemon was killed:\n%s", b.read("app/stacks/s1/holders/w"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Its process still runs on this (test) machine: only its machine's lease decided.
	if err := sleeper.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the holder's process is gone: %v", err)
	}
	b.ok("touch $M/app/stacks/s1/holders/y")
	if got := b.ok("ls $M/app/stacks/s1/holders"); strings.Contains(got, "w\n") {
		t.Fatalf("after the lease expired a claim left holders %q, want w released", got)
	}
}

// migrate copies a data directory into an empty etcd prefix, whose daemon serves the same tree,
// and back into an empty data directory; a store that is not empty is refused, changing nothing.
func TestTeamMigrate(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	store := cluster.URL("migrated")
	laptop := newMount(t)
	laptop.setupApp(5, map[string]int{"HTTP": 18280}, "s1")
	laptop.ok("touch $M/app/stacks/s1/holders/me")
	port := laptop.read("app/stacks/s1/ports/HTTP")
	laptop.Stop()

	migrate := func(from, to string) result {
		t.Helper()
		return shIn(t, "/", `"$B" migrate --command-timeout 10s "$F" "$T"`, "B="+binary, "F="+from, "T="+to)
	}
	if r := migrate(laptop.Data, store); r.Code != 0 || !strings.Contains(r.Stdout, "copied ") {
		t.Fatalf("migrate into etcd: %+v", r)
	}
	if r := migrate(laptop.Data, store); r.Code == 0 || !strings.Contains(r.Stderr, "migrate only into an empty store") {
		t.Fatalf("a second migrate into the same prefix: %+v, want refused", r)
	}
	team := newEtcdMount(t, store)
	if got := team.read("app/stacks/s1/ports/HTTP"); got != port {
		t.Fatalf("over etcd ports/HTTP = %q, want the laptop's %q", got, port)
	}
	if got := team.ok("ls $M/app/stacks/s1/holders"); got != "me\n" {
		t.Fatalf("over etcd the holders are %q", got)
	}
	team.Stop()

	back := filepath.Join(t.TempDir(), "back")
	if r := migrate(store, back); r.Code != 0 {
		t.Fatalf("migrate back: %+v", r)
	}
	if out, err := exec.Command(binary, "verify", "--data", back).CombinedOutput(); err != nil {
		t.Fatalf("verify the copy back: %v\n%s", err, out)
	}
	if r := migrate(store, laptop.Data); r.Code == 0 || !strings.Contains(r.Stderr, "nothing was changed") {
		t.Fatalf("migrate into the laptop's own store: %+v, want refused", r)
	}
}
