package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// Help for the program and each command: exit 0, the usage on stdout, nothing on stderr, and no
// command acting on "--help" as an argument.
func TestCLIHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--help"}, {"-h"}, {"help"}, {"help", "mount"}, {"mount", "--help"}, {"mount", "-h"},
		{"unmount", "--help"}, {"umount", "-h"}, {"verify", "--help"}, {"exec", "--help"},
		{"completion", "--help"}, {"version", "--help"}, {"mount", "/nonexistent/x", "--help"},
	} {
		r := lifecycleRun(t, args...)
		if r.Code != 0 || !strings.HasPrefix(r.Stdout, "usage: cockpitfs") || r.Stderr != "" {
			t.Errorf("cockpitfs %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.Code, r.Stdout, r.Stderr)
		}
	}
	if r := lifecycleRun(t, "help", "mount"); !strings.Contains(r.Stdout, "--nonempty") || !strings.Contains(r.Stdout, "--log-level") {
		t.Errorf("mount's usage misses its flags:\n%s", r.Stdout)
	}
	if _, err := os.Stat("/nonexistent/x"); err == nil {
		t.Error("mount --help made its mountpoint")
	}
}

// A command line that cannot run: exit 2, what is wrong and the usage on stderr, nothing done.
func TestCLIUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		says string
	}{
		{nil, "no command given"},
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"mount"}, "mount takes one MOUNTPOINT"},
		{[]string{"mount", "--log-level", "loud", filepath.Join(dir, "m")}, `--log-level "loud" is not error, info or debug`},
		{[]string{"mount", "--no-such-flag", filepath.Join(dir, "m")}, "unknown flag --no-such-flag"},
		{[]string{"verify", "-x"}, "unknown flag --x"},
		{[]string{"unmount"}, "unmount takes one MOUNTPOINT"},
		{[]string{"exec", filepath.Join(dir, "s")}, "exec needs -- and the command to run after it"},
		{[]string{"completion", "zsh"}, "completion supports bash only"},
		{[]string{"git", "install-hook", "--cockpit", "../../etc", dir}, "--cockpit ../../etc is not a cockpit name"},
		{[]string{"git", "install-hook", "--cockpit", "a$(x)b", dir}, "--cockpit a$(x)b is not a cockpit name"},
		{[]string{"git", "install-hook", "--cockpit", "status", dir}, "--cockpit status is not a cockpit name"},
		{[]string{"help", "bogus"}, `unknown command "bogus"`},
	} {
		r := lifecycleRun(t, c.args...)
		if r.Code != 2 || r.Stdout != "" || !strings.Contains(r.Stderr, c.says) || !strings.Contains(r.Stderr, "usage: cockpitfs") {
			t.Errorf("cockpitfs %s: want exit 2 saying %q with the usage on stderr; got exit %d\nstdout: %s\nstderr: %s",
				strings.Join(c.args, " "), c.says, r.Code, r.Stdout, r.Stderr)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a refused command line made %v", entries)
	}
}

