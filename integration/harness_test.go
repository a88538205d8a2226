// Package integration mounts real cockpitfs filesystems and drives them with shell tools.
// The daemon runs as a subprocess (the built binary), so tests exec bash, cat, touch, make… on
// the mount without deadlocking against their own server, and can kill it with SIGKILL.
package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/netns"
	"golang.org/x/sys/unix"
)

// binary is the cockpitfs built for this test run.
var binary, plainBinary string

func TestMain(m *testing.M) {
	if path := os.Getenv(memoryStallEnv); path != "" {
		runMemoryStall(path) // this binary is a test's helper process (status_stall_test.go)
	}
	if dir := os.Getenv(hungServerEnv); dir != "" {
		runHungServer(dir) // a test's helper process (worktrees_test.go)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "integration: /dev/fuse is missing and CI=true: failing")
			return 1
		}
		fmt.Fprintln(os.Stderr, "integration: SKIPPING every integration test: /dev/fuse is missing")
		return 0
	}
	dir, err := os.MkdirTemp("", "cockpitfs-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "cockpitfs")
	// Every process of the race-built binary would otherwise sleep a second as it exits, waiting
	// for races still to come; a daemon's races are reported as they happen and found in its log
	// (mount.ended), a command's by its exit code (66).
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	// plainBinary, built as users get it, is what the fault loops kill (faults_test.go): hundreds
	// of runs, each about a quarter of the race-built one's CPU, and strace counts the program's
	// own calls. (Its dependencies are those go vet compiles: the build cache has them.)
	plainBinary = filepath.Join(dir, "cockpitfs-plain")
	// Both with team mode (-tags team), which the etcd tests need; a build without it differs
	// only in refusing --store (TestBuildWithoutTeamMode).
	for _, args := range [][]string{{"-race", "-tags", "team", "-o", binary}, {"-tags", "team", "-o", plainBinary}} {
		build := exec.Command("go", append(append([]string{"build"}, args...), "../cmd/cockpitfs")...)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "integration: building cockpitfs:", err)
			return 1
		}
	}
	return m.Run()
}

// syncBuffer collects a daemon's output, written by exec's copier while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// daemonLog is a daemon's output in a file the daemon writes itself, so a line it logs before
// answering a request is there when the request returns: through a pipe, exec's copier could
// still hold it (a check of the log right after a refusal failed that way in CI).
type daemonLog struct{ path string }

// newDaemonLog opens a fresh log file and gives cmd it as stdout and stderr.
func newDaemonLog(t *testing.T, cmd *exec.Cmd) *daemonLog {
	t.Helper()
	path := filepath.Join(t.TempDir(), "daemon.log")
	// O_APPEND: stdout and stderr share the file without writing over each other.
	out, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	cmd.Stdout, cmd.Stderr = out, out
	return &daemonLog{path}
}

func (l *daemonLog) String() string {
	b, err := os.ReadFile(l.path)
	if err != nil {
		return fmt.Sprintf("(the daemon's log cannot be read: %v)", err)
	}
	return string(b)
}

// mount is one running daemon serving a mount point.
type mount struct {
	t    *testing.T
	Dir  string // the mount point
	Data string // the store
	// Store is the --store value of a daemon on etcd ("": badger in Data).
	Store string
	// program is the cockpitfs the daemon runs ("": binary).
	program string
	// env is added to the daemon's environment.
	env []string
	// args are the mount flags start was given last, which restart gives again.
	args []string
	// ns is the network namespace the daemon runs in: its port holds and the listeners it sees
	// are the namespace's (nil: the test's own, when it cannot make one).
	ns   *netns.NS
	cmd  *exec.Cmd
	log  *daemonLog
	done chan error
	// nobody runs the daemon, and the mount's shell commands (sh, ok, refused), as uid 65534.
	nobody bool
	// corrupted marks a store a test broke on purpose; every other store must pass
	// `cockpitfs verify` when the test ends.
	corrupted bool
}

// newMount starts a daemon on a fresh store, in a network namespace of its own; it is stopped and
// unmounted when the test ends, whatever happened.
//
// Every test daemon gets its own namespace because a daemon holds its leased ports machine-wide
// (per network namespace, as TCP ports are): daemons of other tests — and of other people's test
// runs on this machine — would otherwise take each other's port families. Listen in the
// daemon's namespace with m.listen. Tests about several daemons on one machine share one with
// newMountIn.
func newMount(t *testing.T, args ...string) *mount {
	t.Helper()
	return newMountIn(t, ownNetns(t), args...)
}

// newMountIn is newMount with the daemon in ns (nil: the test's own namespace).
func newMountIn(t *testing.T, ns *netns.NS, args ...string) *mount {
	t.Helper()
	base := t.TempDir()
	m := &mount{t: t, ns: ns, Dir: filepath.Join(base, "mnt"), Data: filepath.Join(base, "data")}
	m.start(args...)
	t.Cleanup(m.stop)
	return m
}

