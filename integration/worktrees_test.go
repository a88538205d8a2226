package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
)

// A worktree's life (docs/worktrees.md): stale stacks drained by the daemon's sweep and by
// cockpitfs gc, the post-checkout hook's claim, and the stop step ending the servers a stack runs
// but never a client connected to them nor what the requester may not signal.

// worktreesConfig is a cockpit's config with HTTP and API at base and base+1, and the graces.
func worktreesConfig(base int, gcGrace, stopGrace string) string {
	return fmt.Sprintf("[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = %d\nAPI = %d\n[gc]\ngrace = %q\n[stop]\ngrace = %q\n",
		base, base+1, gcGrace, stopGrace)
}

// worktreesRepo makes a git repository with one commit in a fresh directory; it returns the
// repository's path.
func worktreesRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	worktreesGit(t, dir, "init", "-q", repo)
	worktreesGit(t, repo, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "init")
	return repo
}

// worktreesGit runs git in dir and fails the test unless it succeeds; it returns its output.
func worktreesGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// stackOf is the stack cockpitfs name stack gives the checkout at dir.
func stackOf(t *testing.T, dir string) string {
	t.Helper()
	out, err := exec.Command(binary, "name", "stack", dir).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// process is a program the test started in the daemon's network namespace, in a process group
// of its own; it is killed when the test ends.
type process struct {
	cmd  *exec.Cmd
	out  *bufio.Reader
	done chan struct{}
}

// startIn starts name with args in m's network namespace and waits until it prints ready.
func startIn(m *mount, ready string, name string, args ...string) *process {
	m.t.Helper()
	p := &process{cmd: exec.Command(name, args...), done: make(chan struct{})}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		m.t.Fatal(err)
	}
	p.cmd.Stderr = os.Stderr
	if err := m.ns.Do(p.cmd.Start); err != nil {
		m.t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	m.t.Cleanup(func() { p.cmd.Process.Kill(); <-p.done })
	p.out = bufio.NewReader(stdout)
	line, err := p.out.ReadString('\n')
	if err != nil || !strings.Contains(line, ready) {
		m.t.Fatalf("%s %v: want %q, got %q (%v)", name, args, ready, line, err)
	}
	go io.Copy(io.Discard, p.out)
	return p
}

// running says whether p has not ended.
func (p *process) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// endedBy waits for p to end and says by which signal ("" for none).
func (p *process) endedBy(t *testing.T) string {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("process %d still runs", p.cmd.Process.Pid)
	}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return unixSignalName(ws.Signal())
	}
	return ""
}

func unixSignalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGKILL:
		return "SIGKILL"
	}
	return s.String()
}

// Servers and a client, as a developer runs them: python's http.server, a node server (one that
// ignores SIGTERM, as a server busy shutting down does), and a client holding a connection.
const (
	nodeServer = `const port = +process.argv[1];
if (process.argv[2] === "stubborn") process.on("SIGTERM", () => {});
require("http").createServer((q, s) => s.end("node\n")).listen(port, "127.0.0.1", () => console.log("listening"));`
	// The client sends a keep-alive request and holds the connection, as a browser's tab does.
	keepAliveClient = `import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n")
s.recv(4096)
print("connected", flush=True)
time.sleep(3600)`
	pythonServer = `import http.server, sys
s = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler)
print("listening", flush=True)
s.serve_forever()`
)

// servesHTTP says whether something answers HTTP on port in m's network namespace.
func servesHTTP(m *mount, port int) bool {
	var ok bool
	m.ns.Do(func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 5*time.Second)
		if err != nil {
			return nil
		}
		defer c.Close()
		fmt.Fprintf(c, "GET / HTTP/1.0\r\n\r\n")
		line, _ := bufio.NewReader(c).ReadString('\n')
		ok = strings.HasPrefix(line, "HTTP/")
		return nil
	})
	return ok
}

// portOf is the stack's leased port of key.
func portOf(m *mount, stack, key string) int {
	m.t.Helper()
	port, err := strconv.Atoi(strings.TrimSpace(m.read("app/stacks", stack, "ports", key)))
	if err != nil {
		m.t.Fatal(err)
	}
	return port
}

