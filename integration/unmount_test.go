package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// The mount/unmount lifecycle of the command line (SPEC §1), as root and as a user.

// unmountNobodyCockpit makes a cockpit with a stack holding a holder, as the mount's user, and
// returns what it reads back: the records a restart must keep.
func unmountNobodyCockpit(m *mount) string {
	m.t.Helper()
	m.ok(`mkdir $M/app && printf '[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 38980\n' | cat > $M/app/config &&
mkdir $M/app/stacks/s && touch $M/app/stacks/s/holders/me`)
	return unmountNobodyRecords(m)
}

func unmountNobodyRecords(m *mount) string {
	m.t.Helper()
	return m.ok(`cat $M/app/config $M/app/stacks/s/record $M/app/stacks/s/revision $M/app/stacks/s/ports/HTTP; ls $M/app/stacks $M/app/stacks/s/holders`)
}

// unmountMounts counts the mounts on dir in mountinfo.
func unmountMounts(dir string) int {
	info, _ := os.ReadFile("/proc/self/mountinfo")
	return strings.Count(string(info), " "+dir+" ")
}

// A user's daemon killed with SIGKILL leaves a dead mount; the user's next mount clears it itself
// (through fusermount3, as a user may not unmount) and serves the same records. Without this a
// systemd user unit restarting the daemon loops on "operation not permitted".
func TestNonRootKillRestartClearsStaleMount(t *testing.T) {
	t.Parallel()
	m := machineNobodyMountIn(t, ownNetns(t))
	before := unmountNobodyCockpit(m)
	m.Kill()
	if !mounted(m.Dir) {
		t.Fatalf("no dead mount left on %s after kill -9 (the test cannot show the stale-mount case)", m.Dir)
	}
	m.start() // fails the test, with the daemon's log, if it does not serve
	if after := unmountNobodyRecords(m); after != before {
		t.Fatalf("records after the restart:\n%s\nbefore:\n%s", after, before)
	}
	if n := unmountMounts(m.Dir); n != 1 {
		t.Fatalf("%d mounts on %s after the restart, want 1", n, m.Dir)
	}
}

