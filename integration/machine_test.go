package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/cockpitfs/cockpitfs/internal/netns"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// One machine, several daemons (issue 11): every daemon holds the ports of its active leases
// machine-wide, so no port is ever in two daemons' active leases. The daemons of each test share a
// network namespace of the test's own — one "machine" — so other tests' daemons stay out. Port
// bases here are 45xxx-49xxx.

// machineNobodyMountIn starts a daemon as uid 65534 in ns, its mount point and store in a
// directory that user owns.
func machineNobodyMountIn(t *testing.T, ns *netns.NS, args ...string) *mount {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPING: runs as root to become uid 65534")
	}
	home := nonrootDir(t)
	m := &mount{t: t, ns: ns, nobody: true, Dir: filepath.Join(home, "mnt"), Data: filepath.Join(home, "data")}
	m.start(args...)
	t.Cleanup(m.stop)
	return m
}

// machineSharedNetns is a namespace for the test's daemons to share; root only.
func machineSharedNetns(t *testing.T) *netns.NS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPING: a namespace of the test's own needs root")
	}
	return ownNetns(t)
}

// machineHolds reads the kernel's table of bound abstract unix names in the daemon's namespace:
// port → socket inode of "cockpitfs/port/<port>/<balance>" (of the legacy "cockpitfs/port/<port>"
// when that alone is bound).
func machineHolds(t *testing.T, m *mount) map[int]string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", m.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	holds := map[int]string{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 8 && strings.HasPrefix(f[7], "@cockpitfs/port/") {
			digits, _, balanced := strings.Cut(strings.TrimPrefix(f[7], "@cockpitfs/port/"), "/")
			port, _ := strconv.Atoi(digits)
			if _, seen := holds[port]; balanced || !seen {
				holds[port] = f[6]
			}
		}
	}
	return holds
}

// machineLegacyHeld says whether the daemon holds port's legacy name, "cockpitfs/port/<port>".
func machineLegacyHeld(t *testing.T, m *mount, port int) bool {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", m.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	sockets := machineSockets(m.cmd.Process.Pid)
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 8 && f[7] == fmt.Sprintf("@cockpitfs/port/%d", port) && sockets[f[6]] {
			return true
		}
	}
	return false
}

