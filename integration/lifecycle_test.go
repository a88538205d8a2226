package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// SPEC §1: the command line and the daemon's lifecycle, through the real binary.

// lifecycleSetup makes a cockpit with a stack holding two holders, an active lease and a few
// events, so a restart has every kind of record to lose.
func lifecycleSetup(m *mount, base int) {
	m.t.Helper()
	m.setupApp(20, map[string]int{"HTTP": base, "DB": base + 1}, "s1", "s2")
	m.ok("touch $M/app/stacks/s1/holders/alpha && touch $M/app/stacks/s1/holders/beta")
	// A refusal, so the events files hold both kinds of line.
	m.refused("echo pid=nope > $M/app/stacks/s1/holders/alpha", syscall.EINVAL)
	if got := m.read("app/stacks/s1/revision"); got != "2\n" {
		m.t.Fatalf("revision after two claims = %q", got)
	}
}

// lifecycleSnapshot reads every file the setup made records for, keyed by path.
func lifecycleSnapshot(m *mount) map[string]string {
	m.t.Helper()
	snap := map[string]string{}
	for _, p := range []string{
		"app/config", "app/events",
		"app/stacks/s1/record", "app/stacks/s1/revision", "app/stacks/s1/lease", "app/stacks/s1/events",
		"app/stacks/s1/env", "app/stacks/s1/ports/HTTP", "app/stacks/s1/ports/DB",
		"app/stacks/s1/holders/alpha", "app/stacks/s1/holders/beta",
		"app/stacks/s2/record", "app/stacks/s2/revision",
	} {
		snap[p] = m.read(p)
	}
	// Directory listings: a lost stack, holder or port index entry shows here.
	snap["ls stacks"] = m.ok("ls $M/app/stacks")
	snap["ls holders"] = m.ok("ls $M/app/stacks/s1/holders")
	snap["ls ports"] = m.ok("ls $M/ports")
	snap["ls /"] = m.ok("ls $M")
	return snap
}

func lifecycleSameSnapshot(t *testing.T, before, after map[string]string) {
	t.Helper()
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s changed across the restart:\nbefore: %q\nafter:  %q", k, v, after[k])
		}
	}
}

// lifecycleRun runs the binary with a bound (so a hang fails rather than blocks the suite).
func lifecycleRun(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("cockpitfs %v did not finish within 60s\nstdout: %s\nstderr: %s", args, out.String(), errb.String())
	}
	r := result{Stdout: out.String(), Stderr: errb.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.Code = exit.ExitCode()
	case err != nil:
		t.Fatalf("cockpitfs %v: %v", args, err)
	}
	return r
}

var lifecycleClean = regexp.MustCompile(`(?m)^(\d+) records clean$`)

// lifecycleVerifyClean runs `cockpitfs verify` on a stopped daemon's store and wants exit 0 and
// "N records clean" with N the stacks made.
func lifecycleVerifyClean(t *testing.T, data string, records int) {
	t.Helper()
	r := lifecycleRun(t, "verify", "--data", data)
	match := lifecycleClean.FindStringSubmatch(r.Stdout)
	if r.Code != 0 || match == nil || match[1] != strconv.Itoa(records) {
		t.Fatalf("verify: want exit 0 and %q, got exit %d\nstdout: %s\nstderr: %s", fmt.Sprintf("%d records clean", records), r.Code, r.Stdout, r.Stderr)
	}
}

// lifecycleRestartKeeps starts the daemon again on m's store and checks it serves every record of
// before, and keeps working on them: a third claim moves on from revision 2.
func lifecycleRestartKeeps(t *testing.T, m *mount, before map[string]string) {
	t.Helper()
	m.start()
	lifecycleSameSnapshot(t, before, lifecycleSnapshot(m))
	m.ok("touch $M/app/stacks/s1/holders/gamma")
	if got := m.read("app/stacks/s1/revision"); got != "3\n" {
		t.Fatalf("revision after a claim on the restarted daemon = %q", got)
	}
}

// lifecycleSignal sends sig to the daemon and returns how it exited; it fails the test if the
// daemon is still running after the harness's 15 s.
func lifecycleSignal(m *mount, sig syscall.Signal) error {
	m.t.Helper()
	m.cmd.Process.Signal(sig)
	select {
	case err := <-m.done:
		m.cmd = nil
		return err
	case <-time.After(15 * time.Second):
		m.cmd.Process.Kill()
		<-m.done
		m.cmd = nil
		m.t.Fatalf("daemon still running 15s after %v\n%s", sig, m.log)
		return nil
	}
}

