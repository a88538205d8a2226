package testtool

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// A test's cleanup often signals a process that may have ended long before it runs (a daemon's
// sweep killed it, the test killed it itself). By then its pid, or the number of its process
// group, may be another test's process: the kernel reuses pids, and TestLivenessPidReuse steers
// the allocator back onto recent ones, so within milliseconds. A kill by number then ends that
// process instead (another test's server gone, and that test failing for no reason of its own).
// These signal through a pidfd, opened while the process is known to be the test's.

// KillAtEnd kills process pid when t ends, as it is now: pid must be alive and the test's (its
// child, or a process it just started that has not had time to end). A process gone by then is
// left alone, whoever has its number.
func KillAtEnd(t testing.TB, pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone already: nothing to kill
	}
	t.Cleanup(func() {
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		unix.Close(fd)
	})
}

// GroupSignaler returns what signals the process group that pid leads, pid being the test's
// child, started and not yet waited for. It reaches the group's members after the leader ended
// and was waited for, and nothing once they are all gone, whoever then has the group's number
// (PIDFD_SIGNAL_PROCESS_GROUP, Linux 6.9; before that, a kill of the number). The pidfd is
// closed when t ends.
func GroupSignaler(t testing.TB, pid int) func(syscall.Signal) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd of %d: %v", pid, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return func(sig syscall.Signal) {
		if err := unix.PidfdSendSignal(fd, sig, nil, unix.PIDFD_SIGNAL_PROCESS_GROUP); errors.Is(err, unix.EINVAL) {
			syscall.Kill(-pid, sig)
		}
	}
}

// SignalDaemonOf signals the daemon serving data, if one still runs: the process data's lock
// file names, and only while that process holds the lock file open (the file keeps the pid of a
// daemon that ended, which may be anyone's number since). It returns the pid signalled, or 0.
func SignalDaemonOf(data string, sig syscall.Signal) int {
	lock := filepath.Join(data, "cockpitfs.lock")
	b, err := os.ReadFile(lock)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	// Checked after the pidfd is open: a process found holding the lock now is the pidfd's, or
	// the pidfd's has ended and the signal reaches no one.
	if real, err := filepath.EvalSymlinks(lock); err == nil {
		lock = real // as /proc shows it
	}
	if !holdsOpen(pid, lock) || unix.PidfdSendSignal(fd, sig, nil, 0) != nil {
		return 0
	}
	return pid
}

// holdsOpen says whether process pid has path open.
func holdsOpen(pid int, path string) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && target == path {
			return true
		}
	}
	return false
}

// Gone says whether process pid has ended: no such process, or one nobody has reaped yet (a
// zombie; a daemonised process is reparented away from the test that started it).
func Gone(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	text := string(stat)
	fields := strings.Fields(text[strings.LastIndexByte(text, ')')+1:])
	return len(fields) > 0 && (fields[0] == "Z" || fields[0] == "X")
}
