package liveness

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary act as a helper instead of running tests: inside a fresh pid
// namespace to reproduce pid reuse, or as another user to meet EPERM.
const helperEnv = "LIVENESS_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "pid-reuse":
		report(reusePid())
	case "observe":
		report(observeAsHelper(os.Getenv("LIVENESS_TEST_PID")))
	default:
		report("", fmt.Errorf("unknown helper %q", os.Getenv(helperEnv)))
	}
}

func report(result string, err error) {
	if err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
	fmt.Println("OK:", result)
	os.Exit(0)
}

// skipUnlessCI skips with the reason, except under CI=true, where a missing capability is a failure.
func skipUnlessCI(t *testing.T, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true, so this cannot be skipped: %s", reason)
	}
	t.Skipf("NOT TESTED: %s", reason)
}

// TestPidReuse reproduces pid reuse for real: in a pid namespace of its own, the helper kills a
// process, steers the next fork onto the same pid through ns_last_pid, and checks that the
// stranger on the old pid proves the old process gone.
func TestPidReuse(t *testing.T) {
	requireLinux(t)
	if os.Geteuid() != 0 {
		skipUnlessCI(t, "pid reuse needs root to write /proc/sys/kernel/ns_last_pid (running as uid %d)", os.Geteuid())
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		skipUnlessCI(t, "pid reuse needs unshare(1): %v", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(unshare, "--pid", "--fork", "--mount-proc", self)
	cmd.Env = append(os.Environ(), helperEnv+"=pid-reuse")
	out, err := cmd.CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil && !strings.Contains(text, "FAIL:") && !strings.Contains(text, "OK:") {
		skipUnlessCI(t, "unshare --pid --fork --mount-proc is not permitted here: %v: %s", err, text)
	}
	if err != nil || !strings.HasPrefix(text, "OK:") {
		t.Fatalf("pid reuse helper: %v\n%s", err, text)
	}
	t.Log(text)
}

// reusePid runs as pid 1 of a new pid namespace with its own /proc.
func reusePid() (string, error) {
	first, err := startHelperSleep()
	if err != nil {
		return "", err
	}
	pid := first.Process.Pid
	before := Observe(pid)
	if before.State != Present || !IsStart(before.Start) {
		return "", fmt.Errorf("Observe(first sleep %d) = %+v, want present", pid, before)
	}
	_ = first.Process.Kill()
	_ = first.Wait()
	if gone := Observe(pid); gone.State != Absent {
		return "", fmt.Errorf("Observe(killed sleep %d) = %+v, want absent", pid, gone)
	}
	// Start times are in clock ticks (10 ms at USER_HZ=100): respawning within the same tick
	// would give the stranger the old identity.
	time.Sleep(30 * time.Millisecond)

	// The runtime's own threads take pids from the same namespace, so a thread created between
	// the write and the fork can steal the pid; retry.
	var second *exec.Cmd
	for attempt := 0; attempt < 20; attempt++ {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
			return "", fmt.Errorf("steer the next pid: %w", err)
		}
		candidate, err := startHelperSleep()
		if err != nil {
			return "", err
		}
		if candidate.Process.Pid == pid {
			second = candidate
			break
		}
		_ = candidate.Process.Kill()
		_ = candidate.Wait()
	}
	if second == nil {
		return "", fmt.Errorf("could not get pid %d again after 20 attempts", pid)
	}
	defer func() { _ = second.Process.Kill(); _ = second.Wait() }()

	after := Observe(pid)
	switch {
	case after.State != Present || !IsStart(after.Start):
		return "", fmt.Errorf("Observe(reused pid %d) = %+v, want present", pid, after)
	case after.Start == before.Start:
		return "", fmt.Errorf("the stranger on pid %d has the old identity %q", pid, before.Start)
	case !Gone(before.Start, after):
		return "", fmt.Errorf("Gone(%q, %+v) = false: pid reuse not detected", before.Start, after)
	case Gone(after.Start, after):
		return "", fmt.Errorf("Gone(%q, %+v) = true for the live stranger itself", after.Start, after)
	}
	return fmt.Sprintf("pid %d reused: %s then %s", pid, before.Start, after.Start), nil
}

func startHelperSleep() (*exec.Cmd, error) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start sleep: %w", err)
	}
	return cmd, nil
}

// TestObserveAsOtherUser observes a root process from an unprivileged user: signal 0 answers
// EPERM, and the process must still read present.
func TestObserveAsOtherUser(t *testing.T) {
	requireLinux(t)
	if os.Geteuid() != 0 {
		skipUnlessCI(t, "needs root to run a helper as uid 65534 (running as uid %d); TestObserveOtherUsersProcess covers init instead", os.Geteuid())
	}
	// The test binary sits in a private build directory; copy it where uid 65534 can run it.
	dir, err := os.MkdirTemp("", "liveness-helper-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	binary := filepath.Join(dir, "liveness.test")
	if err := copyExecutable(binary); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary)
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), helperEnv+"=observe", "LIVENESS_TEST_PID="+strconv.Itoa(os.Getpid()))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil && !strings.Contains(text, "FAIL:") {
		skipUnlessCI(t, "cannot run a helper as uid 65534 from %s (noexec?): %v: %s", dir, err, text)
	}
	want := "OK: EPERM " + Observe(os.Getpid()).Start
	if err != nil || text != want {
		t.Fatalf("helper as uid 65534: %v\n got %q\nwant %q", err, text, want)
	}
}

// observeAsHelper runs as uid 65534 and observes a root process.
func observeAsHelper(pidText string) (string, error) {
	pid, err := strconv.Atoi(pidText)
	if err != nil {
		return "", err
	}
	if err := unix.Kill(pid, 0); err != unix.EPERM {
		return "", fmt.Errorf("kill(%d, 0) as uid %d = %v, want EPERM; the test would not exercise it", pid, os.Geteuid(), err)
	}
	obs := Observe(pid)
	if obs.State != Present {
		return "", fmt.Errorf("Observe(%d) as uid %d = %+v, want present", pid, os.Geteuid(), obs)
	}
	return "EPERM " + obs.Start, nil
}

func copyExecutable(to string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	src, err := os.Open(self)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}
