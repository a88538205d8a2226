package integration

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
)

// newEtcdMount starts a daemon serving prefix of the cluster. It runs in the test's network
// namespace, where the cluster listens; over etcd a daemon takes no machine-wide port holds.
func newEtcdMount(t *testing.T, store string) *mount {
	t.Helper()
	base := t.TempDir()
	m := &mount{t: t, Dir: filepath.Join(base, "mnt"), Data: filepath.Join(base, "data"), Store: store}
	m.start("--store", store)
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
	a.setupApp(5, map[string]int{"HTTP": 18080}, "s1")
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
}
