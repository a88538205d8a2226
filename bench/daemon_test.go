package bench

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/netns"
	"golang.org/x/sys/unix"
)

// binary is the cockpitfs under measurement: $COCKPITFS_BIN, or built (without -race) for this run.
var binary string

// baseBinary, $COCKPITFS_BASE_BIN, is another build the claim benchmark times beside binary
// (scripts/bench BASE=<rev>): what a change buys, in one run, where runs of one build differ by
// more than most changes do.
var baseBinary = os.Getenv("COCKPITFS_BASE_BIN")

// teamBinary is the build with team mode (-tags team) the benchmarks over etcd run:
// $COCKPITFS_TEAM_BIN, or built at their first use (teamDaemonBinary).
var teamBinary = os.Getenv("COCKPITFS_TEAM_BIN")

// teamDaemonBinary returns teamBinary, building it first when it is not given.
func teamDaemonBinary(b *testing.B) string {
	b.Helper()
	if teamBinary == "" {
		bin := filepath.Join(workDir, "cockpitfs-team")
		build := exec.Command("go", "build", "-tags", "team", "-o", bin, "../cmd/cockpitfs")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			b.Fatalf("building cockpitfs with team mode: %v\n%s", err, out)
		}
		teamBinary = bin
	}
	return teamBinary
}

// workDir holds every mount point and data directory of the run, on the disk os.TempDir is on.
var workDir string

// daemonNetns is the network namespace every daemon of the run serves in, so that the ports they
// hold are not taken by daemons of other runs on this machine (nil when not root).
var daemonNetns *netns.NS

// cleanups run after every benchmark, for fixtures shared between benchmark invocations.
var cleanups []func()

func TestMain(m *testing.M) {
	if dir := os.Getenv(floorEnv); dir != "" {
		os.Exit(serveFloor(dir))
	}
	if spec := os.Getenv(scaleHelperEnv); spec != "" {
		os.Exit(scaleHelper(spec))
	}
	flag.Parse()
	// Without -bench there is nothing to set up: go test ./bench/ stays fast.
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		fmt.Fprintln(os.Stderr, "bench: /dev/fuse is missing")
		return 1
	}
	var err error
	if workDir, err = os.MkdirTemp("", "cockpitfs-bench"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(workDir)
	if os.Geteuid() == 0 {
		if daemonNetns, err = netns.New(); err != nil {
			fmt.Fprintln(os.Stderr, "bench: a network namespace for the daemons:", err)
			return 1
		}
		defer daemonNetns.Close()
	}
	binary = os.Getenv("COCKPITFS_BIN")
	if binary == "" {
		binary = filepath.Join(workDir, "cockpitfs")
		build := exec.Command("go", "build", "-o", binary, "../cmd/cockpitfs")
		build.Env = append(os.Environ(), "CGO_ENABLED=0") // as scripts/bench and the README build it
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "bench: building cockpitfs:", err)
			return 1
		}
	}
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	return m.Run()
}

// daemon is one cockpitfs process serving a mount point.
type daemon struct {
	Dir  string   // the mount point
	Data string   // the store
	bin  string   // the cockpitfs it runs: binary unless set
	args []string // more mount flags
	// hostNet runs it in the benchmark's own network namespace (an etcd daemon: the cluster
	// listens there), not daemonNetns.
	hostNet bool
	// ns is the network namespace it serves in when not daemonNetns.
	ns   *netns.NS
	cmd  *exec.Cmd
	log  bytes.Buffer
	done chan error
}

// newDaemon returns a daemon for a fresh mount point and store below workDir, not yet started.
func newDaemon(name string) *daemon {
	base := filepath.Join(workDir, name)
	return &daemon{Dir: filepath.Join(base, "mnt"), Data: filepath.Join(base, "data")}
}

// start execs the daemon and returns once it serves, with the time that took.
func (d *daemon) start() (time.Duration, error) {
	d.log.Reset()
	bin := binary
	if d.bin != "" {
		bin = d.bin
	}
	d.cmd = exec.Command(bin, append(append([]string{"mount", "--data", d.Data}, d.args...), d.Dir)...)
	d.cmd.Stdout, d.cmd.Stderr = &d.log, &d.log
	began := time.Now()
	ns := daemonNetns
	if d.ns != nil {
		ns = d.ns
	}
	if d.hostNet {
		ns = nil
	}
	if err := ns.Do(d.cmd.Start); err != nil {
		return 0, err
	}
	d.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan error) { done <- cmd.Wait() }(d.cmd, d.done)
	deadline := began.Add(10 * time.Second)
	// Polled without sleeping much: the figure is the mount-ready time itself.
	for !serving(d.Dir) {
		select {
		case err := <-d.done:
			d.cmd = nil
			return 0, fmt.Errorf("daemon exited before serving: %v\n%s", err, d.log.String())
		default:
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("daemon not serving after 10s\n%s", d.log.String())
		}
		time.Sleep(200 * time.Microsecond)
	}
	return time.Since(began), nil
}

// serving reports whether dir is a live mount (in mountinfo, and answering).
func serving(dir string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil || !strings.Contains(string(data), " "+dir+" ") {
		return false
	}
	_, err = os.Stat(filepath.Join(dir, "README"))
	return err == nil
}

// stop ends the daemon with SIGTERM (clean unmount and store close).
func (d *daemon) stop() {
	defer detach(d.Dir)
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		d.cmd = nil
	case <-time.After(15 * time.Second):
		fmt.Fprintf(os.Stderr, "bench: daemon %d did not stop on SIGTERM; killing it\n", d.cmd.Process.Pid)
		if err := d.kill(); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
	}
}

