package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// A daemon killed the moment its mount answers must die: it must make no request to its own
// mount that the kill would leave unanswered (go-fuse's poll hack did, and left a zombie holding
// the mount and the store's lock). Then the next daemon starts on the same store and mount point.
// Each round spins on a CPU until the mount answers: 10 rounds in the suite, 200 in the long runs
// (scripts/long, COCKPITFS_LONG=1).
func TestStartupKillLeavesNoZombie(t *testing.T) {
	t.Parallel()
	rounds := 10
	if os.Getenv("COCKPITFS_LONG") != "" {
		rounds = 200
	}
	base := t.TempDir()
	mnt, data := filepath.Join(base, "mnt"), filepath.Join(base, "data")
	t.Cleanup(func() { detach(mnt) })
	for round := range rounds {
		cmd := exec.Command(binary, "mount", "--data", data, mnt)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// The kill lands as soon as the mount answers, when the daemon may still be finishing its
		// start-up.
		for !mounted(mnt) || !answers(mnt) {
			select {
			case err := <-done:
				t.Fatalf("round %d: daemon exited before mounting: %v", round, err)
			default: // spin: the kill must land while the daemon is still starting
			}
		}
		cmd.Process.Kill()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the killed daemon (pid %d) did not die: a thread waits on its own mount", round, cmd.Process.Pid)
		}
	}
	m := &mount{t: t, ns: ownNetns(t), Dir: mnt, Data: data}
	m.start()
	t.Cleanup(m.stop)
	m.ok("ls $M")
}

func answers(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "README"))
	return err == nil
}
