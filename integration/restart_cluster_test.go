package integration

import (
	"strings"
	"testing"

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