// kill ends the daemon with SIGKILL, leaving a dead mount behind as a crash would. A daemon with a
// thread blocked in a request on its own mount cannot finish dying (that thread waits for a server
// that is gone); then the connection is aborted through fusectl, when mounted, and the threads'
// kernel stacks are returned in the error.
func (d *daemon) kill() error {
	// From mountinfo, not stat: a stat would wait on the daemon as the stuck thread does.
	conn, connKnown := fuseConnection(d.Dir)
	pid := d.cmd.Process.Pid
	d.cmd.Process.Kill()
	defer func() { d.cmd = nil }()
	select {
	case <-d.done:
		return nil
	case <-time.After(10 * time.Second):
	}
	stacks := threadStacks(pid)
	if connKnown {
		os.WriteFile(fmt.Sprintf("/sys/fs/fuse/connections/%s/abort", conn), []byte("1"), 0)
	}
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
	}
	return fmt.Errorf("daemon %d still not dead 10s after SIGKILL; its threads:\n%s", pid, stacks)
}

// fuseConnection returns the FUSE connection number of the mount on dir (its device minor).
func fuseConnection(dir string) (string, bool) {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 && fields[4] == dir {
			_, minor, ok := strings.Cut(fields[2], ":")
			return minor, ok
		}
	}
	return "", false
}

func threadStacks(pid int) string {
	var b strings.Builder
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, task := range tasks {
		stack, _ := os.ReadFile(filepath.Join(task, "stack"))
		fmt.Fprintf(&b, "%s:\n%s", task, stack)
	}
	return b.String()
}

// detach lazily unmounts dir if anything is still mounted there.
func detach(dir string) {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(data), " "+dir+" ") {
		unix.Unmount(dir, unix.MNT_DETACH)
	}
}

func (d *daemon) path(parts ...string) string {
	return filepath.Join(append([]string{d.Dir}, parts...)...)
}

// statusKiB reads a field of /proc/<pid>/status in KiB (VmRSS, VmHWM).
func (d *daemon) statusKiB(field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, d.cmd.Process.Pid)
}

// allocatedBytes is what du reports for dir: allocated blocks, so sparse files count as used.
func allocatedBytes(dir string) (int64, error) {
	var total int64
	err := filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	return total, err
}

// interrupted counts syscalls that returned EINTR and were retried. A Go caller's runtime
// preempts its threads with signals (SIGURG); a signal during a FUSE request makes the kernel send
// INTERRUPT, and cockpitfs answers a cancelled request with EINTR (os.OpenFile retries the same way).
var interrupted atomic.Int64

// retry runs a syscall again while it returns EINTR.
func retry(call func() error) error {
	for {
		err := call()
		if err != unix.EINTR {
			return err
		}
		interrupted.Add(1)
	}
}

// writeFile opens path with flags, writes text in one write(2) when it is not empty, and closes:
// one control-file command the way a shell redirection sends it.
func writeFile(path string, flags int, text string) error {
	var fd int
	err := retry(func() (err error) {
		fd, err = unix.Open(path, flags|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		return err
	})
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	if text != "" {
		if err := retry(func() error { _, err := unix.Write(fd, []byte(text)); return err }); err != nil {
			unix.Close(fd)
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return unix.Close(fd)
}

// config is the port declaration every benchmark cockpit uses: two keys, as a typical app has.
func config(base, step, count int) string {
	return fmt.Sprintf("[ports]\nstep = %d\ncount = %d\n[ports.bases]\nHTTP = %d\nDB = %d\n", step, count, base, base+step*count+500)
}

// setupStack makes cockpit app with stack s held by an untracked holder "base", so a further holder
// can come and go while the lease stays (the claim cycle of benchmark 2).
func (d *daemon) setupStack() error {
	if err := os.Mkdir(d.path("app"), 0o755); err != nil {
		return err
	}
	if err := writeFile(d.path("app", "config"), unix.O_TRUNC, config(20000, 10, 20)); err != nil {
		return err
	}
	if err := os.Mkdir(d.path("app", "stacks", "s"), 0o755); err != nil {
		return err
	}
	return writeFile(d.path("app", "stacks", "s", "holders", "base"), unix.O_CREAT, "pid=none checkout=/src/base")
}

// startStack starts d and sets up its stack (setupStack), failing b on either; it returns the
// time to mount-ready.
func (d *daemon) startStack(b *testing.B) time.Duration {
	b.Helper()
	ready, err := d.start()
	if err != nil {
		b.Fatal(err)
	}
	if err := d.setupStack(); err != nil {
		b.Fatalf("%v\n%s", err, d.log.String())
	}
	return ready
}

// shared is the daemon the read, write and claim benchmarks share, started at first use; base is
// baseBinary's, set up alike, for the claim benchmark.
var shared, base *daemon

func sharedDaemon(b *testing.B) *daemon { return stackDaemon(b, &shared, "shared", "") }

func baseDaemon(b *testing.B) *daemon { return stackDaemon(b, &base, "base", baseBinary) }

// stackDaemon is *d, or a daemon of bin (binary for "") started and set up (setupStack) as name.
func stackDaemon(b *testing.B, d **daemon, name, bin string) *daemon {
	b.Helper()
	if *d != nil {
		return *d
	}
	n := newDaemon(name)
	n.bin = bin
	if _, err := n.start(); err != nil {
		b.Fatal(err)
	}
	cleanups = append(cleanups, n.stop)
	if err := n.setupStack(); err != nil {
		b.Fatalf("%v\n%s", err, n.log.String())
	}
	*d = n
	return n
}
