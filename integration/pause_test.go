package integration

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/liveness"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A daemon paused past its machine's announcement (SIGSTOP: a suspended laptop, a stopped
// container) proves its machine again before it makes a holder: the holder it makes the moment it
// is continued reads alive (unknown) on the other machine, and a claim there keeps it.
func TestTeamPausedDaemonReannouncesBeforeAHolder(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	store := cluster.URL("pause")
	bootP := "b0b0b0b0-0000-4000-8000-0000000000b0"
	other := newEtcdMount(t, store, liveness.TestBootIDEnv+"=c1c1c1c1-0000-4000-8000-0000000000c1")
	other.setupApp(5, map[string]int{"HTTP": 18280}, "p1")
	paused := newEtcdMount(t, store, liveness.TestBootIDEnv+"="+bootP)
	paused.ok("touch $M/app/stacks/p1/holders/hp1")

	cli := cluster.Open(t, "pause").Client()
	announced := func() int64 {
		resp, err := cli.Get(context.Background(), "pause/m/"+bootP+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	if announced() != 1 {
		t.Fatalf("the daemon's machine is not announced")
	}
	if err := paused.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	t.Cleanup(func() {
		if stopped {
			paused.cmd.Process.Signal(syscall.SIGCONT)
		}
	})
	deadline := time.Now().Add(engine.MachineTTL + 20*time.Second)
	for announced() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the paused daemon's announcement never expired")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := other.ok("grep state= $M/app/stacks/p1/holders/hp1"); got != "state=dead\n" {
		t.Fatalf("the paused machine's holder reads %q elsewhere, want dead", got)
	}

	if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	// At once, before the keep-alive that failed during the pause has been noticed.
	paused.ok("mkdir $M/app/stacks/p3 && touch $M/app/stacks/p3/holders/hp")
	if announced() != 1 {
		t.Fatalf("a holder was made while the machine is not announced (%d announcements)", announced())
	}
	if got := other.ok("grep state= $M/app/stacks/p3/holders/hp"); got != "state=unknown\n" {
		t.Fatalf("the fresh holder reads %q on the other machine, want unknown (alive elsewhere)", got)
	}
	other.ok("touch $M/app/stacks/p3/holders/hb")
	if got := strings.Fields(other.ok("ls $M/app/stacks/p3/holders")); strings.Join(got, " ") != "hb hp" {
		t.Fatalf("a claim on the other machine left holders %v, want the fresh one kept", got)
	}
}