// version names what the binary was built from: built from a git checkout of this tree, that
// commit.
func TestCLIVersion(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "git")
	// This working tree, committed in a repository of its own: what is tested is what is here.
	repo := t.TempDir()
	files, err := exec.Command("git", "-C", "..", "ls-files", "-co", "--exclude-standard").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(files)) {
		data, err := os.ReadFile(filepath.Join("..", f))
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the working tree
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(repo, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(repo, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git := func(args ...string) string {
		out, err := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@t.invalid"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	git("add", "-A")
	git("commit", "-qm", "test")
	head := git("rev-parse", "HEAD")
	bin := filepath.Join(t.TempDir(), "cockpitfs")
	build := exec.Command("go", "build", "-o", bin, "./cmd/cockpitfs")
	build.Dir = repo
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=true")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	want := "revision " + head + ", committed "
	if err != nil || !strings.HasPrefix(string(out), "cockpitfs ") || !strings.Contains(string(out), want) || !strings.Contains(string(out), " go1.") {
		t.Fatalf("version: %v\n%q, want it to name %q", err, out, want)
	}
}

// verify refuses, with exit 2, a directory that is missing (and does not create it), a file, or a
// directory that holds no store.
func TestCLIVerifyRefusesNonStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for path, says := range map[string]string{
		filepath.Join(dir, "typo"): "does not exist",
		file:                       "is not a directory",
		dir:                        "holds no cockpitfs store",
	} {
		r := lifecycleRun(t, "verify", "--data", path)
		if r.Code != 2 || !strings.Contains(r.Stderr, path+" "+says) || strings.Contains(r.Stdout, "clean") {
			t.Errorf("verify --data %s: want exit 2 saying %q; got exit %d\nstdout: %s\nstderr: %s", path, says, r.Code, r.Stdout, r.Stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "typo")); !os.IsNotExist(err) {
		t.Errorf("verify made the missing directory: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("verify wrote into a directory that holds no store: %v", entries)
	}
}

// Without HOME (cron, some containers) the default store is below the account's home, as a
// login would have set it, never below / (where root would have made it unasked).
func TestCLIDefaultStoreWithoutHOME(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPING: runs as root to become uid 65534")
	}
	account, err := user.LookupId("65534")
	if err != nil || account.HomeDir == "" {
		t.Skipf("SKIPPING: uid 65534 has no home in the user database (%v)", err)
	}
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", binary, "verify")
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, _ := cmd.CombinedOutput()
	if want := filepath.Join(account.HomeDir, ".local", "state", "cockpitfs") + " does not exist"; !strings.Contains(string(out), want) {
		t.Fatalf("verify without HOME as uid 65534: %s\nwant it to say %q", out, want)
	}
}

// backup and migrate of a directory that holds no store say so, and create nothing.
func TestCLIBackupOfNoStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing, out := filepath.Join(dir, "typo"), filepath.Join(dir, "out.backup")
	r := lifecycleRun(t, "backup", "--data", missing, out)
	if r.Code != 1 || !strings.Contains(r.Stderr, missing+" does not exist (give the store with --data DIR)") {
		t.Errorf("backup --data %s: exit %d\nstdout: %s\nstderr: %s", missing, r.Code, r.Stdout, r.Stderr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a refused backup made %v", entries)
	}
}

// One record is counted in the singular.
func TestCLIVerifySingular(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app $M/app/stacks/s")
	m.Stop()
	r := lifecycleRun(t, "verify", "--data", m.Data)
	if r.Code != 0 || r.Stdout != "1 record clean\n" {
		t.Fatalf("verify: exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
	}
}

// Bash completes commands, each command's flags and --log-level's values.
func TestCLICompletion(t *testing.T) {
	t.Parallel()
	complete := func(words ...string) string {
		script := fmt.Sprintf(`source <(%q completion bash) || exit 1
COMP_WORDS=(%s); COMP_CWORD=%d; _cockpitfs; echo "${COMPREPLY[*]}"`, binary, quoteWords(words), len(words)-1)
		r := shIn(t, t.TempDir(), script)
		if r.Code != 0 || r.Stderr != "" {
			t.Fatalf("completion of %v: exit %d\n%s%s", words, r.Code, r.Stdout, r.Stderr)
		}
		return strings.TrimSpace(r.Stdout)
	}
	for words, want := range map[string]string{
		"cockpitfs mo":                    "mount",
		"cockpitfs ve":                    "verify version",
		"cockpitfs mount --da":            "--daemon --data",
		"cockpitfs mount --log-level d":   "debug",
		"cockpitfs verify --da":           "--data",
		"cockpitfs mount --k":             "--key",
		"cockpitfs verify --pa":           "--password",
		"cockpitfs migrate --u":           "--user",
		"cockpitfs unmount --l":           "--lazy",
		"cockpitfs help un":               "unmount",
		"cockpitfs completion ":           "bash",
		"cockpitfs exec --h":              "--help --holder",
		"cockpitfs exec /s -- basenam":    "basename",
		"cockpitfs unmount --nonexistent": "",
		"cockpitfs name h":                "holder",
	} {
		if got := complete(strings.Split(words, " ")...); got != want {
			t.Errorf("%q completes to %q, want %q", words, got, want)
		}
	}
}

// A directory whose name holds a space completes as one word, wherever a path is completed.
func TestCLICompletionSpaces(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "my cockpit"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, words := range [][]string{{"cockpitfs", "mount", "my"}, {"cockpitfs", "mount", "--data", "my"}, {"cockpitfs", "name", "stack", "my"}} {
		script := fmt.Sprintf(`source <(%q completion bash) || exit 1
COMP_WORDS=(%s); COMP_CWORD=%d; _cockpitfs; printf '%%s|' "${COMPREPLY[@]}"`, binary, quoteWords(words), len(words)-1)
		if r := shIn(t, dir, script); r.Code != 0 || r.Stdout != "my cockpit|" {
			t.Errorf("completion of %v: exit %d, %q (want one word, \"my cockpit\")\n%s", words, r.Code, r.Stdout, r.Stderr)
		}
	}
}

func quoteWords(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = strconv.Quote(w)
	}
	return strings.Join(q, " ")
}

// While no daemon serves it, the mountpoint refuses writes (mode 0555) and holds a note saying
// why; the next mount serves on it as before.
func TestMountpointReadOnlyWhileNotServing(t *testing.T) {
	t.Parallel()
	home := nonrootDir(t)
	m := &mount{t: t, ns: ownNetns(t), Dir: filepath.Join(home, "cockpit"), Data: filepath.Join(t.TempDir(), "data")}
	if err := os.Mkdir(m.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(m.Dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	m.start()
	t.Cleanup(m.stop)
	m.ok("mkdir $M/app")
	m.Stop()

	st, err := os.Stat(m.Dir)
	if err != nil || st.Mode().Perm() != 0o555 {
		t.Fatalf("the unmounted mountpoint: %v, mode %v; want 0555", err, st.Mode())
	}
	note, err := os.ReadFile(filepath.Join(m.Dir, "NOT-MOUNTED"))
	if err != nil || !strings.Contains(string(note), "cockpitfs mount --data "+m.Data+" "+m.Dir) {
		t.Fatalf("NOT-MOUNTED: %v\n%s", err, note)
	}
	// Its owner's writes are refused, and say so.
	r := shIn(t, "/", `exec setpriv --reuid=65534 --regid=65534 --clear-groups bash -c 'mkdir "$M/app"; cat > "$M/config" </dev/null'`, "M="+m.Dir)
	if r.Code == 0 || strings.Count(r.Stderr, "Permission denied") != 2 {
		t.Fatalf("writes into the unmounted mountpoint: exit %d\n%s", r.Code, r.Stderr)
	}
	if entries, _ := os.ReadDir(m.Dir); len(entries) != 1 {
		t.Fatalf("the unmounted mountpoint holds %v", entries)
	}
	// gc says no daemon serves it, and how to start one: with the flags the note names (its
	// --data: without it, the default store, another namespace).
	if r := cockpitfs(t, "gc", m.Dir+"/"); r.code != 1 || !strings.Contains(r.out, "no cockpitfs daemon serves "+m.Dir+": start one with cockpitfs mount --daemon "+m.Dir) || !strings.Contains(r.out, "NOT-MOUNTED names them") {
		t.Fatalf("gc on the unmounted mountpoint: exit %d\n%s", r.code, r.out)
	}
	// Mounted again, the tree is back: the cockpit made before.
	m.start()
	if got := m.ok("ls $M"); !strings.Contains(got, "app\n") {
		t.Fatalf("after a remount: %q", got)
	}
}

// Mounting over a directory that holds anything is refused, naming what is there, unless asked
// for with --nonempty.
func TestMountNonEmptyRefused(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	mnt, data := filepath.Join(base, "mnt"), filepath.Join(base, "data")
	if err := os.MkdirAll(filepath.Join(mnt, "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "notes.txt"), []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { detach(mnt) })
	for _, daemon := range [][]string{nil, {"--daemon"}} {
		r := lifecycleRun(t, append(append([]string{"mount", "--data", data}, daemon...), mnt)...)
		if r.Code != 1 || !strings.Contains(r.Stderr, mnt+" is not empty (app, notes.txt)") || !strings.Contains(r.Stderr, "--nonempty") {
			t.Fatalf("mount %v over a non-empty directory: exit %d\nstdout: %s\nstderr: %s", daemon, r.Code, r.Stdout, r.Stderr)
		}
		if mounted(mnt) {
			t.Fatal("mounted over a non-empty directory")
		}
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "notes.txt")); err != nil || string(got) != "mine\n" {
		t.Fatalf("the user's file: %q, %v", got, err)
	}
	m := &mount{t: t, ns: ownNetns(t), Dir: mnt, Data: data}
	m.start("--nonempty")
	t.Cleanup(m.stop)
	if got := m.ok("ls $M"); got != "README\ngc\nports\nstatus\nstatus.json\n" {
		t.Fatalf("ls of the mount over a non-empty directory: %q", got)
	}
}

// `mount --daemon` that cannot mount prints fusermount3's own words, what to do about them and
// the log file, and exits 1: a mountpoint the user cannot write to, and --allow-other where
// /etc/fuse.conf does not allow it.
func TestMountDaemonFailureSaysWhy(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("runs as root to become uid 65534")
	}
	testtool.Need(t, "fusermount3")
	fusermount, _ := exec.LookPath("fusermount3")
	conf, _ := os.ReadFile("/etc/fuse.conf")
	allowOtherAllowed := strings.Contains("\n"+string(conf), "\nuser_allow_other")
	for _, c := range []struct {
		name      string
		rootOwned bool // the mountpoint belongs to root
		flags     []string
		says, fix string
	}{
		{"mountpoint not writable", true, nil, "user has no write access to mountpoint", "fix: mount on a directory you own"},
		{"allow_other not allowed", false, []string{"--allow-other"}, "option allow_other only allowed if 'user_allow_other' is set", "fix: as root, add the line user_allow_other to /etc/fuse.conf"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.flags != nil && allowOtherAllowed {
				t.Skip("/etc/fuse.conf sets user_allow_other, so --allow-other cannot fail here")
			}
			home := nonrootDir(t)
			mnt, data := filepath.Join(home, "mnt"), filepath.Join(home, "data")
			if c.rootOwned {
				if err := os.Mkdir(mnt, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() { detach(mnt) })
			args := append(append([]string{"mount", "--daemon"}, c.flags...), "--data", data, mnt)
			cmd := nonrootCommand(filepath.Dir(fusermount)+":/usr/bin:/bin", args...)
			var out, errb strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("mount %v as a user: %v\nstdout: %s\nstderr: %s", args, err, out.String(), errb.String())
			}
			for _, want := range []string{c.says, c.fix, "the daemon's log: " + filepath.Join(data, "cockpitfs.log")} {
				if !strings.Contains(errb.String(), want) {
					t.Errorf("stderr misses %q:\n%s", want, errb.String())
				}
			}
			if mounted(mnt) {
				t.Error("a failed mount left a mount behind")
			}
		})
	}
}

// The daemon of `mount --daemon` leaves the terminal: its own session, no stream of ours.
func TestMountDaemonDetached(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	mnt, data := filepath.Join(base, "mnt"), filepath.Join(base, "data")
	pid := 0
	t.Cleanup(func() {
		if pid := testtool.SignalDaemonOf(data, syscall.SIGTERM); pid > 0 {
			for i := 0; i < 300 && !testtool.Gone(pid); i++ {
				time.Sleep(20 * time.Millisecond)
			}
		}
		detach(mnt)
	})
	r := lifecycleRun(t, "mount", "--daemon", "--log-level", "error", "--data", data, mnt)
	pid = lifecycleDaemonPID(data)
	logPath := filepath.Join(data, "cockpitfs.log")
	if r.Code != 0 || pid == 0 || !strings.Contains(r.Stdout, "log: "+logPath) {
		t.Fatalf("mount --daemon: exit %d, pid %d\nstdout: %s\nstderr: %s", r.Code, pid, r.Stdout, r.Stderr)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if fields[3] != strconv.Itoa(pid) || fields[4] != "0" {
		t.Errorf("the daemon's session %s (want its own, %d), controlling terminal %s (want none)", fields[3], pid, fields[4])
	}
	// Named as the command it was started as, not after /proc/self/exe (`exe`): pgrep finds it.
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) != filepath.Base(binary) {
		t.Errorf("the daemon's name is %q, want %q", comm, filepath.Base(binary))
	}
	for fd, want := range map[int]string{0: "/dev/null", 1: logPath, 2: logPath} {
		if got, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd)); got != want {
			t.Errorf("the daemon's fd %d is %q, want %q", fd, got, want)
		}
	}
	// --log-level error: serving is not logged.
	if log, _ := os.ReadFile(logPath); strings.Contains(string(log), "serving") {
		t.Errorf("--log-level error logged %q", log)
	}
}

// When the daemon of a mount is killed, the tools say no daemon serves it and how to start one —
// exec before it runs anything, gc, and an agent's wait that was under way — not the errno of a
// dead FUSE connection or that the stack is no stack.
func TestToolsOnAKilledDaemonsMount(t *testing.T) {
	m := newMount(t)
	m.setupApp(2, map[string]int{"HTTP": 37700}, "s")
	a := m.mcpAgent(t.TempDir(), "--cockpit", "app")
	a.call("claim", map[string]any{"stack": "s"}, nil)
	waited := make(chan refusal, 1)
	go func() { waited <- a.refused("wait", map[string]any{"stack": "s", "timeout_seconds": 60}) }()
	time.Sleep(500 * time.Millisecond) // the wait's read is under way in the daemon
	m.Kill()
	says := "no cockpitfs daemon serves " + m.Dir + ": start one with cockpitfs mount --daemon " + m.Dir
	select {
	case r := <-waited:
		if r.Code != "NOT_MOUNTED" || !strings.Contains(r.Message, "no cockpitfs daemon serves "+m.Dir) {
			t.Errorf("wait when the daemon was killed: %+v", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("wait did not return when the daemon was killed")
	}
	r := shIn(t, t.TempDir(), `"$B" exec "$M/app/stacks/s" -- echo ran`, "M="+m.Dir, "B="+binary)
	if r.Code != 1 || strings.Contains(r.Stdout, "ran") || !strings.Contains(r.Stderr, says) {
		t.Errorf("exec on the killed daemon's mount: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if r := cockpitfs(t, "gc", m.Dir); r.code != 1 || !strings.Contains(r.out, says) {
		t.Errorf("gc on the killed daemon's mount: exit %d\n%s", r.code, r.out)
	}
}