// claimAndLeave claims the stack from dir in a session of its own whose leader then exits,
// leaving running a python server on the stack's HTTP port and a sleep, both in the leader's
// process group: what a terminal closed on its dev server leaves. It returns their pids.
func claimAndLeave(m *mount, dir, stack string) (server, sleeper int) {
	m.t.Helper()
	script := `touch "$M/app/stacks/$S/holders/me" || exit 1
port=$(cat "$M/app/stacks/$S/ports/HTTP")
python3 -c "$PY" "$port" >"$LOG" 2>&1 &
echo $!
sleep 3600 >/dev/null 2>&1 &
echo $!`
	cmd := exec.Command("setsid", "bash", "-c", script)
	cmd.Dir = dir
	serverLog := filepath.Join(m.t.TempDir(), "server.log")
	cmd.Env = append(os.Environ(), "M="+m.Dir, "S="+stack, "PY="+pythonServer, "LOG="+serverLog)
	var out []byte
	err := m.ns.Do(func() (err error) { out, err = cmd.Output(); return err })
	if err != nil {
		m.t.Fatalf("claim from %s: %v", dir, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		pid, _ := strconv.Atoi(f)
		pids = append(pids, pid)
		testtool.KillAtEnd(m.t, pid)
	}
	if len(pids) != 2 {
		m.t.Fatalf("claim from %s printed %q", dir, out)
	}
	port := portOf(m, stack, "HTTP")
	waitFor(m.t, func() string {
		out, _ := os.ReadFile(serverLog)
		return fmt.Sprintf("the left server to answer on %d (process %d gone: %v); its output:\n%s\nthe stack's events:\n%s",
			port, pids[0], testtool.Gone(pids[0]), out, m.read("app/stacks", stack, "events"))
	}, func() bool { return servesHTTP(m, port) })
	return pids[0], pids[1]
}

// The daemon's sweep drains a stack whose holder died and whose worktree was removed, once its
// cockpit's grace has passed, stopping the server and the sleep the holder's terminal left
// (each named in its events) but not a client connected to the server; a stack whose holder
// lives, one whose worktree still exists, and a stale one within its cockpit's longer grace are
// untouched.
func TestWorktreesStaleStackDrainedAfterGrace(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "git", "python3", "setsid")
	m := newMount(t, "--gc-interval", "100ms")
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(47900, "1s", "5s") + "EOF")
	repo := worktreesRepo(t)
	wt := map[string]string{}
	stacks := map[string]string{}
	for _, name := range []string{"stale", "live", "kept"} {
		wt[name] = filepath.Join(filepath.Dir(repo), name)
		worktreesGit(t, repo, "worktree", "add", "-q", wt[name])
		stacks[name] = stackOf(t, wt[name])
		m.ok("mkdir $M/app/stacks/" + stacks[name])
	}
	server, sleeper := claimAndLeave(m, wt["stale"], stacks["stale"])
	claimAndLeave(m, wt["kept"], stacks["kept"])
	// The live stack's holder is a session that goes on running.
	live := exec.Command("setsid", "bash", "-c", `touch "$M/app/stacks/$S/holders/me" && echo claimed && exec sleep 3600`)
	live.Dir, live.Env = wt["live"], append(os.Environ(), "M="+m.Dir, "S="+stacks["live"])
	liveOut, _ := live.StdoutPipe()
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { live.Process.Kill(); live.Wait() })
	if line, _ := bufio.NewReader(liveOut).ReadString('\n'); line != "claimed\n" {
		t.Fatalf("the live claim: %q", line)
	}
	client := startIn(m, "connected", "python3", "-c", keepAliveClient, strconv.Itoa(portOf(m, stacks["stale"], "HTTP")))
	// A stack as stale, in a cockpit whose grace is 30 days: the sweeps pass it by.
	m.ok("mkdir $M/slow && cat > $M/slow/config <<'EOF'\n" + worktreesConfig(47950, "720h", "5s") + "EOF\n" +
		"mkdir $M/slow/stacks/w && echo 'pid=none checkout=" + filepath.Join(t.TempDir(), "gone") + "' > $M/slow/stacks/w/holders/me")

	before := map[string]string{}
	for _, name := range []string{"live", "kept"} {
		before[name] = m.read("app/stacks", stacks[name], "record") + m.read("app/stacks", stacks[name], "events")
	}
	slow := m.read("slow/stacks/w/record") + m.read("slow/stacks/w/events")
	worktreesGit(t, repo, "worktree", "remove", "--force", wt["stale"])
	worktreesGit(t, repo, "worktree", "remove", "--force", wt["live"])

	waitFor(t, func() string { return "the stale stack drained: " + m.read("app/stacks", stacks["stale"], "lease") },
		func() bool { return strings.Contains(m.read("app/stacks", stacks["stale"], "lease"), "released=true") })
	events := m.read("app/stacks", stacks["stale"], "events")
	for _, want := range []string{
		`"op":"gc","path":"app/stacks/` + stacks["stale"] + `/drain/request","pid":`,
		`"warning":"released dead holders: me (process `,
		fmt.Sprintf(`"result":"stopped","message":"stop: process %d python3 (uid 0, in the process group of holder me, listens on port %d): terminated"`, server, leasedPort(m, stacks["stale"])),
		fmt.Sprintf(`"result":"stopped","message":"stop: process %d sleep (uid 0, in the process group of holder me): terminated"`, sleeper),
		`/drain/outcome","pid":`,
	} {
		if !strings.Contains(events, want) {
			t.Errorf("the stale stack's events lack %s:\n%s", want, events)
		}
	}
	waitFor(t, func() string { return "the left server and sleep to end" }, func() bool { return testtool.Gone(server) && testtool.Gone(sleeper) })
	if !client.running() {
		t.Errorf("the client connected to the stale stack's server ended with it")
	}
	// A sweep has passed over the others since the stale stack was drained: nothing changed.
	for _, name := range []string{"live", "kept"} {
		if after := m.read("app/stacks", stacks[name], "record") + m.read("app/stacks", stacks[name], "events"); after != before[name] {
			t.Errorf("the %s stack changed:\n%s\n->\n%s", name, before[name], after)
		}
	}
	if after := m.read("slow/stacks/w/record") + m.read("slow/stacks/w/events"); after != slow {
		t.Errorf("the stack within its cockpit's grace changed:\n%s\n->\n%s", slow, after)
	}
	gc := m.read("gc")
	for _, want := range []string{
		"keep app/stacks/" + stacks["live"] + ": holder me is live (process ",
		"keep app/stacks/" + stacks["kept"] + ": holder me's checkout " + wt["kept"] + " exists",
		"drain slow/stacks/w: holders me (pid-less); checkouts gone: ",
	} {
		if !strings.Contains(gc, want) {
			t.Errorf("gc lacks %q:\n%s", want, gc)
		}
	}
}

// leasedPort is the stack's HTTP port as its lease recorded it (its ports/ are gone once it is
// drained).
func leasedPort(m *mount, stack string) int {
	m.t.Helper()
	for _, line := range strings.Split(m.read("app/stacks", stack, "lease"), "\n") {
		if v, ok := strings.CutPrefix(line, "HTTP="); ok {
			port, _ := strconv.Atoi(v)
			return port
		}
	}
	m.t.Fatal("no HTTP in the lease")
	return 0
}

// cockpitfs gc --dry-run lists what it would drain and why and changes nothing; cockpitfs gc
// then drains it, without waiting for the grace. A stack with the same dead holder whose
// checkout still exists is kept by both, and so is one whose checkout is inside the mount.
func TestWorktreesGCDryRunThenRun(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "git", "python3", "setsid")
	m := newMount(t, "--gc-interval", "0")
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(47920, "720h", "5s") + "EOF")
	repo := worktreesRepo(t)
	gone, kept := filepath.Join(filepath.Dir(repo), "gone"), filepath.Join(filepath.Dir(repo), "kept")
	worktreesGit(t, repo, "worktree", "add", "-q", gone)
	worktreesGit(t, repo, "worktree", "add", "-q", kept)
	sGone, sKept := stackOf(t, gone), stackOf(t, kept)
	m.ok("mkdir $M/app/stacks/" + sGone + " $M/app/stacks/" + sKept)
	server, _ := claimAndLeave(m, gone, sGone)
	claimAndLeave(m, kept, sKept)
	worktreesGit(t, repo, "worktree", "remove", "--force", gone)
	// A holder claimed from inside the mount: the daemon looks at nothing below its own mount.
	m.ok("mkdir $M/app/stacks/inmount && cd $M/app && echo pid=none > $M/app/stacks/inmount/holders/me")

	state := func() string {
		return m.read("app/stacks", sGone, "record") + m.read("app/stacks", sGone, "events") + m.read("app/stacks", sKept, "record") + m.read("app/stacks", sKept, "events")
	}
	before := state()
	r := shIn(t, "/", `"$B" gc --dry-run "$M"`, "B="+binary, "M="+m.Dir)
	wantDrain := "drain app/stacks/" + sGone + ": holders me (dead, process "
	wantKeep := "keep app/stacks/" + sKept + ": holder me's checkout " + kept + " exists"
	wantInMount := "keep app/stacks/inmount: holder me's checkout " + m.Path("app") + " is inside the mount"
	if r.Code != 0 || !strings.Contains(r.Stdout, wantDrain) || !strings.Contains(r.Stdout, "checkouts gone: "+gone) || !strings.Contains(r.Stdout, wantKeep) || !strings.Contains(r.Stdout, wantInMount) {
		t.Fatalf("gc --dry-run: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if after := state(); after != before {
		t.Fatalf("gc --dry-run changed the stacks:\n%s\n->\n%s", before, after)
	}
	if testtool.Gone(server) {
		t.Fatal("gc --dry-run stopped the server")
	}
	// The gc file takes only run: anything else is refused (EINVAL) and drains nothing. (The root
	// has no events file: the errno is the whole report.)
	m.refused("echo collect > $M/gc", syscall.EINVAL)
	if after := state(); after != before {
		t.Fatalf("a refused gc command changed the stacks:\n%s\n->\n%s", before, after)
	}

	r = shIn(t, "/", `"$B" gc "$M"`, "B="+binary, "M="+m.Dir)
	if r.Code != 0 || !strings.Contains(r.Stdout, "drained app/stacks/"+sGone+": ") || strings.Contains(r.Stdout, sKept) {
		t.Fatalf("gc: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if lease := m.read("app/stacks", sGone, "lease"); !strings.Contains(lease, "released=true") {
		t.Fatalf("after gc the stale stack's lease: %s", lease)
	}
	if !strings.Contains(m.read("app/stacks", sKept, "lease"), "released=false") {
		t.Fatal("gc drained the stack whose checkout exists")
	}
	waitFor(t, func() string { return "the left server to end" }, func() bool { return testtool.Gone(server) })
}

// A checkout path is shown in the gc file as every text view shows it, escaped once: ESC as \x1b,
// a backslash as \\ — not escaped again (\\x1b), and never raw.
func TestWorktreesGCShowsAPathEscapedOnce(t *testing.T) {
	t.Parallel()
	m := newMount(t, "--gc-interval", "0")
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(47960, "720h", "5s") + "EOF")
	checkout := filepath.Join(t.TempDir(), "a\x1b[31mb\\c")
	if err := os.Mkdir(checkout, 0o755); err != nil {
		t.Fatal(err)
	}
	m.ok("mkdir $M/app/stacks/s")
	if r := shIn(t, checkout, `echo pid=none > "$M/app/stacks/s/holders/me"`, "M="+m.Dir); r.Code != 0 {
		t.Fatalf("claim from %q: exit %d: %s", checkout, r.Code, r.Stderr)
	}
	if err := os.Remove(checkout); err != nil {
		t.Fatal(err)
	}
	want := "drain app/stacks/s: holders me (pid-less); checkouts gone: " + strings.TrimSuffix(filepath.Dir(checkout), "/") + `/a\x1b[31mb\\c` + "\n"
	if got := m.read("gc"); got != want {
		t.Fatalf("the gc file reads %q, want %q", got, want)
	}
}