func TestLifecycleCleanRestartKeepsRecords(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	lifecycleSetup(m, 31000)
	before := lifecycleSnapshot(m)

	// While the daemon holds the store, verify refuses and names it.
	r := lifecycleRun(t, "verify", "--data", m.Data)
	pid := strconv.Itoa(m.cmd.Process.Pid)
	if r.Code == 0 || !strings.Contains(r.Stderr, pid) {
		t.Fatalf("verify while daemon %s runs: want non-zero naming the pid, got exit %d\nstdout: %s\nstderr: %s", pid, r.Code, r.Stdout, r.Stderr)
	}

	m.Stop()
	if mounted(m.Dir) {
		t.Fatalf("%s still mounted after SIGTERM", m.Dir)
	}
	lifecycleVerifyClean(t, m.Data, 2)
	lifecycleRestartKeeps(t, m, before)
	m.Stop()
	lifecycleVerifyClean(t, m.Data, 2)
}

// A crash loses nothing: every acknowledged change is on disk. The restarted daemon serves on a
// fresh mount point here, so this test depends only on durability, not on stale-mount clearing.
func TestLifecycleKillRestartKeepsRecords(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	lifecycleSetup(m, 31100)
	before := lifecycleSnapshot(m)

	m.Kill()
	detach(m.Dir)
	lifecycleVerifyClean(t, m.Data, 2)
	m.Dir = filepath.Join(t.TempDir(), "mnt-after-kill")
	lifecycleRestartKeeps(t, m, before)
	m.Stop()
	lifecycleVerifyClean(t, m.Data, 2)
}

// After kill -9 the mount point is left "transport endpoint is not connected"; a new daemon on
// the same mount point must clear it itself and serve the same records.
func TestLifecycleKillRestartClearsStaleMount(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	lifecycleSetup(m, 31200)
	before := lifecycleSnapshot(m)

	m.Kill()
	// The crash leaves the mount behind, dead: the case under test.
	if !mounted(m.Dir) {
		t.Fatalf("no dead mount left on %s after kill -9 (the test cannot show the stale-mount case)", m.Dir)
	}
	var st unix.Stat_t
	if err := unix.Stat(m.Dir, &st); !errors.Is(err, unix.ENOTCONN) {
		t.Fatalf("stat of the dead mount = %v, want ENOTCONN", err)
	}
	lifecycleVerifyClean(t, m.Data, 2)

	lifecycleRestartKeeps(t, m, before) // same mount point, no detach in between

	// Twice in a row, then a clean stop: still every record, and only one mount on the point.
	before = lifecycleSnapshot(m)
	m.Kill()
	m.start()
	lifecycleSameSnapshot(t, before, lifecycleSnapshot(m))
	info, _ := os.ReadFile("/proc/self/mountinfo")
	if n := strings.Count(string(info), " "+m.Dir+" "); n != 1 {
		t.Errorf("%d mounts stacked on %s after two crash restarts, want 1", n, m.Dir)
	}
	m.Stop()
	lifecycleVerifyClean(t, m.Data, 2)
}

func TestLifecycleSecondDaemonSameData(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	other := filepath.Join(t.TempDir(), "mnt2")
	t.Cleanup(func() { detach(other) })
	r := lifecycleRun(t, "mount", "--data", m.Data, other)
	pid := strconv.Itoa(m.cmd.Process.Pid)
	if r.Code == 0 || !strings.Contains(r.Stderr, pid) {
		t.Fatalf("second daemon on the data dir of %s: want non-zero naming that pid, got exit %d\nstdout: %s\nstderr: %s", pid, r.Code, r.Stdout, r.Stderr)
	}
	if mounted(other) {
		t.Fatalf("the refused daemon left a mount on %s", other)
	}
	// The first daemon is unharmed.
	m.ok("mkdir $M/still-here")
}

func TestLifecycleMountOnLiveMount(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	data := filepath.Join(t.TempDir(), "data2")
	r := lifecycleRun(t, "mount", "--data", data, m.Dir)
	if r.Code == 0 {
		t.Fatalf("mount on the live mount %s exited 0\nstdout: %s\nstderr: %s", m.Dir, r.Stdout, r.Stderr)
	}
	if !strings.Contains(r.Stderr, m.Dir) {
		t.Errorf("the refusal does not name the mount point %s: %s", m.Dir, r.Stderr)
	}
	// Exactly one mount on the directory, still ours and serving.
	data2, _ := os.ReadFile("/proc/self/mountinfo")
	if n := strings.Count(string(data2), " "+m.Dir+" "); n != 1 {
		t.Fatalf("%d mounts on %s after the refused mount, want 1", n, m.Dir)
	}
	m.ok("mkdir $M/still-here")
}