// machineSockets is the set of socket inodes process pid has open.
func machineSockets(pid int) map[string]bool {
	out := map[string]bool{}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, _ := os.ReadDir(dir)
	for _, fd := range fds {
		if link, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && strings.HasPrefix(link, "socket:[") {
			out[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	return out
}

// machineIndex reads the mount's ports/ index as the mount's user: port → its file's line. Only
// shell builtins read another user's, so a sample takes one process start.
func machineIndex(m *mount) map[int]string {
	if !m.nobody { // root reads it itself, without a process start
		index := map[int]string{}
		names, _ := os.ReadDir(m.Path("ports"))
		for _, n := range names {
			port, err := strconv.Atoi(n.Name())
			if line, rerr := os.ReadFile(m.Path("ports", n.Name())); err == nil && rerr == nil {
				index[port] = strings.TrimSuffix(string(line), "\n")
			}
		}
		return index
	}
	out := m.sh(`for f in $M/ports/*; do read -r line < "$f" && echo "${f##*/} $line"; done 2>/dev/null; true`).Stdout
	index := map[int]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		name, content, ok := strings.Cut(line, " ")
		if port, err := strconv.Atoi(name); ok && err == nil && content != "" {
			index[port] = content
		}
	}
	return index
}

// machineApp gives the mount the cockpit app, with the same config on every daemon, and stacks.
func machineApp(m *mount, count, base int, stacks ...string) {
	m.t.Helper()
	m.ok(fmt.Sprintf("mkdir $M/app && cat > $M/app/config <<'EOF'\n[ports]\nstep = 10\ncount = %d\n[ports.bases]\nHTTP = %d\nDB = %d\nEOF", count, base, base+500))
	for _, s := range stacks {
		m.ok("mkdir $M/app/stacks/" + s)
	}
}

// machineDrain ends a stack's lease with a sleep drain.
const machineDrain = `echo sleep > $S/drain/request && echo start > $S/drain/attempt && echo success > $S/drain/outcome`

// Two daemons under two uids, with their own stores and the same config and port range, race 240
// claims and drains. While they run, a checker compares both ports/ indexes with the kernel's
// holds again and again: every port a daemon's index shows as its own lease is held by that
// daemon's socket (the same socket before and after the indexes were read), so no port sits in
// two active leases at any moment.
func TestMachineTwoDaemonsNeverShareAPort(t *testing.T) {
	t.Parallel() // its daemons are in a network namespace of the test's own
	ns := machineSharedNetns(t)
	byRoot := newMountIn(t, ns)
	byNobody := machineNobodyMountIn(t, ns)
	const base, rounds = 45000, 40
	daemons := []*mount{byRoot, byNobody}
	workers := [][]string{{"r1", "r2", "r3"}, {"r4", "r5", "r6"}, {"n1", "n2", "n3"}, {"n4", "n5", "n6"}}
	machineApp(byRoot, 8, base, append(workers[0], workers[1]...)...)
	machineApp(byNobody, 8, base, append(workers[2], workers[3]...)...)

	var wg sync.WaitGroup
	outputs := make([]string, len(workers))
	for i, stacks := range workers {
		m := daemons[i/2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each round toggles each stack: claim it when idle, drain it when leased.
			script := fmt.Sprintf(`for round in $(seq %d); do for s in %s; do S=$M/app/stacks/$s
  if [ -e $S/holders/h ]; then { %s; } 2>/dev/null && echo drained || echo drain-failed
  elif : >> $S/holders/h 2>/dev/null; then echo claimed; else echo refused; fi
done; done`, rounds, strings.Join(stacks, " "), machineDrain)
			outputs[i] = m.sh(script).Stdout
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	samples, conclusive, sawOther := 0, 0, false
	check := func() {
		before := machineHolds(t, byRoot)
		indexes := []map[int]string{machineIndex(byRoot), machineIndex(byNobody)}
		after := machineHolds(t, byRoot)
		sockets := []map[string]bool{machineSockets(byRoot.cmd.Process.Pid), machineSockets(byNobody.cmd.Process.Pid)}
		samples++
		for d, index := range indexes {
			for port, line := range index {
				// Root's daemon follows nobody's /proc/<pid>/exe and vouches for it; nobody's
				// may not follow root's, and names root's daemon by the kernel alone.
				if other := []string{"daemon=other pid=" + strconv.Itoa(byNobody.cmd.Process.Pid) + " uid=65534 ",
					"daemon=none pid=" + strconv.Itoa(byRoot.cmd.Process.Pid) + " uid=0"}[d]; strings.HasPrefix(line, "daemon=") {
					sawOther = true
					if !strings.HasPrefix(line, other) {
						t.Errorf("daemon %d lists port %d as %q, want %q…", d, port, line, other)
					}
					continue
				}
				if !strings.HasPrefix(line, "cockpit=") {
					t.Errorf("daemon %d lists port %d as %q", d, port, line)
					continue
				}
				inode, held := before[port]
				if !held || after[port] != inode {
					continue // the hold changed while the indexes were read: no conclusion
				}
				conclusive++
				if !sockets[d][inode] {
					t.Errorf("sample %d: port %d is in daemon %d's active leases (%s), but its hold is another process's", samples, port, d, line)
				}
				if other := indexes[1-d][port]; strings.HasPrefix(other, "cockpit=") {
					t.Errorf("sample %d: port %d is in both daemons' active leases: %q and %q", samples, port, line, other)
				}
			}
		}
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		check()
	}
	check()

	claims, claimed := 0, 0
	for i, out := range outputs {
		claims += strings.Count(out, "claimed") + strings.Count(out, "refused")
		claimed += strings.Count(out, "claimed")
		if strings.Contains(out, "drain-failed") {
			t.Errorf("worker %d: a drain failed:\n%s", i, out)
		}
	}
	t.Logf("%d claims (%d leased), %d samples, %d conclusive port checks", claims, claimed, samples, conclusive)
	if claims < 200 || claimed == 0 || conclusive == 0 {
		t.Fatalf("too little happened: %d claims, %d leased, %d conclusive checks", claims, claimed, conclusive)
	}
	if !sawOther {
		t.Error("no index ever listed a port of the other daemon")
	}
}

// Another daemon's data directory and mount are its user's to name: a path with spaces and '='
// in it is shown quoted, so that it never reads as fields of the line — here, as the lease of a
// stack this daemon never made — nor as words of a claim's events line.
func TestMachineOtherDaemonsPathsCannotForgeFields(t *testing.T) {
	t.Parallel() // its daemons are in a network namespace of the test's own
	ns := machineSharedNetns(t)
	a := newMountIn(t, ns)
	base := t.TempDir()
	b := &mount{t: t, ns: ns, Dir: filepath.Join(base, "m=(lease),app"), Data: filepath.Join(base, "d mount=/forged cockpit=app stack=forged key=HTTP")}
	b.start()
	t.Cleanup(b.stop)
	const port = 46600
	machineApp(b, 3, port, "b1")
	b.ok("touch $M/app/stacks/b1/holders/me")
	machineApp(a, 3, port, "a1")
	want := fmt.Sprintf("daemon=other pid=%d uid=0 data=%q mount=%q cockpit=app stack=b1 key=HTTP\n", b.cmd.Process.Pid, b.Data, b.Dir)
	if got := a.read("ports", strconv.Itoa(port)); got != want {
		t.Fatalf("ports/%d = %q, want %q", port, got, want)
	}
	a.ok("touch $M/app/stacks/a1/holders/me")
	if ev := a.lastEvent("app/stacks/a1/events"); !strings.Contains(ev, fmt.Sprintf("(data %s, lease app/b1)", strings.ReplaceAll(strconv.Quote(b.Data), `"`, `\"`))) {
		t.Fatalf("a1's claim does not name b's data directory quoted: %s", ev)
	}
}

// A daemon killed with SIGKILL strands nothing: the other daemon leases its family at once. Started
// again it takes back the holds of its leases before it serves, keeps those nobody took, and
// reports the one the other daemon took — in health, events and verify — without sharing it.
func TestMachineKilledDaemonStrandsNothing(t *testing.T) {
	t.Parallel() // its daemons are in a network namespace of the test's own
	ns := machineSharedNetns(t)
	a, b := newMountIn(t, ns), newMountIn(t, ns)
	const base = 46000
	machineApp(a, 3, base, "a1", "a2")
	machineApp(b, 3, base, "b1", "b2")
	a.ok("touch $M/app/stacks/a1/holders/me $M/app/stacks/a2/holders/me")
	b.ok("touch $M/app/stacks/b1/holders/me")
	if got := b.read("app/stacks/b1/ports/HTTP"); got != fmt.Sprintf("%d\n", base+20) {
		t.Fatalf("b1 leased HTTP=%s beside a's two families", got)
	}
	if ev := b.lastEvent("app/stacks/b1/events"); !strings.Contains(ev, `"result":"ok"`) ||
		!strings.Contains(ev, fmt.Sprintf("port %d is held by the cockpitfs daemon process %d uid 0 (data %s, lease app/a1)", base+500, a.cmd.Process.Pid, a.Data)) {
		t.Fatalf("b1's claim does not say why it skipped a's families: %s", ev)
	}
	if got := b.read("ports", strconv.Itoa(base)); got != fmt.Sprintf("daemon=other pid=%d uid=0 data=%s mount=%s cockpit=app stack=a1 key=HTTP\n", a.cmd.Process.Pid, a.Data, a.Dir) {
		t.Fatalf("b's ports/%d = %q", base, got)
	}

	a.Kill()
	b.ok("touch $M/app/stacks/b2/holders/me")
	if got := b.read("app/stacks/b2/ports/HTTP"); got != fmt.Sprintf("%d\n", base) {
		t.Fatalf("after a's SIGKILL, b2 leased HTTP=%s, want a1's %d", got, base)
	}

	// Offline, verify sees the port a's store still leases and b holds.
	out, err := a.verify()
	if err == nil || !strings.Contains(out, fmt.Sprintf("active lease port HTTP=%d is held by the cockpitfs daemon process %d uid 0 (data %s, lease app/b2)", base, b.cmd.Process.Pid, b.Data)) {
		t.Fatalf("verify of a's store while b holds a1's port: %v\n%s", err, out)
	}

	a.start()
	health := a.read("app/stacks/a1/health")
	if !strings.Contains(health, fmt.Sprintf(`port %d (HTTP) of this stack's lease is held by the cockpitfs daemon process %d`, base, b.cmd.Process.Pid)) {
		t.Fatalf("a1's health does not report the port b took:\n%s", health)
	}
	if got, want := a.read("ports", strconv.Itoa(base)), fmt.Sprintf("cockpit=app stack=a1 key=HTTP offset=0\nconflict: daemon=other pid=%d uid=0 data=%s mount=%s cockpit=app stack=b2 key=HTTP\n", b.cmd.Process.Pid, b.Data, b.Dir); got != want {
		t.Fatalf("a's ports/%d = %q, want %q", base, got, want)
	}
	events := a.read("app/stacks/a1/events")
	if !strings.Contains(events, `"result":"conflict","code":"PORT_FAMILY_COLLISION"`) || !strings.Contains(events, fmt.Sprintf("port %d (HTTP)", base)) {
		t.Fatalf("a1's events do not report the conflict:\n%s", events)
	}
	if !strings.Contains(a.log.String(), "conflict: app/a1") {
		t.Fatalf("the daemon's log does not report the conflict:\n%s", a.log)
	}
	// a2 kept its family: its holds are the restarted daemon's, its health is clean.
	holds, sockets := machineHolds(t, a), machineSockets(a.cmd.Process.Pid)
	for _, port := range []int{base + 10, base + 510} {
		if !sockets[holds[port]] {
			t.Errorf("port %d of a2's lease is not held by the restarted daemon", port)
		}
	}
	if strings.Contains(a.read("app/stacks/a2/health"), "is held by") {
		t.Error("a2's health reports a conflict")
	}
	if sockets[holds[base]] {
		t.Errorf("port %d is held by both daemons", base)
	}

	// The fix the conflict names: drain a1. Its lease goes, and verify is clean again.
	a.ok("S=$M/app/stacks/a1; " + machineDrain)
	if strings.Contains(a.read("app/stacks/a2/health"), "is held by") {
		t.Error("a2's health reports a conflict after a1's drain")
	}
	holds, sockets = machineHolds(t, a), machineSockets(a.cmd.Process.Pid)
	if sockets[holds[base]] || sockets[holds[base+500]] || !sockets[holds[base+10]] {
		t.Errorf("after a1's drain, a holds %v of ports %d, %d, %d", holds, base, base+500, base+10)
	}
}

// machineSquat runs a process that is not cockpitfs holding port's legacy name in the daemon's
// namespace (as an older daemon holds it), listening but never answering, until the test ends.
func machineSquat(m *mount, port int) *exec.Cmd {
	m.t.Helper()
	cmd := exec.Command("python3", "-c", `import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(b"\0cockpitfs/port/" + sys.argv[1].encode())
s.listen(1)
print("bound", flush=True)
time.sleep(600)`, strconv.Itoa(port))
	return m.startBound(cmd)
}

// startBound starts cmd in the daemon's network namespace and returns once it prints "bound"
// (its names are bound); it is killed when the test ends.
func (m *mount) startBound(cmd *exec.Cmd) *exec.Cmd {
	m.t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		m.t.Fatal(err)
	}
	if err := m.ns.Do(cmd.Start); err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "bound\n" {
		m.t.Fatalf("squatter: %q %v", line, err)
	}
	return cmd
}

// A process that is not cockpitfs holding a port's legacy name (as an older daemon holds it) makes
// its family be skipped like a listener, with the holder in the claim's events line and in
// ports/; when it squats every candidate the claim is refused (EADDRINUSE) and nothing changes.
func TestMachineSquatterIsSkipped(t *testing.T) {
	t.Parallel() // its daemons are in a network namespace of the test's own
	testtool.Need(t, "python3")
	m := newMount(t)
	const base = 47000
	machineApp(m, 2, base, "s", "t")
	squatter := machineSquat(m, base+500)
	m.ok("touch $M/app/stacks/s/holders/me")
	if got := m.read("app/stacks/s/ports/HTTP"); got != fmt.Sprintf("%d\n", base+10) {
		t.Fatalf("with family 0 squatted, HTTP = %q", got)
	}
	why := fmt.Sprintf("port %d is held by process %d uid 0, not a cockpitfs daemon", base+500, squatter.Process.Pid)
	if ev := m.lastEvent("app/stacks/s/events"); !strings.Contains(ev, why) {
		t.Fatalf("the claim's events line does not name the squatter: %s", ev)
	}
	if got := m.read("ports", strconv.Itoa(base+500)); got != fmt.Sprintf("daemon=none pid=%d uid=0\n", squatter.Process.Pid) {
		t.Fatalf("ports/%d = %q", base+500, got)
	}
	// Having met a legacy name held alone, the daemon holds its ports' legacy names too, so an
	// older daemon meets them as it would another older daemon's.
	if !machineLegacyHeld(t, m, base+10) {
		t.Fatalf("the daemon does not hold the legacy name of its port %d", base+10)
	}

	// Family 1 is s's, family 0 squatted: t's claim is refused, like a listener's, and changes nothing.
	before := claimsSnapshot(m, "t")
	m.refused("touch $M/app/stacks/t/holders/me", syscall.EADDRINUSE)
	ev := claimsRefusalEvent(t, m, "app/stacks/t/events", "PORT_FAMILY_COLLISION", "EADDRINUSE")
	if !strings.Contains(fmt.Sprint(ev["message"]), fmt.Sprintf("port %d held by process %d uid 0, not a cockpitfs daemon", base+500, squatter.Process.Pid)) {
		t.Fatalf("the refusal does not name the squatter: %v", ev["message"])
	}
	if after := claimsSnapshot(m, "t"); after != before {
		t.Fatalf("a refused claim changed state:\n%s\n---\n%s", before, after)
	}

	// Once the squatter is gone (SIGKILL: the kernel frees its name), the family is free at once.
	squatter.Process.Kill()
	squatter.Wait()
	m.ok("touch $M/app/stacks/t/holders/me")
	if got := m.read("app/stacks/t/ports/HTTP"); got != fmt.Sprintf("%d\n", base) {
		t.Fatalf("after the squatter died, HTTP = %q", got)
	}
}

// On a shared machine one daemon that is not root serves everybody (--allow-other): another user
// claims from a working directory the daemon may not read — the checkout is unknown, or named by
// a write on the same open — and drains its stack.
func TestMachineAllowOtherNonRootDaemon(t *testing.T) {
	t.Parallel() // its daemons are in a network namespace of the test's own
	conf, _ := os.ReadFile("/etc/fuse.conf")
	if !strings.Contains("\n"+string(conf), "\nuser_allow_other") {
		if os.Getenv("CI") == "true" {
			t.Fatal("/etc/fuse.conf lacks user_allow_other (.ci/run sets it)")
		}
		t.Skip("SKIPPING: a user's --allow-other mount needs user_allow_other in /etc/fuse.conf")
	}
	m := machineNobodyMountIn(t, ownNetns(t), "--allow-other")
	machineApp(m, 4, 48000)
	// uid 4321 works in a directory only it may enter.
	private := filepath.Join(filepath.Dir(m.Dir), "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(private, 4321, 4321); err != nil {
		t.Fatal(err)
	}
	asOther := func(script string) result {
		return shIn(t, "/", `exec setpriv --reuid=4321 --regid=4321 --clear-groups bash -c "cd \"$P\" && $S"`, "M="+m.Dir, "P="+private, "S="+script)
	}
	r := asOther(`mkdir $M/app/stacks/u && touch $M/app/stacks/u/holders/me && cat $M/app/stacks/u/ports/HTTP $M/app/stacks/u/holders/me &&
echo checkout=/srv/u > $M/app/stacks/u/holders/named && grep checkout_path= $M/app/stacks/u/holders/named`)
	if r.Code != 0 || !strings.HasPrefix(r.Stdout, "48000\n") || !strings.Contains(r.Stdout, "checkout_path=\n") ||
		!strings.Contains(r.Stdout, "uid=4321\n") || !strings.HasSuffix(r.Stdout, "checkout_path=/srv/u\n") {
		t.Fatalf("uid 4321 claiming from %s: exit %d\n%s%s", private, r.Code, r.Stdout, r.Stderr)
	}
	// Its touch of its own holder from there re-binds it (what `make up` does on every run): the
	// unknown working directory is no evidence of another checkout. A later write may name the
	// checkout the holder was created without; a touch from there still re-binds.
	r = asOther(`touch $M/app/stacks/u/holders/me && echo checkout=$P > $M/app/stacks/u/holders/me &&
grep checkout_path= $M/app/stacks/u/holders/me && touch $M/app/stacks/u/holders/me`)
	if r.Code != 0 || r.Stdout != "checkout_path="+private+"\n" {
		t.Fatalf("uid 4321 touching and naming the checkout of its holder from %s: exit %d\n%s%s", private, r.Code, r.Stdout, r.Stderr)
	}
	// The mounting user may not set uid 4321's holder; as the cockpit's owner it may remove it.
	// uid 4321 drains its own stack.
	if r := m.sh("echo pid=none > $M/app/stacks/u/holders/named"); r.Code == 0 || !strings.Contains(strings.ToLower(r.Stderr), "permission denied") {
		t.Fatalf("uid 65534 set uid 4321's holder: exit %d %s", r.Code, r.Stderr)
	}
	m.ok("rm $M/app/stacks/u/holders/named")
	if r := asOther("S=$M/app/stacks/u && " + machineDrain + " && cat $S/lease"); r.Code != 0 || !strings.Contains(r.Stdout, "released=true") {
		t.Fatalf("uid 4321 draining: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}