// cockpitfs git install-hook writes a post-checkout hook that claims each new worktree's stack
// for a pid-less holder; installing it again changes nothing, and a hook cockpitfs did not write
// is left as it is unless --force (then it is kept and run first). gc drains the stack once the
// worktree is removed.
func TestWorktreesHookClaimsNewWorktree(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "git")
	m := newMount(t, "--gc-interval", "0")
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(47940, "10m", "5s") + "EOF")
	repo := worktreesRepo(t)
	hook := filepath.Join(repo, ".git", "hooks", "post-checkout")
	foreign := "#!/bin/sh\necho foreign hook ran >> \"$(git rev-parse --git-common-dir)/foreign.log\"\n"
	if err := os.WriteFile(hook, []byte(foreign), 0o755); err != nil {
		t.Fatal(err)
	}
	r := shIn(t, repo, `"$B" git install-hook --mount "$M" --cockpit app`, "B="+binary, "M="+m.Dir)
	if data, _ := os.ReadFile(hook); r.Code != 1 || !strings.Contains(r.Stderr, "a hook cockpitfs did not write: left as it is") || string(data) != foreign {
		t.Fatalf("install over a foreign hook: exit %d, stderr %q; the hook now:\n%s", r.Code, r.Stderr, data)
	}
	for i, want := range []string{"installed (cockpit app on " + m.Dir + ")", "already installed"} {
		r = shIn(t, repo, `"$B" git install-hook --force --mount "$M" --cockpit app`, "B="+binary, "M="+m.Dir)
		if r.Code != 0 || !strings.Contains(r.Stdout, want) {
			t.Fatalf("install %d: exit %d\nstdout: %s\nstderr: %s", i, r.Code, r.Stdout, r.Stderr)
		}
	}
	if data, err := os.ReadFile(hook + ".local"); err != nil || string(data) != foreign {
		t.Fatalf("the foreign hook kept as post-checkout.local: %q, %v", data, err)
	}

	wt := filepath.Join(filepath.Dir(repo), "feature")
	worktreesGit(t, repo, "worktree", "add", "-q", wt)
	if data, err := os.ReadFile(filepath.Join(repo, ".git", "foreign.log")); err != nil || string(data) != "foreign hook ran\n" {
		t.Errorf("the foreign hook did not run first: %q, %v", data, err)
	}
	stack := stackOf(t, wt)
	holder := strings.TrimSpace(shIn(t, "/", `"$B" name holder`, "B="+binary).Stdout)
	h := m.read("app/stacks", stack, "holders", holder)
	for _, want := range []string{"pid=none\n", "state=untracked\n", "checkout_path=" + wt + "\n"} {
		if !strings.Contains(h, want) {
			t.Errorf("the hook's holder lacks %q:\n%s", want, h)
		}
	}
	if !strings.Contains(m.read("app/stacks", stack, "lease"), "released=false") {
		t.Fatal("the hook's claim leased nothing")
	}
	// A checkout of a branch in an existing worktree claims nothing new.
	worktreesGit(t, wt, "checkout", "-q", "-b", "other")
	if got := m.ok("ls $M/app/stacks"); got != stack+"\n" {
		t.Fatalf("stacks after a checkout in the worktree: %q", got)
	}

	worktreesGit(t, repo, "worktree", "remove", wt)
	r = shIn(t, "/", `"$B" gc "$M"`, "B="+binary, "M="+m.Dir)
	if r.Code != 0 || !strings.Contains(r.Stdout, "drained app/stacks/"+stack+": holders "+holder+" (pid-less); checkouts gone: "+wt) {
		t.Fatalf("gc after the worktree's removal: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if !strings.Contains(m.read("app/stacks", stack, "lease"), "released=true") {
		t.Fatal("gc left the removed worktree's lease")
	}

	// A hook whose cockpit does not exist, or whose mount no daemon serves (a bare mountpoint,
	// which root may write into, or no directory at all), claims nothing and creates nothing; the
	// checkout goes on.
	bare := filepath.Join(t.TempDir(), "bare")
	if err := os.Mkdir(bare, 0o555); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct{ mnt, cockpit string }{{m.Dir, "nope"}, {bare, "app"}, {filepath.Join(bare, "absent"), "app"}} {
		if r := shIn(t, repo, `"$B" git install-hook --mount "$M" --cockpit "$C"`, "B="+binary, "M="+c.mnt, "C="+c.cockpit); r.Code != 0 {
			t.Fatalf("install on %s: exit %d\n%s", c.mnt, r.Code, r.Stderr)
		}
		wt := filepath.Join(filepath.Dir(repo), fmt.Sprintf("unclaimed%d", i))
		r := shIn(t, repo, `git worktree add -q "$W"`, "W="+wt)
		if r.Code != 0 || !strings.Contains(r.Stderr, "cockpitfs: could not claim "+c.mnt+"/"+c.cockpit+"/stacks/") {
			t.Fatalf("a checkout with the hook on %s/%s: exit %d\n%s", c.mnt, c.cockpit, r.Code, r.Stderr)
		}
	}
	if got := m.ok("ls $M"); strings.Contains(got, "nope") {
		t.Fatalf("the hook made the cockpit it was given: %q", got)
	}
	if entries, err := os.ReadDir(bare); err != nil || len(entries) != 0 {
		t.Fatalf("the hook wrote into a mountpoint no daemon serves: %v %v", entries, err)
	}
}

