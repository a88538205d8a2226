package integration

import (
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// `cockpitfs unmount` of a mount whose daemon is stopped (SIGSTOP) returns, detaching the mount
// and saying so, instead of blocking in stat(2) beyond SIGINT's reach.
func TestUnmountOfHungDaemonDetaches(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app")
	daemon := m.cmd.Process
	if err := daemon.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { daemon.Signal(syscall.SIGCONT) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "unmount", m.Dir).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("unmount of a hung daemon did not return in 30s: %s", out)
	}
	if err != nil || !strings.Contains(string(out), "did not answer") || !strings.Contains(string(out), "detached it lazily") {
		t.Fatalf("unmount: %v\n%s", err, out)
	}
	if mounted(m.Dir) {
		t.Error("the hung mount is still mounted")
	}
	t.Logf("unmount said: %s", out)
	// Resumed, the daemon finds its connection gone and exits.
	daemon.Signal(syscall.SIGCONT)
	select {
	case <-m.done:
		m.cmd = nil
	case <-time.After(15 * time.Second):
		t.Errorf("the resumed daemon did not exit after its mount was detached")
	}
}
