package testtool

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The group's member is reached after its leader ended and was waited for: what a cleanup of a
// shell whose child stayed blocked in a mount needs.
func TestGroupSignalerReachesTheGroupAfterItsLeader(t *testing.T) {
	leader := exec.Command("sh", "-c", `sleep 60 & echo $!`)
	leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	line := StartReady(t, leader)
	signal := GroupSignaler(t, leader.Process.Pid)
	member, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	KillAtEnd(t, member)
	leader.Wait()
	signal(syscall.SIGKILL)
	for deadline := time.Now().Add(10 * time.Second); !Gone(member); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the member %d lives on after its group was killed", member)
		}
	}
}

// A lock file naming a process that does not hold it open (a daemon that ended, its pid since
// someone else's) gets no signal sent.
func TestSignalDaemonOfSparesAStranger(t *testing.T) {
	stranger := exec.Command("sleep", "60")
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stranger.Process.Kill(); stranger.Wait() })
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "cockpitfs.lock"), []byte(strconv.Itoa(stranger.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if pid := SignalDaemonOf(data, syscall.SIGKILL); pid != 0 {
		t.Fatalf("signalled %d, which does not hold the lock", pid)
	}
	time.Sleep(50 * time.Millisecond)
	if Gone(stranger.Process.Pid) {
		t.Fatal("the stranger was killed")
	}
}