// echo stop > drain/attempt: the daemon runs the drain's runtime-stop itself. It ends a python
// and a node server listening on the stack's ports (SIGTERM; SIGKILL for the node server that
// ignores it, after the cockpit's [stop] grace) and the process group of the holder (but its
// session leader, and a server of another stack in it), names each in the events, and publishes
// the outcome; the clients connected to the servers go on. stop for an action that is not the runtime-stop is refused (EINVAL),
// changing nothing.
func TestWorktreesStopStepEndsServersNotClients(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "python3", "node", "setsid")
	m := newMount(t, "--gc-interval", "0")
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(47960, "10m", "1s") + "EOF")
	m.ok("mkdir $M/app/stacks/s $M/app/stacks/t && echo pid=none > $M/app/stacks/t/holders/me")
	otherPort := portOf(m, "t", "HTTP")
	// The holder: a session whose leader goes on running, with a worker in its process group,
	// and a server of the other stack t.
	holder := exec.Command("setsid", "bash", "-c", `touch "$M/app/stacks/s/holders/me" || exit 1
sleep 3600 & echo $!
python3 -c "$PY" "$PORT" >"$LOG" 2>&1 & echo $!
exec sleep 3600`)
	serverLog := filepath.Join(t.TempDir(), "server.log")
	holder.Dir, holder.Env = t.TempDir(), append(os.Environ(), "M="+m.Dir, "PY="+pythonServer, "PORT="+strconv.Itoa(otherPort), "LOG="+serverLog)
	holderOut, _ := holder.StdoutPipe()
	if err := m.ns.Do(holder.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	var pids []int
	lines := bufio.NewReader(holderOut)
	for range 2 {
		line, _ := lines.ReadString('\n')
		pid, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil {
			t.Fatalf("the holder's processes: %q", line)
		}
		testtool.KillAtEnd(t, pid)
		pids = append(pids, pid)
	}
	worker, otherServer := pids[0], pids[1]
	waitFor(t, func() string {
		out, _ := os.ReadFile(serverLog)
		return fmt.Sprintf("the other stack's server to answer on %d (process %d gone: %v); its output:\n%s\nt's events:\n%s",
			otherPort, otherServer, testtool.Gone(otherServer), out, m.read("app/stacks/t/events"))
	}, func() bool { return servesHTTP(m, otherPort) })
	httpPort, apiPort := portOf(m, "s", "HTTP"), portOf(m, "s", "API")
	py := startIn(m, "listening", "python3", "-c", pythonServer, strconv.Itoa(httpPort))
	node := startIn(m, "listening", "node", "-e", nodeServer, strconv.Itoa(apiPort), "stubborn")
	pyClient := startIn(m, "connected", "python3", "-c", keepAliveClient, strconv.Itoa(httpPort))
	nodeClient := startIn(m, "connected", "python3", "-c", keepAliveClient, strconv.Itoa(apiPort))

	m.ok("echo 'down volume:db' > $M/app/stacks/s/drain/request")
	m.ok("echo stop > $M/app/stacks/s/drain/attempt")
	if got := py.endedBy(t); got != "SIGTERM" {
		t.Errorf("the python server ended by %q, want SIGTERM", got)
	}
	if got := node.endedBy(t); got != "SIGKILL" {
		t.Errorf("the node server ended by %q, want SIGKILL", got)
	}
	if !pyClient.running() || !nodeClient.running() {
		t.Errorf("a client connected to a server was ended: python's %v, node's %v", pyClient.running(), nodeClient.running())
	}
	if testtool.Gone(holder.Process.Pid) || !testtool.Gone(worker) || testtool.Gone(otherServer) {
		t.Errorf("gone: the holder's session leader %v (want false), its worker %v (want true), the other stack's server %v (want false)",
			testtool.Gone(holder.Process.Pid), testtool.Gone(worker), testtool.Gone(otherServer))
	}
	events := m.read("app/stacks/s/events")
	for _, want := range []string{
		fmt.Sprintf(`"result":"stopped","message":"stop: process %d python3 (uid 0, listens on port %d): terminated"`, py.cmd.Process.Pid, httpPort),
		fmt.Sprintf(`"result":"stopped","message":"stop: process %d node (uid 0, listens on port %d): killed"`, node.cmd.Process.Pid, apiPort),
		fmt.Sprintf(`"result":"stopped","message":"stop: process %d sleep (uid 0, in the process group of holder me): terminated"`, worker),
		fmt.Sprintf(`"result":"stopped","message":"stop: process %d python3 (uid 0, in the process group of holder me): not signalled: it also listens on port %d of app/stacks/t"`, otherServer, otherPort),
		`"path":"app/stacks/s/drain/outcome"`,
	} {
		if !strings.Contains(events, want) {
			t.Errorf("events lack %s:\n%s", want, events)
		}
	}
	for _, pid := range []int{pyClient.cmd.Process.Pid, nodeClient.cmd.Process.Pid, holder.Process.Pid} {
		if strings.Contains(events, fmt.Sprintf("stop: process %d ", pid)) {
			t.Errorf("events name process %d, a client or the session leader:\n%s", pid, events)
		}
	}
	attempt := m.read("app/stacks/s/drain/request")
	if !strings.Contains(attempt, `"completedActionCount":1`) {
		t.Fatalf("after stop the drain: %s", attempt)
	}

	// The next action is a reclaim: stop is refused, and changes nothing.
	record := m.read("app/stacks/s/record")
	m.refused("echo stop > $M/app/stacks/s/drain/attempt", syscall.EINVAL)
	ev := claimsRefusalEvent(t, m, "app/stacks/s/events", "STATE_RECORD_MALFORMED", "EINVAL")
	if msg, _ := ev["message"].(string); !strings.Contains(msg, "the drain's next action is reclaim of volume:db") {
		t.Errorf("the refusal's message: %q", msg)
	}
	if got := m.read("app/stacks/s/record"); got != record {
		t.Fatalf("a refused stop changed the record:\n%s\n->\n%s", record, got)
	}
	m.ok("echo start > $M/app/stacks/s/drain/attempt && echo success > $M/app/stacks/s/drain/outcome")
	if !strings.Contains(m.read("app/stacks/s/lease"), "released=true") {
		t.Fatal("the drain did not end")
	}
}