// lifecycleDaemonPID reads the pid the daemon wrote into its lock file.
func lifecycleDaemonPID(data string) int {
	b, err := os.ReadFile(filepath.Join(data, "cockpitfs.lock"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

func TestLifecycleDaemonMode(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	mnt, data := filepath.Join(base, "mnt"), filepath.Join(base, "data")
	pid := 0
	// Whatever happens, no daemon and no mount outlive the test.
	t.Cleanup(func() {
		testtool.SignalDaemonOf(data, syscall.SIGKILL)
		detach(mnt)
	})

	r := lifecycleRun(t, "mount", "--daemon", "--data", data, mnt)
	pid = lifecycleDaemonPID(data)
	if r.Code != 0 {
		t.Fatalf("mount --daemon: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	// Right after it returns, no waiting: the mount must already serve.
	ls := shIn(t, "/", `ls "$MNT"`, "MNT="+mnt)
	if ls.Code != 0 || !strings.Contains(ls.Stdout, "README") {
		t.Fatalf("ls right after mount --daemon returned: exit %d\nstdout: %s\nstderr: %s", ls.Code, ls.Stdout, ls.Stderr)
	}
	if pid == 0 {
		t.Fatalf("no daemon pid in %s", filepath.Join(data, "cockpitfs.lock"))
	}
	if !strings.Contains(r.Stdout, strconv.Itoa(pid)) {
		t.Errorf("mount --daemon output does not name the daemon's pid %d: %q", pid, r.Stdout)
	}
	// The daemon serves on after the command returned: a real change works.
	shIn(t, "/", `mkdir "$MNT/app"`, "MNT="+mnt)
	if _, err := os.Stat(filepath.Join(mnt, "app", "stacks")); err != nil {
		t.Fatal(err)
	}

	u := lifecycleRun(t, "unmount", mnt)
	if u.Code != 0 {
		t.Fatalf("unmount: exit %d\nstdout: %s\nstderr: %s", u.Code, u.Stdout, u.Stderr)
	}
	if mounted(mnt) {
		t.Fatalf("%s still mounted after cockpitfs unmount", mnt)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !testtool.Gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("daemon %d still running 15s after cockpitfs unmount", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// It closed the store: verify can take it and finds the cockpit (no stacks yet: 0 records).
	lifecycleVerifyClean(t, data, 0)
}

func TestLifecycleDaemonUnusableData(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	mnt, data := filepath.Join(base, "mnt"), filepath.Join(base, "data")
	t.Cleanup(func() { detach(mnt) })
	if err := os.WriteFile(data, []byte("not a directory\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := lifecycleRun(t, "mount", "--daemon", "--data", data, mnt)
	if r.Code == 0 {
		t.Fatalf("mount --daemon with a file as data dir exited 0\nstdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	}
	if !strings.Contains(r.Stderr, "not a directory") || !strings.Contains(r.Stderr, data) {
		t.Fatalf("mount --daemon with a file as data dir: the reason (%s: not a directory) is missing: %q", data, r.Stderr)
	}
	if mounted(mnt) {
		t.Fatalf("the failed daemon left a mount on %s", mnt)
	}
}

// Every signal a terminal or a session manager sends to end a foreground daemon unmounts it:
// Ctrl-C, kill, the terminal closing (SIGHUP), Ctrl-\ (SIGQUIT).
func TestLifecycleSignalsUnmountAndExitZero(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT} {
		t.Run(sig.String(), func(t *testing.T) {
			m := newMount(t)
			m.ok("mkdir $M/app")
			if err := lifecycleSignal(m, sig); err != nil {
				t.Fatalf("daemon exit after %v: %v\n%s", sig, err, m.log)
			}
			if mounted(m.Dir) {
				t.Fatalf("%s still in mountinfo after %v", m.Dir, sig)
			}
			lifecycleVerifyClean(t, m.Data, 0)
		})
	}
}

func TestLifecycleSIGTERMWithOpenFile(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	// A process holding a file open on the mount makes a plain unmount EBUSY.
	holder := exec.Command("bash", "-c", `exec sleep 100 < "$M/README"`)
	holder.Env = append(os.Environ(), "M="+m.Dir)
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	held := make(chan struct{})
	go func() { holder.Wait(); close(held) }()
	t.Cleanup(func() {
		holder.Process.Kill()
		<-held
	})
	// Wait until the redirection has opened README (sleep has replaced bash).
	deadline := time.Now().Add(10 * time.Second)
	for {
		link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/0", holder.Process.Pid))
		if link == filepath.Join(m.Dir, "README") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sleep never opened README (fd 0 = %q)", link)
		}
		time.Sleep(10 * time.Millisecond)
	}

	if err := lifecycleSignal(m, syscall.SIGTERM); err != nil {
		t.Errorf("daemon exit after SIGTERM with a busy mount: %v\n%s", err, m.log)
	}
	if mounted(m.Dir) {
		t.Fatalf("%s still in mountinfo after SIGTERM with a busy mount", m.Dir)
	}
	// The store was closed: verify can open it.
	lifecycleVerifyClean(t, m.Data, 0)
}

func TestLifecycleVersion(t *testing.T) {
	t.Parallel()
	r := lifecycleRun(t, "version")
	if r.Code != 0 || !regexp.MustCompile(`^cockpitfs \S+ .*go1\.\S+, with(out)? team mode .*\n$`).MatchString(r.Stdout) {
		t.Fatalf("version: exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
	}
}

func TestLifecycleMountWithoutArgs(t *testing.T) {
	t.Parallel()
	r := lifecycleRun(t, "mount")
	if r.Code == 0 || !strings.Contains(r.Stderr, "usage") || !strings.Contains(r.Stderr, "cockpitfs mount") {
		t.Fatalf("mount without args: want non-zero with usage, got exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
}

// lifecycleReadmeFirstCommand is the first line of the README's first ```sh block, without its
// trailing comment.
func lifecycleReadmeFirstCommand(readme string) string {
	in := false
	for _, line := range strings.Split(readme, "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			in = !in
		case in && strings.TrimSpace(line) != "":
			if i := strings.Index(line, "#"); i >= 0 {
				line = line[:i]
			}
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// The README opens with the command a newcomer types first; it must work as written, from the
// repository root, with ~ and the default store in a throwaway home.
func TestLifecycleReadmeFirstCommand(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("README.md does not exist yet (it is being written)")
	}
	if err != nil {
		t.Fatal(err)
	}
	command := lifecycleReadmeFirstCommand(string(readme))
	if !strings.Contains(command, "cockpitfs mount") {
		t.Fatalf("the README's first command is %q; this test knows how to run a foreground `cockpitfs mount` only", command)
	}
	home, err := os.MkdirTemp("", "cockpitfs-home")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	mnt := filepath.Join(home, "cockpit")

	// The throwaway HOME must not send go to an empty module cache or build cache.
	goEnv := map[string]string{}
	for _, k := range []string{"GOCACHE", "GOMODCACHE", "GOPATH"} {
		out, err := exec.Command("go", "env", k).Output()
		if err != nil {
			t.Fatal(err)
		}
		goEnv[k] = strings.TrimSpace(string(out))
	}
	cmd := exec.Command("bash", "-c", command)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_STATE_HOME=", "PATH="+filepath.Dir(binary)+":"+os.Getenv("PATH"))
	for k, v := range goEnv {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	// Its own process group, so SIGINT reaches every process in it, as Ctrl-C does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	signal := testtool.GroupSignaler(t, cmd.Process.Pid)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	exited := false
	t.Cleanup(func() {
		if !exited {
			signal(syscall.SIGKILL)
			<-done
		}
		detach(mnt)
	})

	// `go run` compiles first: allow it a minute to serve.
	deadline := time.Now().Add(60 * time.Second)
	for !serving(mnt) {
		select {
		case err := <-done:
			exited = true
			t.Fatalf("%q exited before serving %s: %v\n%s", command, mnt, err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q: %s not serving after 60s\n%s", command, mnt, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	shIn(t, "/", `mkdir "$MNT/app" && ls "$MNT/app/stacks"`, "MNT="+mnt)
	// The comment's promise: the store is ~/.local/state/cockpitfs.
	if _, err := os.Stat(filepath.Join(home, ".local", "state", "cockpitfs", "cockpitfs.lock")); err != nil {
		t.Errorf("the default store is not in ~/.local/state/cockpitfs: %v", err)
	}

	// "Ctrl-C unmounts".
	signal(syscall.SIGINT)
	select {
	case <-done:
		// Not the exit status: `go run` exits 1 whenever it is interrupted, whatever its child
		// did (cmd/go/internal/work/exec.go). The daemon's own exit 0 on SIGINT is
		// TestLifecycleSignalsUnmountAndExitZero's.
		exited = true
	case <-time.After(30 * time.Second):
		t.Fatalf("%q still running 30s after Ctrl-C\n%s", command, log.String())
	}
	if mounted(mnt) {
		t.Fatalf("%s still mounted after Ctrl-C", mnt)
	}
	// Unmounted and the store closed: verify can take the default store.
	lifecycleVerifyClean(t, filepath.Join(home, ".local", "state", "cockpitfs"), 0)
}