// ownNetns makes a network namespace for the test, closed when it ends. Without root there is
// none to make, and the test's daemons share the machine's (nil).
func ownNetns(t *testing.T) *netns.NS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Log("not root: the daemon shares the machine's network namespace (its port holds and listeners)")
		return nil
	}
	ns, err := netns.New()
	if err != nil {
		t.Fatalf("a network namespace for the daemon: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// listen opens a TCP listener in the daemon's network namespace (where its listener check
// looks), closed when the test ends.
func (m *mount) listen(network, addr string) (net.Listener, error) {
	m.t.Helper()
	var l net.Listener
	err := m.ns.Do(func() (err error) {
		l, err = net.Listen(network, addr)
		return err
	})
	if err == nil {
		m.t.Cleanup(func() { l.Close() })
	}
	return l, err
}

// start runs the daemon in the foreground as a subprocess and waits until it serves.
func (m *mount) start(args ...string) {
	m.t.Helper()
	m.args = args
	all := append([]string{"mount", "--data", m.Data}, args...)
	program := binary
	if m.program != "" {
		program = m.program
	}
	m.cmd = exec.Command(program, append(all, m.Dir)...)
	if m.nobody {
		m.cmd = nonrootCommand(nonrootPath(m.t), append(all, m.Dir)...)
	}
	m.log = newDaemonLog(m.t, m.cmd)
	if len(m.env) > 0 {
		m.cmd.Env = append(os.Environ(), m.env...)
	}
	if err := m.ns.Do(m.cmd.Start); err != nil {
		m.t.Fatal(err)
	}
	m.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan error) { done <- cmd.Wait() }(m.cmd, m.done)
	// "serving" is logged once the mount is fully up (go-fuse's own open of the mount done), so
	// a test may kill the daemon right away without catching it in its own request.
	wait := 10 * time.Second
	if m.Store != "" {
		wait = 60 * time.Second // etcd round trips to a race-built cluster in the test process
	}
	deadline := time.Now().Add(wait)
	// Another user's mount without allow_other answers root EACCES: it is up once mounted.
	for !strings.Contains(m.log.String(), "serving "+m.Dir) || !(serving(m.Dir) || m.nobody && mounted(m.Dir)) {
		select {
		case err := <-m.done:
			m.done <- err
			m.t.Fatalf("daemon exited before serving: %v\n%s", err, m.log)
		default:
		}
		if time.Now().After(deadline) {
			// The caller's cleanup is not registered yet: the daemon and its mount go here.
			m.cmd.Process.Kill()
			<-m.done
			m.cmd = nil
			detach(m.Dir)
			m.t.Fatalf("daemon not serving after %v\n%s", wait, m.log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// restart starts a killed daemon again with the flags it had, on the same store, after lazily
// detaching the dead mount it left (clearing it is TestLifecycleKillRestartClearsStaleMount's
// subject, not the caller's).
func (m *mount) restart() {
	m.t.Helper()
	detach(m.Dir)
	m.start(m.args...)
}

// serving reports whether dir is a live cockpitfs mount (in mountinfo, and answering).
func serving(dir string) bool {
	if !mounted(dir) {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, "README"))
	return err == nil
}

// mounted reports whether dir is a mount point, live or dead, from mountinfo alone: touching a
// dead mount answers ENOTCONN, a live one the daemon. mountinfo spells a space, tab, newline and
// backslash of a path in octal.
func mounted(dir string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	escaped := strings.NewReplacer(`\`, `\134`, " ", `\040`, "\t", `\011`, "\n", `\012`).Replace(dir)
	return err == nil && strings.Contains(string(data), " "+escaped+" ")
}

// Stop ends the daemon with SIGTERM (a clean unmount and store close) and waits for it.
func (m *mount) Stop() {
	m.t.Helper()
	if m.cmd == nil {
		return
	}
	m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(15 * time.Second):
		m.cmd.Process.Kill()
		<-m.done
		m.t.Errorf("daemon did not stop on SIGTERM\n%s", m.log)
	}
	m.ended()
	detach(m.Dir)
}

// ended notes the daemon gone, failing the test if the race detector reported in its log.
func (m *mount) ended() {
	m.t.Helper()
	m.cmd = nil
	if log := m.log.String(); strings.Contains(log, "WARNING: DATA RACE") {
		m.t.Errorf("the race detector reported in the daemon:\n%s", log)
	}
}

// Kill ends the daemon with SIGKILL, leaving a dead mount behind as a crash would.
func (m *mount) Kill() {
	m.t.Helper()
	m.cmd.Process.Kill()
	<-m.done
	m.ended()
}

func (m *mount) stop() {
	if m.cmd != nil {
		m.Stop()
	}
	detach(m.Dir)
	if !m.corrupted {
		if out, err := m.verify(); err != nil {
			m.t.Errorf("cockpitfs verify after the test: %v\n%s", err, out)
		}
	}
	if m.t.Failed() {
		m.t.Logf("daemon log:\n%s", m.log)
	}
}

// verify runs `cockpitfs verify` on the store (its daemon stopped) in the daemon's network
// namespace, where it sees the holds the daemon would.
func (m *mount) verify() (string, error) {
	var out syncBuffer
	cmd := exec.Command(binary, "verify", "--data", m.Data)
	if m.Store != "" {
		cmd = exec.Command(binary, "verify", "--store", m.Store, "--data", m.Data, "--command-timeout", "10s")
	}
	cmd.Stdout, cmd.Stderr = &out, &out
	err := m.ns.Do(cmd.Start)
	if err == nil {
		err = cmd.Wait()
	}
	return out.String(), err
}

// detach lazily unmounts dir if anything is still mounted there.
func detach(dir string) {
	if mounted(dir) {
		unix.Unmount(dir, unix.MNT_DETACH)
	}
}

// Path joins parts below the mount point.
func (m *mount) Path(parts ...string) string {
	return filepath.Join(append([]string{m.Dir}, parts...)...)
}

// result is what a shell command did.
type result struct {
	Stdout, Stderr string
	Code           int
}

// sh runs script with bash in dir (the mount point when dir is ""), with $M set to the mount point.
func (m *mount) sh(script string) result {
	m.t.Helper()
	if m.nobody {
		return shIn(m.t, "/", `exec setpriv --reuid=65534 --regid=65534 --clear-groups bash -c "cd \"$M\" && $S"`, "M="+m.Dir, "S="+script)
	}
	return shIn(m.t, m.Dir, script, "M="+m.Dir)
}

func shIn(t *testing.T, dir, script string, env ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{Stdout: out.String(), Stderr: errb.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.Code = exit.ExitCode()
	case err != nil:
		t.Fatalf("bash: %v", err)
	}
	return r
}

// ok runs script and fails the test unless it exits 0; it returns stdout.
func (m *mount) ok(script string) string {
	m.t.Helper()
	r := m.sh(script)
	if r.Code != 0 {
		m.t.Fatalf("script failed (exit %d):\n%s\nstdout: %s\nstderr: %s", r.Code, script, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// refused runs script, expects it to fail, and checks stderr names the errno's message
// (e.g. "Device or resource busy" for EBUSY).
func (m *mount) refused(script string, errno syscall.Errno) result {
	m.t.Helper()
	r := m.sh(script)
	if r.Code == 0 || !strings.Contains(strings.ToLower(r.Stderr), errno.Error()) {
		m.t.Fatalf("want refusal %q from:\n%s\ngot exit %d\nstdout: %s\nstderr: %s", errno.Error(), script, r.Code, r.Stdout, r.Stderr)
	}
	return r
}

// read returns a file's content below the mount point.
func (m *mount) read(parts ...string) string {
	m.t.Helper()
	data, err := os.ReadFile(m.Path(parts...))
	if err != nil {
		m.t.Fatal(err)
	}
	return string(data)
}

// lastEvent returns the last line of an events file below the mount point.
func (m *mount) lastEvent(parts ...string) string {
	m.t.Helper()
	lines := strings.Split(strings.TrimSpace(m.read(parts...)), "\n")
	return lines[len(lines)-1]
}

// setupApp makes cockpit app with a config of the given bases (step 10, count) and the stacks.
func (m *mount) setupApp(count int, bases map[string]int, stacks ...string) {
	m.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "[ports]\nstep = 10\ncount = %d\n[ports.bases]\n", count)
	for k, v := range bases {
		fmt.Fprintf(&b, "%s = %d\n", k, v)
	}
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + b.String() + "EOF")
	for _, s := range stacks {
		m.ok("mkdir $M/app/stacks/" + s)
	}
}

// shell is a long-lived bash reading commands from a pipe: it keeps its cwd (and whatever the
// kernel cached for it) between commands, as a developer's terminal does, and costs no process
// start per command.
type shell struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Reader
	n   int
}

// shell starts one in dir with $M set to the mount point; it ends with the test.
func (m *mount) shell(dir string) *shell {
	m.t.Helper()
	cmd := exec.Command("bash")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "M="+m.Dir)
	in, err := cmd.StdinPipe()
	if err != nil {
		m.t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		m.t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { in.Close(); cmd.Wait() })
	return &shell{t: m.t, in: in, out: bufio.NewReader(out)}
}

// run sends one command line and returns its output (stdout and stderr).
func (s *shell) run(command string) string {
	s.t.Helper()
	s.n++
	marker := fmt.Sprintf("--done %d--", s.n)
	fmt.Fprintf(s.in, "%s 2>&1; echo '%s'\n", command, marker)
	var b strings.Builder
	for {
		line, err := s.out.ReadString('\n')
		if err != nil {
			s.t.Fatalf("shell: %v after %q", err, b.String())
		}
		if line == marker+"\n" {
			return b.String()
		}
		b.WriteString(line)
	}
}