// A stop requested by a user who is not root signals only that user's processes: root's server
// on the stack's port is named as not signalled (EPERM, PERMISSION_DENIED in the events) and
// goes on serving, while the user's own server is ended.
func TestWorktreesStopRefusedForAnotherUsersServer(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "python3", "node", "setpriv")
	m := ownershipMount(t, "--allow-other")
	ownershipNobodyOK(m, "mkdir $M/app && cat > $M/app/config <<'EOF'\n"+worktreesConfig(47980, "10m", "2s")+"EOF\nmkdir $M/app/stacks/s && echo pid=none > $M/app/stacks/s/holders/me")
	httpPort, apiPort := portOf(m, "s", "HTTP"), portOf(m, "s", "API")
	rootServer := startIn(m, "listening", "python3", "-c", pythonServer, strconv.Itoa(httpPort))
	nobodyServer := startIn(m, "listening", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "node", "-e", nodeServer, strconv.Itoa(apiPort))

	ownershipNobodyOK(m, "echo down > $M/app/stacks/s/drain/request && echo stop > $M/app/stacks/s/drain/attempt")
	if got := nobodyServer.endedBy(t); got != "SIGTERM" {
		t.Errorf("nobody's server ended by %q, want SIGTERM", got)
	}
	if !rootServer.running() || !servesHTTP(m, httpPort) {
		t.Fatal("root's server was stopped by nobody's drain")
	}
	events := m.read("app/stacks/s/events")
	refusal := fmt.Sprintf(`"uid":65534,"result":"refused","code":"PERMISSION_DENIED","errno":"EPERM","message":"stop: process %d (python3, uid 0, listens on port %d) is not one uid 65534 may signal: not signalled","fix":"stop it as uid 0 or root"`,
		rootServer.cmd.Process.Pid, httpPort)
	stopped := fmt.Sprintf(`"result":"stopped","message":"stop: process %d node (uid 65534, listens on port %d): terminated"`, nobodyServer.cmd.Process.Pid, apiPort)
	for _, want := range []string{refusal, stopped} {
		if !strings.Contains(events, want) {
			t.Errorf("events lack %s:\n%s", want, events)
		}
	}
	if !strings.Contains(m.read("app/stacks/s/lease"), "released=true") {
		t.Fatal("the drain did not end")
	}
}

// A grace that is not a duration within its bounds is refused when the config is written
// (EINVAL, PORT_FAMILY_OUT_OF_RANGE), leaving the config as it was, with a line in the events.
func TestWorktreesGraceRefused(t *testing.T) {
	t.Parallel()
	m := newMount(t, "--gc-interval", "0")
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(47990, "10m", "5s") + "EOF")
	before := m.read("app/config")
	for bad, message := range map[string]string{
		worktreesConfig(47990, "soon", "5s"): `gc.grace: "soon" is not a duration such as "90s", "10m" or "1h30m"`,
		worktreesConfig(47990, "10m", "5m"):  "stop.grace: 5m0s is outside 1s-1m0s",
	} {
		m.refused("cat > $M/app/config <<'EOF'\n"+bad+"EOF", syscall.EINVAL)
		ev := claimsRefusalEvent(t, m, "app/events", "PORT_FAMILY_OUT_OF_RANGE", "EINVAL")
		if msg, _ := ev["message"].(string); !strings.Contains(msg, message) {
			t.Errorf("the refusal's message %q lacks %q", msg, message)
		}
		if got := m.read("app/config"); got != before {
			t.Fatalf("a refused config changed it:\n%s", got)
		}
	}
}

// A drain its holder reserved and left (the holder dead, its worktree removed) is finished by gc
// when only its runtime-stop is left; one with a reclaim left is its executor's, and gc keeps it.
func TestWorktreesGCFinishesALeftDrain(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "git", "setsid")
	m := newMount(t, "--gc-interval", "0")
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(48000, "10m", "5s") + "EOF")
	repo := worktreesRepo(t)
	stacks := map[string]string{}
	for name, request := range map[string]string{"left": "down", "reclaims": "down volume:db"} {
		wt := filepath.Join(filepath.Dir(repo), name)
		worktreesGit(t, repo, "worktree", "add", "-q", wt)
		stacks[name] = stackOf(t, wt)
		m.ok("mkdir $M/app/stacks/" + stacks[name])
		claim := exec.Command("setsid", "bash", "-c", `touch "$M/app/stacks/$S/holders/me" && echo "$R" > "$M/app/stacks/$S/drain/request"`)
		claim.Dir, claim.Env = wt, append(os.Environ(), "M="+m.Dir, "S="+stacks[name], "R="+request)
		if out, err := claim.CombinedOutput(); err != nil {
			t.Fatalf("claim and request %s: %v\n%s", request, err, out)
		}
		worktreesGit(t, repo, "worktree", "remove", "--force", wt)
	}
	gc := m.read("gc")
	for _, want := range []string{
		"drain app/stacks/" + stacks["left"] + ": holders me (dead, process ",
		"keep app/stacks/" + stacks["reclaims"] + ": a down drain by holder me is reserved",
	} {
		if !strings.Contains(gc, want) {
			t.Fatalf("gc lacks %q:\n%s", want, gc)
		}
	}
	reclaims := m.read("app/stacks", stacks["reclaims"], "record")
	if r := shIn(t, "/", `"$B" gc "$M"`, "B="+binary, "M="+m.Dir); r.Code != 0 {
		t.Fatalf("gc: exit %d\n%s", r.Code, r.Stderr)
	}
	if !strings.Contains(m.read("app/stacks", stacks["left"], "lease"), "released=true") {
		t.Fatal("gc did not finish the left drain")
	}
	if got := m.read("app/stacks", stacks["reclaims"], "record"); got != reclaims {
		t.Fatalf("gc changed the drain with a reclaim left:\n%s\n->\n%s", reclaims, got)
	}
}

// A daemon run by a user sees only that user's processes: root's server listening on the stack's
// port is named as a process it cannot see, not signalled (EPERM, PERMISSION_DENIED), and goes
// on serving; the user's own server is ended.
func TestWorktreesStopByUsersDaemonLeavesWhatItCannotSee(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "python3", "node", "setpriv")
	m := machineNobodyMountIn(t, ownNetns(t), "--gc-interval", "0")
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(48020, "10m", "2s") + "EOF\nmkdir $M/app/stacks/s && echo pid=none > $M/app/stacks/s/holders/me")
	httpPort, _ := strconv.Atoi(strings.TrimSpace(m.ok("cat $M/app/stacks/s/ports/HTTP")))
	apiPort, _ := strconv.Atoi(strings.TrimSpace(m.ok("cat $M/app/stacks/s/ports/API")))
	rootServer := startIn(m, "listening", "python3", "-c", pythonServer, strconv.Itoa(httpPort))
	nobodyServer := startIn(m, "listening", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "node", "-e", nodeServer, strconv.Itoa(apiPort))

	m.ok("echo down > $M/app/stacks/s/drain/request && echo stop > $M/app/stacks/s/drain/attempt")
	if got := nobodyServer.endedBy(t); got != "SIGTERM" {
		t.Errorf("nobody's server ended by %q, want SIGTERM", got)
	}
	if !rootServer.running() || !servesHTTP(m, httpPort) {
		t.Fatal("root's server was stopped by a drain of nobody's daemon")
	}
	events := m.ok("cat $M/app/stacks/s/events")
	refusal := fmt.Sprintf(`"result":"refused","code":"PERMISSION_DENIED","errno":"EPERM","message":"stop: a process the daemon cannot see (uid 0, listens on port %d) is not one uid 65534 may signal: not signalled"`, httpPort)
	stopped := fmt.Sprintf(`"result":"stopped","message":"stop: process %d node (uid 65534, listens on port %d): terminated"`, nobodyServer.cmd.Process.Pid, apiPort)
	for _, want := range []string{refusal, stopped} {
		if !strings.Contains(events, want) {
			t.Errorf("events lack %s:\n%s", want, events)
		}
	}
}

