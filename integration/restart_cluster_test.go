package integration

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
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

// A daemon whose etcd member missed every change while etcd compacted past its watch, then the
// same member replaced (removed, added again empty, with a new id): at each, the changes the other
// daemon made are seen at the next read — a stack made, a holder released — never ENOENT or a
// holder gone elsewhere still listed, and what this daemon writes then is seen by the other.
func TestTeamCompactionAndReplacedMember(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 3)
	ends := cluster.Endpoints()
	a := newEtcdMount(t, "etcd://"+ends[1]+","+ends[2]+"/moved")
	b := newEtcdMount(t, "etcd://"+ends[0]+"/moved") // through member 0 alone
	a.setupApp(5, map[string]int{"HTTP": 18580}, "s1")
	a.ok("touch $M/app/stacks/s1/holders/ha $M/app/stacks/s1/holders/hx")
	if got := b.ok("ls $M/app/stacks/s1/holders"); got != "ha\nhx\n" {
		t.Fatalf("before: holders %q", got)
	}
	seen := func(when, stack string) {
		t.Helper()
		port := a.read("app/stacks", stack, "ports/HTTP")
		if got := b.sh("cat $M/app/stacks/" + stack + "/ports/HTTP"); got.Code != 0 || got.Stdout != port {
			t.Fatalf("%s: the other daemon reads %q (exit %d, %s), want %q", when, got.Stdout, got.Code, strings.TrimSpace(got.Stderr), port)
		}
		if got := b.ok("ls $M/app/stacks/s1/holders"); got != "ha\n" {
			t.Fatalf("%s: the other daemon lists s1's holders %q, want ha alone", when, got)
		}
		b.ok("touch $M/app/stacks/" + stack + "/holders/hb")
		if got := a.ok("ls $M/app/stacks/" + stack + "/holders"); got != "h\nhb\n" {
			t.Fatalf("%s: a holder the other daemon made is not listed: %q", when, got)
		}
		a.ok("rm $M/app/stacks/" + stack + "/holders/hb")
	}

	cluster.DropReplies(0) // b hears nothing from here on
	a.ok("mkdir $M/app/stacks/s2 && touch $M/app/stacks/s2/holders/h && rm $M/app/stacks/s1/holders/hx")
	cli := cluster.Open(t, "moved").Client()
	head, err := cli.Get(context.Background(), "moved/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(context.Background(), head.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	cluster.Cut(0) // b's connection comes back; its watch would resume below the compaction
	seen("after the compaction", "s2")

	a.ok("touch $M/app/stacks/s1/holders/hx")
	cluster.ReplaceMember(0)
	a.ok("mkdir $M/app/stacks/s3 && touch $M/app/stacks/s3/holders/h && rm $M/app/stacks/s1/holders/hx")
	seen("after the member was replaced", "s3")
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
	cfg, err := etcdconf.ParseURL(store)
	if err != nil {
		t.Fatal(err)
	}
	seen := etcdconf.SeenPath(m.Data, cfg)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if was, _ := etcdconf.ReadSeen(seen); was.Revision >= high {
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
