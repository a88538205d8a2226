package integration

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage/etcdstore"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
)

// Every member of the cluster killed and restarted with its data: a stack one daemon makes right
// after is seen by the other at its next read ("the next open sees it", docs/teams.md), never
// ENOENT.
func TestTeamWholeClusterRestart(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 3)
	store := cluster.URL("restart")
	a := newEtcdMount(t, store)
	b := newEtcdMount(t, store)
	a.setupApp(5, map[string]int{"HTTP": 18380}, "before")
	b.ok("touch $M/app/stacks/before/holders/hb")
	for round := range 1 {
		for i := range 3 {
			cluster.Stop(i)
		}
		cluster.RestartAll()
		name := "after" + string(rune('a'+round))
		a.ok("mkdir $M/app/stacks/" + name + " && touch $M/app/stacks/" + name + "/holders/h")
		port := a.read("app/stacks", name, "ports/HTTP")
		if got := b.sh("cat $M/app/stacks/" + name + "/ports/HTTP"); got.Code != 0 || got.Stdout != port {
			t.Fatalf("round %d: the other daemon reads %q (exit %d, %s), want %q", round, got.Stdout, got.Code, strings.TrimSpace(got.Stderr), port)
		}
		if got := b.sh("ls $M/app/stacks/" + name + "/holders"); got.Stdout != "h\n" {
			t.Fatalf("round %d: the other daemon lists holders %q (%s)", round, got.Stdout, got.Stderr)
		}
	}
}

// The cluster restored from a snapshot older than what a running daemon has seen: the daemon
// refuses to serve the prefix (EIO), its log says why and that a restart reads it anew; a
// restarted daemon serves the restored state.
func TestTeamRestoredClusterIsRefused(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	store := cluster.URL("restored")
	m := newEtcdMount(t, store)
	m.setupApp(5, map[string]int{"HTTP": 18480}, "s1")
	snap := cluster.Snapshot()
	for _, s := range []string{"s2", "s3", "s4", "s5"} {
		m.ok("mkdir $M/app/stacks/" + s)
	}
	cluster.RestoreFrom(snap)
	r := m.sh("ls $M/app/stacks")
	if r.Code == 0 || !strings.Contains(r.Stderr, "Input/output error") {
		t.Fatalf("ls after the restore: exit %d, %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if log := m.log.String(); !strings.Contains(log, "revision went backward") || !strings.Contains(log, "restart it") {
		t.Fatalf("the daemon's log does not say why:\n%s", log)
	}
	m.Stop()
	m.start(m.args...)
	if got := m.ok("ls $M/app/stacks"); got != "s1\n" {
		t.Fatalf("a restarted daemon lists %q, want the restored s1 alone", got)
	}
}

// What a daemon saw of its store names a restore, and another cluster, to the commands that start
// afterwards: `verify --store` reports the cluster's revision gone backward (restored from an older
// snapshot, by etcd's own restore) with the command that restarts the daemon, and exits 1; the
// restarted daemon logs it and serves the prefix as it now is, and verify is clean again. The same
// for a new cluster behind the same endpoints, which the running daemon refuses.
func TestTeamVerifyNamesARestore(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	store := cluster.URL("verified")
	m := newEtcdMount(t, store)
	m.setupApp(5, map[string]int{"HTTP": 18580}, "s1")
	snap := cluster.Snapshot()
	for _, s := range []string{"s2", "s3", "s4"} {
		m.ok("mkdir $M/app/stacks/" + s)
	}
	_, high := cluster.Open(t, "verified").Seen()
	m.ok("ls $M/app/stacks") // a read at high or later
	cfg, err := etcdstore.ParseURL(store)
	if err != nil {
		t.Fatal(err)
	}
	seen := etcdstore.SeenPath(m.Data, cfg)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if was, _ := etcdstore.ReadSeen(seen); was.Revision >= high {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not record revision %d in %s", high, seen)
		}
	}
	verify := func() cliRun {
		return cockpitfs(t, "verify", "--store", store, "--data", m.Data, "--command-timeout", "10s")
	}

	cluster.RestoreFrom(snap)
	_, restored := cluster.Open(t, "verified").Seen()
	v := verify()
	backward := regexp.MustCompile(`revision went backward from (\d+) to (\d+): ` + regexp.QuoteMeta(store) + ` was restored from an older snapshot\?`).FindStringSubmatch(v.out)
	if v.code != 1 || backward == nil || !strings.Contains(v.out, "cockpitfs unmount "+m.Dir+", then cockpitfs mount --store "+store) {
		t.Fatalf("verify after the restore: exit %d\n%s", v.code, v.out)
	}
	if from, _ := strconv.ParseInt(backward[1], 10, 64); from < high || backward[2] != strconv.FormatInt(restored, 10) {
		t.Fatalf("verify names %s -> %s, want from %d or later to %d", backward[1], backward[2], high, restored)
	}
	m.Stop()
	m.start(m.args...)
	if log := m.log.String(); !strings.Contains(log, "revision went backward") || !strings.Contains(log, "serving the prefix as it is now") {
		t.Fatalf("the restarted daemon's log does not name the restore:\n%s", log)
	}
	if got := m.ok("ls $M/app/stacks"); got != "s1\n" {
		t.Fatalf("the restarted daemon lists %q, want the restored s1 alone", got)
	}
	if v := verify(); v.code != 0 {
		t.Fatalf("verify once the daemon was restarted: exit %d\n%s", v.code, v.out)
	}

	cluster.Replace()
	if r := m.sh("ls $M/app/stacks"); r.Code == 0 || !strings.Contains(r.Stderr, "Input/output error") {
		t.Fatalf("ls from another cluster: exit %d, %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if v := verify(); v.code != 1 || !strings.Contains(v.out, "another etcd cluster answers at "+store) || !strings.Contains(v.out, "cockpitfs unmount "+m.Dir) {
		t.Fatalf("verify after the replacement: exit %d\n%s", v.code, v.out)
	}
	m.Stop()
	m.start(m.args...)
	if log := m.log.String(); !strings.Contains(log, "another etcd cluster answers") || !strings.Contains(log, "serving the prefix as it is now") {
		t.Fatalf("the restarted daemon's log does not name the other cluster:\n%s", log)
	}
	m.ok("mkdir $M/app") // the new cluster's prefix is empty; verify when the test ends is clean
}