// On a team's shared store a daemon judges only the holders its own machine started: a pid-less
// holder's checkout path may be another machine's, so its stack is kept; a stack of a holder this
// machine started, dead, its checkout gone, is drained.
func TestWorktreesGCOnSharedStoreJudgesOnlyItsMachine(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "setsid")
	cluster := etcdtest.Start(t, 1)
	m := newEtcdMount(t, cluster.URL("team"))
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(18100, "10m", "5s") + "EOF")
	gone := filepath.Join(t.TempDir(), "gone")
	m.ok("mkdir $M/app/stacks/pidless $M/app/stacks/mine && echo 'pid=none checkout=" + gone + "' > $M/app/stacks/pidless/holders/me")
	claim := exec.Command("setsid", "bash", "-c", `touch "$M/app/stacks/mine/holders/me"`)
	claim.Dir, claim.Env = t.TempDir(), append(os.Environ(), "M="+m.Dir)
	if out, err := claim.CombinedOutput(); err != nil {
		t.Fatalf("claim: %v\n%s", err, out)
	}
	if err := os.Remove(claim.Dir); err != nil {
		t.Fatal(err)
	}
	gc := m.read("gc")
	for _, want := range []string{
		"keep app/stacks/pidless: holder me may be another machine's, whose checkouts this daemon cannot see",
		"drain app/stacks/mine: holders me (dead, process ",
	} {
		if !strings.Contains(gc, want) {
			t.Fatalf("gc lacks %q:\n%s", want, gc)
		}
	}
	if r := shIn(t, "/", `"$B" gc "$M"`, "B="+binary, "M="+m.Dir); r.Code != 0 || strings.Contains(r.Stdout, "pidless") {
		t.Fatalf("gc: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if !strings.Contains(m.read("app/stacks/pidless/lease"), "released=false") || !strings.Contains(m.read("app/stacks/mine/lease"), "released=true") {
		t.Fatal("gc drained the wrong stack")
	}
}

