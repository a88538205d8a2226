package integration

import (
	"context"
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/liveness"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"
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

	announced, resume := pausePastAnnouncement(t, cluster, "pause", bootP, paused)
	if got := other.ok("grep state= $M/app/stacks/p1/holders/hp1"); got != "state=dead\n" {
		t.Fatalf("the paused machine's holder reads %q elsewhere, want dead", got)
	}

	resume()
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

// A daemon continued after its announcement expired, while etcd has no quorum, keeps no holder:
// a write to its holder through a descriptor opened before the pause is refused EAGAIN, its log
// names the refusal (the events file cannot be written without a quorum), and once the quorum is
// back the stack is as it was and the next touch announces the machine first. The refusal is
// STATE_LOCKED: the write reads the stack before it proves the machine, and without a quorum that
// read fails first (MACHINE_UNANNOUNCED is a store answering reads but not the lease:
// storage/etcdstore TestProveAnnouncement).
func TestTeamPausedDaemonWithoutQuorumRefuses(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 3)
	store := cluster.URL("unannounced")
	bootP := "b1b1b1b1-0000-4000-8000-0000000000b1"
	other := newEtcdMount(t, store, liveness.TestBootIDEnv+"=c2c2c2c2-0000-4000-8000-0000000000c2")
	other.setupApp(5, map[string]int{"HTTP": 18290}, "p1")
	paused := newEtcdMountTimeout(t, store, 3*time.Second, liveness.TestBootIDEnv+"="+bootP)
	paused.ok("touch $M/app/stacks/p1/holders/hp1")
	holder := other.ok("cat $M/app/stacks/p1/holders/hp1")
	revision := other.read("app/stacks/p1/revision")
	// A raw descriptor: Go's os.File polls a FUSE file, and waits forever on a write's EAGAIN.
	fd, err := unix.Open(filepath.Join(paused.Dir, "app/stacks/p1/holders/hp1"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Closed below; a test that fails before must not leave the mount busy behind it.
	t.Cleanup(func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	})

	announced, resume := pausePastAnnouncement(t, cluster, "unannounced", bootP, paused)
	cluster.Stop(1)
	cluster.Stop(2)
	resume()
	_, err = unix.Write(fd, []byte("pid=none checkout=/src/p1\n"))
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	fd = -1
	if !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("a holder write while the machine cannot be announced: %v, want EAGAIN", err)
	}
	if !regexp.MustCompile(`app/stacks/p1/holders/hp1: EAGAIN (STATE_LOCKED|MACHINE_UNANNOUNCED): .*\(not in events`).MatchString(paused.log.String()) {
		t.Errorf("the daemon's log names no refusal of the holder:\n%s", paused.log.String())
	}

	cluster.Restart(1)
	cluster.Restart(2)
	if got := other.ok("cat $M/app/stacks/p1/holders/hp1"); got != holder {
		t.Errorf("after the refusal the holder reads %q elsewhere, want %q as before", got, holder)
	}
	if got := other.read("app/stacks/p1/revision"); got != revision {
		t.Errorf("the refused write changed the stack: revision %q, was %q", got, revision)
	}
	paused.ok("touch $M/app/stacks/p1/holders/hp1")
	if announced() != 1 {
		t.Errorf("the touch that worked did not announce the machine first (%d announcements)", announced())
	}
}

// pausePastAnnouncement stops m (SIGSTOP) until its machine's announcement under prefix has
// expired; it returns a count of the machine's announcements and resume, which continues m
// (SIGCONT; done when the test ends otherwise).
func pausePastAnnouncement(t *testing.T, cluster *etcdtest.Cluster, prefix, boot string, m *mount) (announced func() int64, resume func()) {
	t.Helper()
	cli := cluster.Open(t, prefix).Client()
	announced = func() int64 {
		resp, err := cli.Get(context.Background(), prefix+"/m/"+boot+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	if announced() != 1 {
		t.Fatalf("the daemon's machine is not announced")
	}
	if err := m.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if err := m.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(resume)
	for deadline := time.Now().Add(engine.MachineTTL + 20*time.Second); announced() != 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the paused daemon's announcement never expired")
		}
	}
	return announced, resume
}