// unmountNobodyCwdInside starts a process of uid 65534 whose cwd is dir, as a user's shell in the
// mount is; it is killed when the test ends.
func unmountNobodyCwdInside(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", "-c", `cd "$D" && exec sleep 100`)
	cmd.Env = append(os.Environ(), "D="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	deadline := time.Now().Add(10 * time.Second)
	for {
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", cmd.Process.Pid))
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", cmd.Process.Pid))
		if cwd == dir && strings.HasSuffix(exe, "/sleep") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the process never settled in %s (cwd %q, exe %q)", dir, cwd, exe)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SIGTERM to a user's daemon whose mount is busy (a shell's cwd inside) detaches the mount through
// fusermount3 and exits 0: no dead mount is left behind, and the store is closed.
func TestNonRootSIGTERMWithBusyMount(t *testing.T) {
	t.Parallel()
	m := machineNobodyMountIn(t, ownNetns(t))
	unmountNobodyCockpit(m)
	unmountNobodyCwdInside(t, m.Dir)
	if err := lifecycleSignal(m, syscall.SIGTERM); err != nil {
		t.Errorf("daemon exit after SIGTERM with a busy mount: %v\n%s", err, m.log)
	}
	if mounted(m.Dir) {
		t.Fatalf("%s still in mountinfo after SIGTERM with a busy mount\n%s", m.Dir, m.log)
	}
	if log := m.log.String(); strings.Contains(log, "not permitted") {
		t.Fatalf("the daemon's log:\n%s", log)
	}
	if r := lifecycleRun(t, "verify", "--data", m.Data); r.Code != 0 || r.Stdout != "1 record clean\n" {
		t.Fatalf("verify after the stop: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
}

// `cockpitfs unmount MNT` returns once the daemon serving MNT has exited and released its store,
// so the next command on the store (verify, backup, restore, mount) finds it free: as README's
// "cockpitfs unmount ~/cockpit  # the daemon exits" says. Several times in a row, since the
// window it closes was a few milliseconds; as root and as a user (through fusermount3).
func TestUnmountThenVerifyRightAway(t *testing.T) {
	t.Parallel()
	for _, user := range []string{"root", "nobody"} {
		t.Run(user, func(t *testing.T) {
			base := t.TempDir()
			cli := func(args ...string) *exec.Cmd { return exec.Command(binary, args...) }
			if user == "nobody" {
				if os.Geteuid() != 0 {
					t.Skip("runs as root to become uid 65534")
				}
				base = nonrootDir(t)
				path := nonrootPath(t)
				cli = func(args ...string) *exec.Cmd { return nonrootCommand(path, args...) }
			}
			mnt, data := base+"/mnt", base+"/data"
			t.Cleanup(func() {
				testtool.SignalDaemonOf(data, syscall.SIGKILL)
				detach(mnt)
			})
			for i := 0; i < 3; i++ {
				if out, err := cli("mount", "--daemon", "--data", data, mnt).CombinedOutput(); err != nil {
					t.Fatalf("round %d: mount --daemon: %v\n%s", i, err, out)
				}
				pid := lifecycleDaemonPID(data)
				if out, err := cli("unmount", mnt).CombinedOutput(); err != nil || string(out) != "unmounted "+mnt+"\n" {
					t.Fatalf("round %d: unmount: %v\n%s", i, err, out)
				}
				if !testtool.Gone(pid) {
					t.Errorf("round %d: the daemon (pid %d) is still running when unmount has returned", i, pid)
				}
				if out, err := cli("verify", "--data", data).CombinedOutput(); err != nil || string(out) != "0 records clean\n" {
					t.Fatalf("round %d: verify right after unmount: %v\n%s", i, err, out)
				}
				if mounted(mnt) {
					t.Fatalf("round %d: %s still mounted", i, mnt)
				}
			}
		})
	}
}

// `cockpitfs unmount` unmounts cockpitfs mounts only: another filesystem (a tmpfs here; as root it
// could be /home) is refused, exit 1, and stays mounted with its files.
func TestUnmountRefusesOtherFilesystems(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("runs as root to mount a tmpfs")
	}
	dir := t.TempDir() + "/tmpfs"
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { detach(dir) })
	if err := os.WriteFile(dir+"/mine", []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := lifecycleRun(t, "unmount", dir)
	t.Logf("unmount of a tmpfs: exit %d, stderr %q", r.Code, r.Stderr)
	if r.Code != 1 || !strings.Contains(r.Stderr, dir+" is a tmpfs mount, not a cockpitfs one") {
		t.Fatalf("unmount of a tmpfs: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if !mounted(dir) {
		t.Fatal("the tmpfs was unmounted")
	}
	if got, err := os.ReadFile(dir + "/mine"); err != nil || string(got) != "mine\n" {
		t.Fatalf("the tmpfs's file: %q, %v", got, err)
	}
}

// A mountpoint named through a symlink (ln -s real lnk; mount lnk/mp) is the mount on real/mp,
// which mountinfo lists: unmount finds it, a second mount is refused as "already mounted", and a
// crash restart clears the dead mount, all through the symlink.
func TestMountpointThroughSymlink(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	real, data := base+"/real", base+"/data"
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", base+"/lnk"); err != nil {
		t.Fatal(err)
	}
	mnt, via := real+"/mp", base+"/lnk/mp"
	t.Cleanup(func() {
		testtool.SignalDaemonOf(data, syscall.SIGKILL)
		detach(mnt)
	})
	if r := lifecycleRun(t, "mount", "--daemon", "--data", data, via); r.Code != 0 || !mounted(mnt) {
		t.Fatalf("mount through the symlink: exit %d, mounted %v\nstdout: %s\nstderr: %s", r.Code, mounted(mnt), r.Stdout, r.Stderr)
	}
	shIn(t, "/", `mkdir "$M/app"`, "M="+via)

	r := lifecycleRun(t, "mount", "--data", base+"/data2", via)
	if r.Code != 1 || !strings.Contains(r.Stderr, mnt+" is already mounted and serving") {
		t.Fatalf("a second mount through the symlink: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}

	pid := testtool.SignalDaemonOf(data, syscall.SIGKILL)
	if pid == 0 {
		t.Fatal("no daemon of " + data + " to kill")
	}
	for !testtool.Gone(pid) {
		time.Sleep(10 * time.Millisecond)
	}
	if r := lifecycleRun(t, "mount", "--daemon", "--data", data, via); r.Code != 0 {
		t.Fatalf("restart through the symlink after kill -9: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if n := unmountMounts(mnt); n != 1 {
		t.Fatalf("%d mounts on %s after the restart, want 1", n, mnt)
	}
	if _, err := os.Stat(mnt + "/app/stacks"); err != nil {
		t.Fatalf("the cockpit after the restart: %v", err)
	}

	if r := lifecycleRun(t, "unmount", via); r.Code != 0 || r.Stdout != "unmounted "+mnt+"\n" {
		t.Fatalf("unmount through the symlink: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if mounted(mnt) {
		t.Fatalf("%s still mounted", mnt)
	}
}

// The NOT-MOUNTED note's "Start one" command starts a daemon on the same store with the same
// access: its --data (quoted for the shell) and --allow-other, not the default store.
func TestNotMountedNoteRestartsTheSameStore(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	m := &mount{t: t, ns: ownNetns(t), Dir: base + "/mnt", Data: base + "/my data's"}
	m.start("--allow-other")
	t.Cleanup(m.stop)
	m.ok("mkdir $M/app")
	m.Stop()

	note, err := os.ReadFile(m.Dir + "/NOT-MOUNTED")
	if err != nil {
		t.Fatal(err)
	}
	var start string
	for _, line := range strings.Split(string(note), "\n") {
		if s, ok := strings.CutPrefix(line, "Start one:"); ok {
			start = strings.TrimSpace(s)
		}
	}
	want := "cockpitfs mount --data '" + base + `/my data'\''s' --allow-other ` + m.Dir
	if start != want {
		t.Fatalf("NOT-MOUNTED's command: %q, want %q\n%s", start, want, note)
	}
	// Followed (in the background), it serves the cockpit made before, open to other users.
	t.Cleanup(func() {
		testtool.SignalDaemonOf(m.Data, syscall.SIGKILL)
		detach(m.Dir)
	})
	r := shIn(t, "/", start+" --daemon", "PATH="+filepath.Dir(binary)+":"+os.Getenv("PATH"))
	if r.Code != 0 {
		t.Fatalf("%s --daemon: exit %d\n%s%s", start, r.Code, r.Stdout, r.Stderr)
	}
	if _, err := os.Stat(m.Dir + "/app/stacks"); err != nil {
		t.Fatalf("the cockpit made before, after following NOT-MOUNTED: %v", err)
	}
	if info, _ := os.ReadFile("/proc/self/mountinfo"); !regexp.MustCompile(regexp.QuoteMeta(" "+m.Dir+" ") + `.*allow_other`).Match(info) {
		t.Errorf("the mount is not allow_other:\n%s", info)
	}
	if r := lifecycleRun(t, "unmount", m.Dir); r.Code != 0 {
		t.Fatalf("unmount: exit %d\n%s", r.Code, r.Stderr)
	}
}

// A refused mount leaves nothing new behind: no mountpoint, no NOT-MOUNTED note, no data dir.
// Refused because the store is in use, because the mountpoint is a file or not empty, and (as a
// user) because fusermount3 refuses a mountpoint the user may not write.
func TestMountRefusedLeavesNothing(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	absent := func(paths ...string) {
		t.Helper()
		for _, p := range paths {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("the refused mount left %s behind", p)
			}
		}
	}

	m := newMount(t)
	r := lifecycleRun(t, "mount", "--data", m.Data, base+"/new/mnt")
	t.Logf("store in use: exit %d, %s", r.Code, r.Stderr)
	if r.Code != 1 || !strings.Contains(r.Stderr, fmt.Sprintf("in use by cockpitfs process %d", m.cmd.Process.Pid)) {
		t.Fatalf("mount on a store in use: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	absent(base + "/new")

	if err := os.WriteFile(base+"/file", []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, daemon := range []string{"--daemon=false", "--daemon"} {
		r = lifecycleRun(t, "mount", daemon, "--data", base+"/data-file", base+"/file")
		t.Logf("mountpoint is a file (%s): exit %d, %s", daemon, r.Code, r.Stderr)
		if r.Code != 1 || !strings.Contains(r.Stderr, "not a directory") {
			t.Fatalf("mount %s on a file: exit %d\nstdout: %s\nstderr: %s", daemon, r.Code, r.Stdout, r.Stderr)
		}
		absent(base + "/data-file")
	}

	if err := os.Mkdir(base+"/full", 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(base+"/full/mine", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r = lifecycleRun(t, "mount", "--data", base+"/data-full", base+"/full")
	t.Logf("mountpoint not empty: exit %d, %s", r.Code, r.Stderr)
	if r.Code != 1 || !strings.Contains(r.Stderr, "is not empty") {
		t.Fatalf("mount on a non-empty directory: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	absent(base+"/data-full", base+"/full/NOT-MOUNTED")
	if st, _ := os.Stat(base + "/full"); st.Mode().Perm() != 0o750 {
		t.Errorf("the refused mount changed %s to mode %v", base+"/full", st.Mode())
	}

	if os.Geteuid() != 0 {
		return
	}
	home := nonrootDir(t)
	if err := os.Mkdir(home+"/roots", 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := nonrootCommand(nonrootPath(t), "mount", "--data", home+"/data", home+"/roots")
	out, err := cmd.CombinedOutput()
	t.Logf("fusermount3 refuses: %v, %s", err, out)
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "fusermount3 refused the mount") {
		t.Fatalf("a user's mount on root's directory: %v\n%s", err, out)
	}
	if mounted(home + "/roots") {
		t.Fatal("mounted")
	}
	absent(home + "/data")
}

// unmountCwdInside starts a root process whose cwd is dir; it is killed when the test ends (or
// by the returned func).
func unmountCwdInside(t *testing.T, dir string) (kill func()) {
	t.Helper()
	cmd := exec.Command("bash", "-c", `cd "$D" && exec sleep 100`)
	cmd.Env = append(os.Environ(), "D="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	kill = func() { cmd.Process.Kill(); <-exited }
	t.Cleanup(kill)
	for deadline := time.Now().Add(10 * time.Second); ; {
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", cmd.Process.Pid))
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", cmd.Process.Pid))
		if cwd == dir && strings.HasSuffix(exe, "/sleep") {
			return kill
		}
		if time.Now().After(deadline) {
			t.Fatalf("the process never settled in %s", dir)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Unmount of a busy mount (a shell's cwd inside) is refused, exit 1, naming the cause and the ways
// out; the mount keeps serving. `unmount --lazy` then detaches it, and the daemon exits once the
// last user is gone.
func TestUnmountBusySaysWhatToDo(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app")
	kill := unmountCwdInside(t, m.Dir)
	r := lifecycleRun(t, "unmount", m.Dir)
	t.Logf("unmount of a busy mount: exit %d, %s", r.Code, r.Stderr)
	for _, want := range []string{m.Dir + " is busy: something has files open or a cwd inside it", "fuser -vm " + m.Dir, "cockpitfs unmount --lazy " + m.Dir} {
		if r.Code != 1 || !strings.Contains(r.Stderr, want) {
			t.Errorf("unmount of a busy mount: exit %d, stderr lacks %q:\n%s", r.Code, want, r.Stderr)
		}
	}
	if !serving(m.Dir) {
		t.Fatal("the refused unmount stopped the mount")
	}
	r = lifecycleRun(t, "unmount", "--lazy", m.Dir)
	if r.Code != 0 || !strings.Contains(r.Stdout, "detached "+m.Dir) {
		t.Fatalf("unmount --lazy: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if mounted(m.Dir) {
		t.Fatal("still mounted after unmount --lazy")
	}
	kill()
	select {
	case err := <-m.done:
		m.cmd = nil
		if err != nil {
			t.Errorf("the daemon's exit: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the daemon still runs 15 s after its lazily detached mount's last user left")
	}
}

// A user's unmount of another user's mount is refused, saying whose it is; the mount keeps serving.
func TestUnmountOtherUsersMount(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("runs as root to become uid 65534")
	}
	m := newMount(t)
	cmd := nonrootCommand(nonrootPath(t), "unmount", m.Dir)
	out, err := cmd.CombinedOutput()
	t.Logf("uid 65534's unmount of root's mount: %v, %s", err, out)
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), m.Dir+" is another user's mount (uid 0)") {
		t.Fatalf("uid 65534's unmount of root's mount: %v\n%s", err, out)
	}
	if !serving(m.Dir) {
		t.Fatal("the refused unmount stopped the mount")
	}
}

// A user's unmount of its busy mount (through fusermount3) is refused the same way; --lazy
// detaches it.
func TestNonRootUnmountBusy(t *testing.T) {
	t.Parallel()
	m := machineNobodyMountIn(t, ownNetns(t))
	unmountNobodyCwdInside(t, m.Dir)
	path := nonrootPath(t)
	cmd := nonrootCommand(path, "unmount", m.Dir)
	out, err := cmd.CombinedOutput()
	t.Logf("uid 65534's unmount of its busy mount: %v, %s", err, out)
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), m.Dir+" is busy: something has files open or a cwd inside it") {
		t.Fatalf("uid 65534's unmount of its busy mount: %v\n%s", err, out)
	}
	if !mounted(m.Dir) {
		t.Fatal("the refused unmount unmounted")
	}
	if out, err := nonrootCommand(path, "unmount", "--lazy", m.Dir).CombinedOutput(); err != nil || mounted(m.Dir) {
		t.Fatalf("unmount --lazy: %v, mounted %v\n%s", err, mounted(m.Dir), out)
	}
}

// Unmount of a mount busy only for a moment (a process leaving it, as the daemon's own helper's
// lookup after a drain does) waits it out and unmounts, exit 0.
func TestUnmountWaitsOutAMomentaryUser(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app")
	kill := unmountCwdInside(t, m.Dir)
	time.AfterFunc(300*time.Millisecond, kill)
	r := lifecycleRun(t, "unmount", m.Dir)
	if r.Code != 0 || !strings.Contains(r.Stdout, "unmounted "+m.Dir) {
		t.Fatalf("unmount while a process leaves the mount: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if mounted(m.Dir) {
		t.Fatal("still mounted after unmount")
	}
}