// cockpitfs gc drains, as its user, only the stale stacks that user may drain: another user's
// run leaves root's stale stack as it was and prints nothing; root's run drains it.
func TestWorktreesGCDrainsOnlyWhatItsUserMay(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "setpriv")
	m := ownershipMount(t, "--allow-other")
	gone := filepath.Join(t.TempDir(), "gone")
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(48040, "10m", "5s") + "EOF\nmkdir $M/app/stacks/s && echo 'pid=none checkout=" + gone + "' > $M/app/stacks/s/holders/me")
	before := m.read("app/stacks/s/record") + m.read("app/stacks/s/events")
	r := shIn(t, "/", `exec setpriv --reuid=65534 --regid=65534 --clear-groups "$B" gc "$M"`, "B="+binary, "M="+m.Dir)
	if r.Code != 0 || r.Stdout != "" {
		t.Fatalf("gc as nobody: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if after := m.read("app/stacks/s/record") + m.read("app/stacks/s/events"); after != before {
		t.Fatalf("gc as nobody changed root's stack:\n%s\n->\n%s", before, after)
	}
	r = shIn(t, "/", `"$B" gc "$M"`, "B="+binary, "M="+m.Dir)
	if r.Code != 0 || !strings.HasPrefix(r.Stdout, "drained app/stacks/s: holders me (pid-less)") {
		t.Fatalf("gc as root: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
}

// gc looks at a holder's checkout with the holder's rights, not the daemon's: a co-user who names
// paths in a directory only root may read learns nothing of them from root's daemon (one there and
// one absent both "cannot be told gone: permission denied"), where root's own holder of the absent
// path is found gone.
func TestWorktreesGCLooksAsTheHolder(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "setpriv")
	m := ownershipMount(t, "--allow-other", "--gc-interval", "0")
	private := t.TempDir() // root's, 0700
	if err := os.WriteFile(filepath.Join(private, "there"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ownershipNobodyOK(m, "mkdir $M/nob && cat > $M/nob/config <<'EOF'\n"+worktreesConfig(48060, "720h", "5s")+"EOF\n"+
		"mkdir $M/nob/stacks/there $M/nob/stacks/absent && echo 'pid=none checkout="+private+"/there' > $M/nob/stacks/there/holders/h && echo 'pid=none checkout="+private+"/absent' > $M/nob/stacks/absent/holders/h")
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(48080, "720h", "5s") + "EOF\n" +
		"mkdir $M/app/stacks/mine && echo 'pid=none checkout=" + private + "/absent' > $M/app/stacks/mine/holders/h")
	r := shIn(t, "/", `"$B" gc --dry-run "$M"`, "B="+binary, "M="+m.Dir)
	for _, want := range []string{
		"keep nob/stacks/there: holder h's checkout " + private + "/there cannot be told gone: permission denied\n",
		"keep nob/stacks/absent: holder h's checkout " + private + "/absent cannot be told gone: permission denied\n",
		"drain app/stacks/mine: holders h (pid-less); checkouts gone: " + private + "/absent\n",
	} {
		if r.Code != 0 || !strings.Contains(r.Stdout, want) {
			t.Fatalf("gc --dry-run lacks %q: exit %d\nstdout: %s\nstderr: %s", want, r.Code, r.Stdout, r.Stderr)
		}
	}
}

// gcVictim is the uid whose server the owner of another cockpit tries to have root's sweep end.
const gcVictim = 1001

// asGCVictim are setpriv's arguments that run a program as uid and gid gcVictim, with no groups.
var asGCVictim = []string{"--reuid=" + strconv.Itoa(gcVictim), "--regid=" + strconv.Itoa(gcVictim), "--clear-groups"}

// asVictim runs script with bash as gcVictim (asGCVictim), from /, with $M set; it fails the test
// unless the script succeeds.
func asVictim(m *mount, script string) {
	m.t.Helper()
	r := shIn(m.t, "/", `exec setpriv $ARGS bash -c "$S"`, "ARGS="+strings.Join(asGCVictim, " "), "M="+m.Dir, "S="+script)
	if r.Code != 0 {
		m.t.Fatalf("as uid %d, script failed (exit %d):\n%s\nstdout: %s\nstderr: %s", gcVictim, r.Code, script, r.Stdout, r.Stderr)
	}
}

// Root's sweep stops only what every uid with a say in a stack being stale may signal. A
// cockpit's owner (nobody) makes another user's stack in it stale (a pid-less holder of a path
// that does not exist added, the user's holder removed: both an owner's rights): the sweep drains
// it but leaves the user's server on its port serving, naming it as not one uid 65534 may signal.
// The same user's own stale stack, in the user's own cockpit, has its server ended by the sweep.
func TestWorktreesGCStopsNothingTheOwnerMayNotSignal(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "node", "setpriv")
	m := ownershipMount(t, "--allow-other", "--gc-interval", "100ms")
	checkout := map[string]string{}
	for _, name := range []string{"attacked", "own"} {
		checkout[name] = filepath.Join(filepath.Dir(m.Dir), name)
		if err := os.Mkdir(checkout[name], 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(checkout[name], gcVictim, gcVictim); err != nil {
			t.Fatal(err)
		}
	}
	ownershipNobodyOK(m, "mkdir $M/evil && cat > $M/evil/config <<'EOF'\n"+worktreesConfig(45600, "1s", "2s")+"EOF")
	asVictim(m, "mkdir $M/evil/stacks/vs && echo 'pid=none checkout="+checkout["attacked"]+"' > $M/evil/stacks/vs/holders/vic\n"+
		"mkdir $M/vc && cat > $M/vc/config <<'EOF'\n"+worktreesConfig(45700, "1s", "2s")+"EOF\n"+
		"mkdir $M/vc/stacks/own && echo 'pid=none checkout="+checkout["own"]+"' > $M/vc/stacks/own/holders/vic")
	port := func(cockpit, stack string) int {
		p, err := strconv.Atoi(strings.TrimSpace(m.read(cockpit, "stacks", stack, "ports", "HTTP")))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	attackedPort, ownPort := port("evil", "vs"), port("vc", "own")
	server := func(port int) *process {
		return startIn(m, "listening", "setpriv", append(slices.Clone(asGCVictim), "node", "-e", nodeServer, strconv.Itoa(port))...)
	}
	attacked, own := server(attackedPort), server(ownPort)

	ownershipNobodyOK(m, "echo 'pid=none checkout=/nonexistent-atk' > $M/evil/stacks/vs/holders/atk && rm $M/evil/stacks/vs/holders/vic")
	if err := os.Remove(checkout["own"]); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"evil/stacks/vs", "vc/stacks/own"} {
		waitFor(t, func() string { return s + " drained by the sweep: " + m.read(s, "lease") },
			func() bool { return strings.Contains(m.read(s, "lease"), "released=true") })
	}

	if !attacked.running() || !servesHTTP(m, attackedPort) {
		t.Errorf("the sweep stopped uid %d's server on evil/stacks/vs, which its cockpit's owner made stale", gcVictim)
	}
	events := m.read("evil/stacks/vs/events")
	refusal := fmt.Sprintf(`"uid":%[1]d,"result":"refused","code":"PERMISSION_DENIED","errno":"EPERM","message":"stop: process %[2]d (node, uid %[1]d, listens on port %[3]d) is not one uid 65534 may signal: not signalled (gc stops only what each of uids %[1]d, 65534 may signal: the stack's creator, its cockpit's owner, its holders' and its drain's)","fix":"stop it as uid %[1]d or root"}`,
		gcVictim, attacked.cmd.Process.Pid, attackedPort)
	var refused bool
	for _, line := range strings.Split(events, "\n") {
		refused = refused || strings.Contains(line, `"op":"gc","path":"evil/stacks/vs/drain/attempt"`) && strings.HasSuffix(line, refusal)
	}
	if !refused || strings.Contains(events, `"result":"stopped"`) {
		t.Errorf("evil/stacks/vs's events, want gc's refusal %s and nothing stopped:\n%s", refusal, events)
	}
	if holders := m.ok("ls -A $M/evil/stacks/vs/holders"); holders != "" {
		t.Errorf("evil/stacks/vs drained, its holders: %q", holders)
	}

	if got := own.endedBy(t); got != "SIGTERM" {
		t.Errorf("uid %d's server on its own stale stack ended by %q, want the sweep's SIGTERM", gcVictim, got)
	}
	stopped := fmt.Sprintf(`"uid":%d,"result":"stopped","message":"stop: process %d node (uid %d, listens on port %d): terminated"`,
		gcVictim, own.cmd.Process.Pid, gcVictim, ownPort)
	if events := m.read("vc/stacks/own/events"); !strings.Contains(events, stopped) {
		t.Errorf("vc/stacks/own's events lack %s:\n%s", stopped, events)
	}
}

// A holder's checkout below a FUSE server that never answers (a stopped daemon: any user may
// stop their own, or name a path on one) holds up nobody: gc keeps that stack, saying the path
// did not answer, and drains another stack whose checkout is gone, as before. The same uid's
// other checkouts are not looked at in that survey, and the path is not looked at again for a
// minute: the next survey waits on it no more.
func TestWorktreesGCPastACheckoutThatNeverAnswers(t *testing.T) {
	t.Parallel()
	m := newMount(t, "--gc-interval", "0")
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(47990, "720h", "5s") + "EOF")
	other := newMount(t)
	if err := other.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.cmd.Process.Signal(syscall.SIGCONT) }) // before other's stop
	stuck := other.Path("x")
	m.ok("mkdir $M/app/stacks/stuck $M/app/stacks/stuck2 $M/app/stacks/gone && echo pid=none checkout=" + stuck + " > $M/app/stacks/stuck/holders/h && " +
		"echo pid=none checkout=" + other.Path("y") + " > $M/app/stacks/stuck2/holders/h && echo pid=none checkout=/nonexistent/gone > $M/app/stacks/gone/holders/h")

	// A gc read waiting on the stopped server waits unkillably (the daemon took the request):
	// after a minute the server goes on, which ends it, and the test fails.
	gc := func(args ...string) (string, error) {
		t.Helper()
		waited := time.AfterFunc(time.Minute, func() { other.cmd.Process.Signal(syscall.SIGCONT) })
		out, err := exec.Command(binary, append([]string{"gc"}, args...)...).CombinedOutput()
		if !waited.Stop() {
			t.Fatalf("gc %v waited on the stopped server for a minute (%v):\n%s", args, err, out)
		}
		return string(out), err
	}
	keep := "keep app/stacks/stuck: holder h's checkout " + stuck + " cannot be told gone: "
	keep2 := "keep app/stacks/stuck2: holder h's checkout " + other.Path("y") + " cannot be told gone: "
	// One wait per survey, not one per path.
	out, err := gc("--dry-run", m.Dir)
	if err != nil || !strings.Contains(out, keep+"did not answer in 2s\n") || !strings.Contains(out, keep2+"uid 0's checkout "+stuck+" did not answer in this survey\n") || !strings.Contains(out, "drain app/stacks/gone: ") {
		t.Fatalf("gc --dry-run (%v):\n%s", err, out)
	}
	// The path that did not answer is not asked again for a minute: nor are the uid's paths after
	// it, as in the survey that met it.
	out, err = gc(m.Dir)
	if err != nil || out != "drained app/stacks/gone: holders h (pid-less); checkouts gone: /nonexistent/gone\n" {
		t.Fatalf("gc (%v):\n%s", err, out)
	}
	out, err = gc("--dry-run", m.Dir)
	if quiet := "uid 0's checkout " + stuck + " did not answer at "; err != nil || !strings.Contains(out, keep+quiet) || !strings.Contains(out, keep2+quiet) || !strings.Contains(out, ", and is not looked at again before ") {
		t.Fatalf("gc --dry-run within a minute of the paths' silence (%v):\n%s", err, out)
	}
	if !strings.Contains(m.read("app/stacks/stuck/lease"), "released=false") || !strings.Contains(m.read("app/stacks/gone/lease"), "released=true") {
		t.Fatal("gc drained the wrong stack")
	}
}

// However many read gc at once, a co-user's checkout on a FUSE server that takes the request
// and never answers (an sshfs whose link died) holds one probe of the daemon's: the first survey
// looks and its probe stays, unkillable; the other surveys wait for that look and report it,
// looking at nothing (each would otherwise have left a probe of its own: about a hundred for 300
// threads reading gc for 10 s, each some MB and two of the daemon's descriptors, until the server
// died). Another user's stack is judged as ever.
func TestWorktreesGCOneProbeHoweverManyRead(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "setpriv")
	m := ownershipMount(t, "--allow-other", "--gc-interval", "0")
	// Its name looked up now, so that the reads' opens reach the daemon together: the kernel holds
	// every lookup of a name but the first until it is answered.
	m.ok("stat $M/gc > /dev/null && mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(47400, "720h", "5s") + "EOF\n" +
		"mkdir $M/app/stacks/gone && echo pid=none checkout=/nonexistent/gone > $M/app/stacks/gone/holders/h")
	hung := startHungServer(t)
	ownershipNobodyOK(m, "mkdir $M/nob && cat > $M/nob/config <<'EOF'\n"+worktreesConfig(47420, "720h", "5s")+"EOF\n"+
		"mkdir $M/nob/stacks/hung && echo 'pid=none checkout="+hung.dir+"/x' > $M/nob/stacks/hung/holders/h")

	const readers = 30
	start := make(chan struct{})
	done := make(chan string, readers)
	for range readers {
		go func() {
			<-start
			data, err := os.ReadFile(m.Path("gc"))
			if err != nil {
				done <- err.Error()
				return
			}
			done <- string(data)
		}()
	}
	close(start)
	var reads []string
	for range readers {
		select {
		case read := <-done:
			reads = append(reads, read)
		case <-time.After(20 * time.Second):
			t.Fatal("a read of gc did not return in 20s")
		}
	}
	if probes := childrenOf(m.cmd.Process.Pid, 65534); probes != 1 || hung.lookups() != 1 {
		t.Fatalf("after %d concurrent reads of gc the daemon has %d probes of uid 65534, the server took %d lookups; want 1 each", readers, probes, hung.lookups())
	}
	keep := "keep nob/stacks/hung: holder h's checkout " + hung.dir + "/x cannot be told gone: "
	looked := 0
	for _, read := range reads {
		if !strings.Contains(read, "drain app/stacks/gone: holders h (pid-less); checkouts gone: /nonexistent/gone\n") {
			t.Fatalf("a read of gc lacks root's gone stack:\n%s", read)
		}
		switch {
		case strings.Contains(read, keep+"did not answer in 2s\n"):
			looked++
		case !strings.Contains(read, keep+"uid 65534's checkout "+hung.dir+"/x has not answered since "):
			t.Fatalf("a read of gc:\n%s", read)
		}
	}
	if looked != 1 {
		t.Fatalf("%d of %d concurrent reads of gc looked at the checkout, want 1", looked, readers)
	}
}

// A stat of gc (ls -l of the mount) surveys nothing: a co-user's stopped or hung server holds up
// nobody's `ls -l`, and no checkout is looked at. Its size is 0, as a /proc file's, and a read
// gets the whole survey all the same (through direct I/O, to its end).
func TestWorktreesGCStatLooksAtNoCheckout(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "setpriv", "python3")
	m := ownershipMount(t, "--allow-other", "--gc-interval", "0")
	m.ok("mkdir $M/app && cat > $M/app/config <<'EOF'\n" + worktreesConfig(47440, "720h", "5s") + "EOF\n" +
		"mkdir $M/app/stacks/gone && echo pid=none checkout=/nonexistent/gone > $M/app/stacks/gone/holders/h")
	want := "drain app/stacks/gone: holders h (pid-less); checkouts gone: /nonexistent/gone\n"
	if got := m.ok("cat $M/gc && python3 -c 'import sys; sys.stdout.write(open(sys.argv[1]).read())' $M/gc"); got != want+want {
		t.Fatalf("cat and python's read of gc:\n%s", got)
	}

	hung := startHungServer(t)
	ownershipNobodyOK(m, "mkdir $M/nob && cat > $M/nob/config <<'EOF'\n"+worktreesConfig(47460, "720h", "5s")+"EOF\n"+
		"mkdir $M/nob/stacks/hung && echo 'pid=none checkout="+hung.dir+"/x' > $M/nob/stacks/hung/holders/h && stat $M/gc > /dev/null")
	sizes := m.ok("stat -c %s $M/gc && ls -l $M | grep ' gc$'")
	if probes := childrenOf(m.cmd.Process.Pid, 65534); probes != 0 || hung.lookups() != 0 {
		t.Fatalf("stats of gc left %d probes of uid 65534, the server took %d lookups; want none", probes, hung.lookups())
	}
	if !strings.HasPrefix(sizes, "0\n") || !strings.Contains(sizes, " 0 ") {
		t.Fatalf("root's stat and ls -l of gc:\n%s", sizes)
	}
}

// childrenOf counts the processes of uid (real) whose parent is pid.
func childrenOf(pid, uid int) int {
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range entries {
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue // not a process, or gone
		}
		parent, owner := -1, -1
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "PPid:"); ok {
				parent, _ = strconv.Atoi(strings.TrimSpace(v))
			}
			if v, ok := strings.CutPrefix(line, "Uid:"); ok && len(strings.Fields(v)) > 0 {
				owner, _ = strconv.Atoi(strings.Fields(v)[0])
			}
		}
		if parent == pid && owner == uid {
			n++
		}
	}
	return n
}

// hungServerEnv names, in a helper process's environment, the directory where it mounts, as uid
// 65534, a FUSE server that takes every lookup and never answers (runHungServer).
const hungServerEnv = "COCKPITFS_TEST_HUNG_SERVER"

// hungServer is the helper process (this test binary run again) and what it reported.
type hungServer struct {
	dir string // its mount point: a path below it never answers
	mu  sync.Mutex
	n   int // the lookups it took
}

// lookups is how many lookups the server has taken.
func (s *hungServer) lookups() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// startHungServer starts the helper and waits until it serves. Its cleanup kills it, which ends
// every request it holds (and with them whatever waits on them), then detaches its mount.
func startHungServer(t *testing.T) *hungServer {
	t.Helper()
	testtool.Need(t, "fusermount3")
	base, err := os.MkdirTemp("/tmp", "cockpitfs-hung")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	s := &hungServer{dir: filepath.Join(base, "mnt")}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(s.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(s.dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), hungServerEnv+"="+s.dir)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		detach(s.dir)
	})
	mounted := make(chan struct{})
	go func() {
		lines := bufio.NewScanner(out)
		for lines.Scan() {
			switch lines.Text() {
			case "mounted":
				close(mounted)
			case "lookup":
				s.mu.Lock()
				s.n++
				s.mu.Unlock()
			}
		}
	}()
	select {
	case <-mounted:
	case <-time.After(20 * time.Second):
		t.Fatalf("the hung server did not mount in 20s; its stderr:\n%s", stderr.String())
	}
	return s
}

// runHungServer is the helper: it becomes uid 65534, mounts at dir a server whose every lookup
// it reports ("lookup" on stdout) and never answers, says "mounted", and serves until killed.
func runHungServer(dir string) {
	if err := syscall.Setgroups(nil); err != nil {
		panic(err)
	}
	if err := syscall.Setgid(65534); err != nil {
		panic(err)
	}
	if err := syscall.Setuid(65534); err != nil {
		panic(err)
	}
	server, err := fusefs.Mount(dir, &hungRoot{}, &fusefs.Options{})
	if err != nil {
		panic(err)
	}
	fmt.Println("mounted")
	server.Wait()
	os.Exit(0)
}

type hungRoot struct{ fusefs.Inode }

func (*hungRoot) Lookup(context.Context, string, *fuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	fmt.Println("lookup")
	select {}
}
