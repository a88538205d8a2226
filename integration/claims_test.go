package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Claims and leases (SPEC §2, §4), driven the way a developer's shell drives them.
// Port bases here are 31xxx-34xxx, distinct per test.

// claimsEvent parses the last line of an events file below the mount point.
func claimsEvent(t *testing.T, m *mount, path string) map[string]any {
	t.Helper()
	line := m.lastEvent(path)
	var ev map[string]any
	if err := json.Unmarshal([]byte(line), &ev); err != nil {
		t.Fatalf("%s: last line is not JSON: %v\n%s", path, err, line)
	}
	return ev
}

// claimsRefusalEvent checks the last line of an events file is a refusal with code and errno,
// and returns it.
func claimsRefusalEvent(t *testing.T, m *mount, path, code, errno string) map[string]any {
	t.Helper()
	ev := claimsEvent(t, m, path)
	if ev["result"] != "refused" || ev["code"] != code || ev["errno"] != errno {
		t.Fatalf("%s: want a refusal %s/%s as the last line, got %v", path, code, errno, ev)
	}
	return ev
}

// claimsEventCount is how many lines an events file holds, to tell a new line from an old one.
func claimsEventCount(m *mount, path string) int {
	m.t.Helper()
	return strings.Count(m.read(path), "\n")
}

// claimsRecord parses a stack's record file.
func claimsRecord(t *testing.T, m *mount, stack string) map[string]any {
	t.Helper()
	var rec map[string]any
	data := m.read("app/stacks", stack, "record")
	if err := json.Unmarshal([]byte(data), &rec); err != nil {
		t.Fatalf("record is not JSON: %v\n%s", err, data)
	}
	return rec
}

// claimsSnapshot is what must not move when an operation is refused: the stack's record, its
// revision and lease, and the machine's port index.
func claimsSnapshot(m *mount, stack string) string {
	m.t.Helper()
	return m.ok(fmt.Sprintf(`cd $M/app/stacks/%s && cat revision record lease && ls holders ports entrypoints && ls $M/ports`, stack))
}

// claimsListen opens a TCP listener in the daemon's network namespace for the test's duration,
// skipping when the address family is not available here.
func claimsListen(m *mount, network, addr string) {
	m.t.Helper()
	if _, err := m.listen(network, addr); err != nil {
		if network == "tcp6" || strings.HasPrefix(addr, "[") {
			m.t.Skipf("IPv6 listener unavailable: %v", err)
		}
		m.t.Fatalf("listen %s %s: %v", network, addr, err)
	}
}

// claimsConfig writes a cockpit's config in one write(2), as cat does (bash's printf writes line
// by line, and each partial document would be refused).
func claimsConfig(m *mount, cockpit, body string) {
	m.t.Helper()
	m.ok("cat > $M/" + cockpit + "/config <<'EOF'\n" + body + "EOF")
}

func claimsSha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// A co-tenant joins without changing the lease; it can leave, the last holder cannot; a stack
// with holders cannot be removed, nor a cockpit with stacks; a stack cannot be made twice.
func TestClaimsCoTenant(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 31080, "DB": 31432}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	lease := m.read("app/stacks/s/lease")
	want := "offset=0\nstep=10\ncount=20\nreleased=false\nDB=31432\nHTTP=31080\n"
	if lease != want {
		t.Fatalf("lease = %q, want %q", lease, want)
	}
	m.ok("touch $M/app/stacks/s/holders/other")
	if got := m.read("app/stacks/s/lease"); got != lease {
		t.Fatalf("a co-tenant changed the lease: %q -> %q", lease, got)
	}
	if got := m.read("app/stacks/s/ports/HTTP"); got != "31080\n" {
		t.Fatalf("co-tenant sees ports/HTTP = %q", got)
	}
	if got := m.ok("ls $M/app/stacks/s/holders"); got != "me\nother\n" {
		t.Fatalf("holders = %q", got)
	}
	if got := m.read("app/stacks/s/revision"); got != "2\n" {
		t.Fatalf("revision after two claims = %q", got)
	}

	// The co-tenant leaves: its file goes, it is the last released holder, the lease stays.
	m.ok("rm $M/app/stacks/s/holders/other")
	if got := m.ok("ls $M/app/stacks/s/holders"); got != "me\n" {
		t.Fatalf("holders after releasing other = %q", got)
	}
	if r := m.sh("stat $M/app/stacks/s/holders/other"); r.Code == 0 {
		t.Fatalf("a released holder is still stat-able: %s", r.Stdout)
	}
	rec := claimsRecord(t, m, "s")
	if got, _ := rec["value"].(map[string]any)["lastReleasedHolder"].(string); got != "holder:"+claimsSha("other")+":session" {
		t.Fatalf("lastReleasedHolder = %v", rec["value"].(map[string]any)["lastReleasedHolder"])
	}
	if got := m.read("app/stacks/s/lease"); got != lease {
		t.Fatalf("releasing a co-tenant changed the lease: %q", got)
	}

	// The last holder cannot leave: a drain stops a stack, not a dropped claim.
	before := claimsSnapshot(m, "s")
	m.refused("rm $M/app/stacks/s/holders/me", syscall.EBUSY)
	ev := claimsRefusalEvent(t, m, "app/stacks/s/events", "CLAIM_CO_TENANT", "EBUSY")
	if !strings.Contains(fmt.Sprint(ev["message"]), "final holder") {
		t.Fatalf("message = %v", ev["message"])
	}
	if after := claimsSnapshot(m, "s"); after != before {
		t.Fatalf("a refused release changed the stack:\n%s\n->\n%s", before, after)
	}

	// rmdir of a stack with holders: EBUSY, recorded in the cockpit's events.
	m.refused("rmdir $M/app/stacks/s", syscall.EBUSY)
	claimsRefusalEvent(t, m, "app/events", "CLAIM_CO_TENANT", "EBUSY")
	if after := claimsSnapshot(m, "s"); after != before {
		t.Fatalf("a refused rmdir changed the stack")
	}
	// rmdir of a cockpit with stacks: ENOTEMPTY.
	m.refused("rmdir $M/app", syscall.ENOTEMPTY)
	if got := m.ok("ls $M"); got != "README\napp\ngc\nports\nstatus\nstatus.json\n" {
		t.Fatalf("root after refused rmdir = %q", got)
	}
	// mkdir of an existing stack: EEXIST.
	m.refused("mkdir $M/app/stacks/s", syscall.EEXIST)
	if after := claimsSnapshot(m, "s"); after != before {
		t.Fatalf("a refused mkdir changed the stack")
	}
}

// A second stack of the cockpit leases the next family (offset = step).
func TestClaimsSecondStackNextFamily(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 31180, "DB": 31532}, "a", "b")
	m.ok("touch $M/app/stacks/a/holders/me $M/app/stacks/b/holders/me")
	if got := m.ok("cd $M/app/stacks && cat a/ports/HTTP a/ports/DB b/ports/HTTP b/ports/DB"); got != "31180\n31532\n31190\n31542\n" {
		t.Fatalf("ports = %q", got)
	}
	if got := m.read("app/stacks/b/lease"); !strings.HasPrefix(got, "offset=10\n") {
		t.Fatalf("second stack's lease = %q", got)
	}
	if got := m.ok("ls $M/ports"); got != "31180\n31190\n31532\n31542\n" {
		t.Fatalf("machine ports = %q", got)
	}
}

// A live TCP listener on a port of the first family makes the claim skip that family, whatever
// address it is bound to (loopback, IPv4 any, IPv6 any).
func TestClaimsListenerSkipsFamily(t *testing.T) {
	t.Parallel()
	for i, tc := range []struct{ network, host string }{
		{"tcp4", "127.0.0.1"},
		{"tcp4", "0.0.0.0"},
		{"tcp6", "[::]"},
	} {
		t.Run(tc.host, func(t *testing.T) {
			base := 32000 + 100*i
			m := newMount(t)
			claimsListen(m, tc.network, fmt.Sprintf("%s:%d", tc.host, base))
			m.setupApp(5, map[string]int{"HTTP": base, "DB": base + 50}, "s")
			m.ok("touch $M/app/stacks/s/holders/me")
			if got := m.read("app/stacks/s/ports/HTTP"); got != fmt.Sprintf("%d\n", base+10) {
				t.Fatalf("with a listener on %s:%d, ports/HTTP = %q, want %d", tc.host, base, got, base+10)
			}
			if got := m.read("app/stacks/s/lease"); !strings.HasPrefix(got, "offset=10\n") {
				t.Fatalf("lease = %q", got)
			}
		})
	}
}

// Every candidate family blocked by host listeners: EADDRINUSE, nothing claimed.
func TestClaimsAllCandidatesBlockedByListeners(t *testing.T) {
	t.Parallel()
	base := 32400
	m := newMount(t)
	claimsListen(m, "tcp4", fmt.Sprintf("127.0.0.1:%d", base))
	claimsListen(m, "tcp4", fmt.Sprintf("0.0.0.0:%d", base+10))
	m.setupApp(2, map[string]int{"HTTP": base}, "s")
	before := claimsSnapshot(m, "s")
	m.refused("touch $M/app/stacks/s/holders/me", syscall.EADDRINUSE)
	ev := claimsRefusalEvent(t, m, "app/stacks/s/events", "PORT_FAMILY_COLLISION", "EADDRINUSE")
	msg := fmt.Sprint(ev["message"])
	for _, p := range []int{base, base + 10} {
		if !strings.Contains(msg, strconv.Itoa(p)) {
			t.Errorf("message does not name occupied port %d: %s", p, msg)
		}
	}
	if fix := fmt.Sprint(ev["fix"]); !strings.Contains(fix, "stop the named host listener") {
		t.Errorf("fix = %s", fix)
	}
	if after := claimsSnapshot(m, "s"); after != before {
		t.Fatalf("a refused claim changed the stack:\n%s\n->\n%s", before, after)
	}
}

// count=2: the third stack's claim is refused (ENOSPC) and changes nothing.
func TestClaimsCountExhausted(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(2, map[string]int{"HTTP": 32600}, "a", "b", "c")
	m.ok("touch $M/app/stacks/a/holders/me $M/app/stacks/b/holders/me")
	before := claimsSnapshot(m, "c")
	m.refused("touch $M/app/stacks/c/holders/me", syscall.ENOSPC)
	claimsRefusalEvent(t, m, "app/stacks/c/events", "PORT_LEASE_EXHAUSTED", "ENOSPC")
	if after := claimsSnapshot(m, "c"); after != before {
		t.Fatalf("a refused claim changed the stack:\n%s\n->\n%s", before, after)
	}
	if got := m.read("app/stacks/c/revision"); got != "0\n" {
		t.Fatalf("revision = %q", got)
	}
}

// Leases are machine-wide: a second cockpit with overlapping bases skips the family the first
// leased, and MOUNTPOINT/ports names the owner of each port.
func TestClaimsTwoCockpitsOverlap(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 32800}, "s")
	m.ok("mkdir $M/web && mkdir $M/web/stacks/t")
	claimsConfig(m, "web", "[ports]\nstep = 10\ncount = 5\n[ports.bases]\nWEB = 32800\nAPI = 32900\n")
	m.ok("touch $M/app/stacks/s/holders/me $M/web/stacks/t/holders/me")
	if got := m.ok("cat $M/web/stacks/t/ports/WEB $M/web/stacks/t/ports/API"); got != "32810\n32910\n" {
		t.Fatalf("second cockpit's ports = %q", got)
	}
	if got := m.ok("ls $M/ports"); got != "32800\n32810\n32910\n" {
		t.Fatalf("ls ports = %q", got)
	}
	for port, want := range map[string]string{
		"32800": "cockpit=app stack=s key=HTTP offset=0\n",
		"32810": "cockpit=web stack=t key=WEB offset=10\n",
		"32910": "cockpit=web stack=t key=API offset=10\n",
	} {
		if got := m.ok("cat $M/ports/" + port); got != want {
			t.Errorf("ports/%s = %q, want %q", port, got, want)
		}
	}
}

// A claim in a cockpit with no config: EINVAL, and the fix says what to do.
func TestClaimsWithoutConfig(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app && mkdir $M/app/stacks/s")
	m.refused("touch $M/app/stacks/s/holders/me", syscall.EINVAL)
	ev := claimsRefusalEvent(t, m, "app/stacks/s/events", "PORT_FAMILY_OUT_OF_RANGE", "EINVAL")
	if fix := fmt.Sprint(ev["fix"]); !strings.Contains(fix, "write app/config first") {
		t.Fatalf("fix = %q", fix)
	}
	if got := m.ok("ls $M/app/stacks/s/holders; cat $M/app/stacks/s/revision"); got != "0\n" {
		t.Fatalf("after the refusal: %q", got)
	}
}

// The config changes under a running stack: its lease keeps the old declaration, and a new holder
// is refused (ESTALE) since it would join a lease the current config does not describe.
func TestClaimsConfigChangedAfterLease(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 33000}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	lease := m.read("app/stacks/s/lease")
	observeWant(t, m.observeHealth("app/stacks/s"), "CONFIG_CHANGED_DURING_EXECUTION ", true)
	claimsConfig(m, "app", "[ports]\nstep = 10\ncount = 20\n[ports.bases]\nHTTP = 33100\n")
	// health says so before anyone meets the refusal (the seeds' inspectRecordedPortDeclaration).
	observeWant(t, m.observeHealth("app/stacks/s"), "CONFIG_CHANGED_DURING_EXECUTION ", false)
	before := claimsSnapshot(m, "s")
	m.refused("touch $M/app/stacks/s/holders/other", syscall.ESTALE)
	claimsRefusalEvent(t, m, "app/stacks/s/events", "CONFIG_CHANGED_DURING_EXECUTION", "ESTALE")
	if after := claimsSnapshot(m, "s"); after != before {
		t.Fatalf("a refused claim changed the stack:\n%s\n->\n%s", before, after)
	}
	if got := m.read("app/stacks/s/lease"); got != lease || !strings.Contains(got, "HTTP=33000\n") {
		t.Fatalf("lease after the config change = %q, want %q", got, lease)
	}
	if got := m.read("app/stacks/s/ports/HTTP"); got != "33000\n" {
		t.Fatalf("ports/HTTP = %q", got)
	}
}

// The seeds' leasePortFamily refuses a holder's claim run again once the declaration changed
// (count 3 -> 4 here): its `touch`, the claim a Makefile re-runs, is refused ESTALE with an events
// line and the stack unchanged; before the change the same touch succeeds.
func TestLeasePortFamilyExistingHolderAfterDeclarationChange(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(3, map[string]int{"HTTP": 33200}, "s")
	m.ok("touch $M/app/stacks/s/holders/h1")
	m.ok("touch $M/app/stacks/s/holders/h1")
	claimsConfig(m, "app", "[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 33200\n")
	before := claimsSnapshot(m, "s")
	m.refused("touch $M/app/stacks/s/holders/h1", syscall.ESTALE)
	claimsRefusalEvent(t, m, "app/stacks/s/events", "CONFIG_CHANGED_DURING_EXECUTION", "ESTALE")
	if after := claimsSnapshot(m, "s"); after != before {
		t.Fatalf("a refused claim changed the stack:\n%s\n->\n%s", before, after)
	}
}

// The seeds' releaseClaim of a holder the stack does not have completes unchanged; here the
// kernel's lookup answers `rm` of a missing name (ENOENT) before the daemon sees an unlink, so no
// events line, and `rm -f` answers success, the seeds' answer (docs/fidelity.md).
func TestReleaseClaimAbsentHolder(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(3, map[string]int{"HTTP": 33250}, "s")
	m.ok("touch $M/app/stacks/s/holders/h1")
	before, events := claimsSnapshot(m, "s"), m.read("app/stacks/s/events")
	m.refused("rm $M/app/stacks/s/holders/gone", syscall.ENOENT)
	m.ok("rm -f $M/app/stacks/s/holders/gone")
	if after := claimsSnapshot(m, "s"); after != before {
		t.Fatalf("releasing a missing holder changed the stack:\n%s\n->\n%s", before, after)
	}
	if got := m.read("app/stacks/s/events"); got != events {
		t.Fatalf("releasing a missing holder left an events line: %q", strings.TrimPrefix(got, events))
	}
}

// A claim that would take the stack over from its dead holder meets the same check as any new
// holder: the lease was taken under another declaration, so ESTALE, and nothing changes (the
// dead holder is not released either). A drain request naming the successor stops the stack.
func TestClaimsTakeoverAfterConfigChange(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 33050}, "s")
	holder := drainStartSleeper(t)
	m.ok(fmt.Sprintf("touch $M/app/stacks/s/holders/gone && echo pid=%d > $M/app/stacks/s/holders/gone", holder.cmd.Process.Pid))
	claimsConfig(m, "app", "[ports]\nstep = 10\ncount = 20\n[ports.bases]\nHTTP = 33150\n")
	holder.kill()
	if state := m.read("app/stacks/s/holders/gone"); !strings.Contains(state, "state=dead\n") {
		t.Fatalf("the holder is not dead:\n%s", state)
	}
	before := claimsSnapshot(m, "s")
	m.refused("touch $M/app/stacks/s/holders/successor", syscall.ESTALE)
	claimsRefusalEvent(t, m, "app/stacks/s/events", "CONFIG_CHANGED_DURING_EXECUTION", "ESTALE")
	if after := claimsSnapshot(m, "s"); after != before {
		t.Fatalf("a refused takeover changed the stack:\n%s\n->\n%s", before, after)
	}
	// Not stranded: a drain naming the successor takes the stack over and stops it under the
	// lease's own declaration.
	m.ok("cd $M/app/stacks/s && echo 'sleep holder=successor' > drain/request && ls holders && echo start > drain/attempt && echo success > drain/outcome")
	if lease := m.read("app/stacks/s/lease"); !strings.Contains(lease, "released=true\n") || !strings.Contains(lease, "HTTP=33050\n") {
		t.Fatalf("lease after the drain:\n%s", lease)
	}
}

// A holder file says who holds and how: pid is the creating shell's session leader, checkout its
// working directory; writes change pid, never a checkout chosen by an earlier open.
func TestClaimsHolderFile(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 33200}, "s")
	work := t.TempDir()
	// setsid makes the shell a session leader, so its $$ is what the holder must record.
	r := shIn(t, work, `exec setsid bash -c 'touch $M/app/stacks/s/holders/me && cat $M/app/stacks/s/holders/me && echo "shell=$$ cwd=$PWD" && cut -d" " -f22 /proc/$$/stat && stat -c %Y $M/app/stacks/s/holders/me'`, "M="+m.Dir)
	if r.Code != 0 {
		t.Fatalf("claim: %+v", r)
	}
	lines := strings.Split(strings.TrimSuffix(r.Stdout, "\n"), "\n")
	if len(lines) < 4 {
		t.Fatalf("output: %q", r.Stdout)
	}
	mtime := lines[len(lines)-1]
	ticks := lines[len(lines)-2]
	var shell int
	var cwd string
	fmt.Sscanf(lines[len(lines)-3], "shell=%d cwd=%s", &shell, &cwd)
	fields := map[string]string{}
	var order []string
	for _, l := range lines[:len(lines)-3] {
		k, v, _ := strings.Cut(l, "=")
		fields[k] = v
		order = append(order, k)
	}
	wantOrder := "name id checkout checkout_path claimed_at pid process_start state uid"
	if strings.Join(order, " ") != wantOrder {
		t.Errorf("holder file keys = %v, want %s", order, wantOrder)
	}
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	want := map[string]string{
		"name":          "me",
		"id":            "holder:" + claimsSha("me") + ":session",
		"checkout":      "checkout:" + claimsSha(cwd),
		"checkout_path": cwd,
		"pid":           strconv.Itoa(shell),
		"process_start": "proc:" + strings.TrimSpace(string(boot)) + ":" + ticks,
		"state":         "live",
		"uid":           strconv.Itoa(os.Getuid()),
	}
	if cwd != work {
		t.Errorf("shell cwd %q is not the test's %q", cwd, work)
	}
	for k, v := range want {
		if fields[k] != v {
			t.Errorf("holder %s = %q, want %q", k, fields[k], v)
		}
	}
	claimed, err := time.Parse("2006-01-02T15:04:05.000Z", fields["claimed_at"])
	if err != nil {
		t.Fatalf("claimed_at %q: %v", fields["claimed_at"], err)
	}
	if mtime != strconv.FormatInt(claimed.Unix(), 10) {
		t.Errorf("holder mtime %s != claimed_at %s", mtime, fields["claimed_at"])
	}
	if d := time.Since(claimed); d < 0 || d > time.Minute {
		t.Errorf("claimed_at %s is not the claim's time", fields["claimed_at"])
	}

	// pid=none: untracked, no start identity.
	m.ok(`echo "pid=none" > $M/app/stacks/s/holders/me`)
	holder := m.read("app/stacks/s/holders/me")
	if !strings.Contains(holder, "\npid=none\n") || !strings.Contains(holder, "\nstate=untracked\n") || strings.Contains(holder, "process_start=") {
		t.Fatalf("after pid=none:\n%s", holder)
	}

	// A later open cannot rebind the checkout; unknown keys and dead pids are malformed.
	pidMax, _ := os.ReadFile("/proc/sys/kernel/pid_max")
	nopid, _ := strconv.Atoi(strings.TrimSpace(string(pidMax)))
	for nopid--; nopid > 1; nopid-- { // the highest pid no process has
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", nopid)); err != nil {
			break
		}
	}
	for _, cmd := range []string{"checkout=/other", "foo=1", fmt.Sprintf("pid=%d", nopid), "pid=0", "pid=abc", "checkout=relative"} {
		t.Run(cmd, func(t *testing.T) {
			before := claimsSnapshot(m, "s") + m.read("app/stacks/s/holders/me")
			m.refused(`echo "`+cmd+`" > $M/app/stacks/s/holders/me`, syscall.EINVAL)
			claimsRefusalEvent(t, m, "app/stacks/s/events", "STATE_RECORD_MALFORMED", "EINVAL")
			if after := claimsSnapshot(m, "s") + m.read("app/stacks/s/holders/me"); after != before {
				t.Fatalf("refused write changed the stack:\n%s\n->\n%s", before, after)
			}
		})
	}

	// Create and write on one open: the write chooses both pid and checkout.
	other := t.TempDir()
	out := shIn(t, work, `echo "pid=$$ checkout=`+other+`" > $M/app/stacks/s/holders/new && echo $$ && cat $M/app/stacks/s/holders/new`, "M="+m.Dir)
	if out.Code != 0 {
		t.Fatalf("create+write: %+v", out)
	}
	pid, rest, _ := strings.Cut(out.Stdout, "\n")
	for _, w := range []string{"\npid=" + pid + "\n", "\ncheckout_path=" + other + "\n", "\ncheckout=checkout:" + claimsSha(other) + "\n", "\nstate=live\n"} {
		if !strings.Contains(rest, w) {
			t.Errorf("new holder lacks %q:\n%s", strings.TrimSpace(w), rest)
		}
	}
	// The SPEC's own example, checkout=$PWD, on another new holder.
	out = shIn(t, work, `echo "pid=$$ checkout=$PWD" > $M/app/stacks/s/holders/new2 && cat $M/app/stacks/s/holders/new2`, "M="+m.Dir)
	if out.Code != 0 || !strings.Contains(out.Stdout, "\ncheckout_path="+work+"\n") {
		t.Fatalf("pid=$$ checkout=$PWD: %+v", out)
	}
}

// Before the first claim nothing of a lease exists; after it, ports, env and entrypoints
// (defaults and declared) render the family.
func TestClaimsEntrypointsAndEnv(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok(`mkdir $M/app && cat > $M/app/config <<'EOF'
[ports]
step = 10
count = 4
[ports.bases]
HTTP = 33400
DB_MAIN = 33450
[entrypoints.web]
port = "HTTP"
path = "/app"
EOF
mkdir $M/app/stacks/s`)
	s := "$M/app/stacks/s"
	if got := m.ok("ls " + s + "/ports; ls " + s + "/entrypoints; ls " + s); got != "declared-values\ndrain\nentrypoints\nevents\nhealth\nholders\nlease\nports\nrecord\nrevision\n" {
		t.Fatalf("before the first claim, ports/, entrypoints/ and the stack list: %q", got)
	}
	for _, f := range []string{"env", "ports/HTTP", "entrypoints/web", "entrypoints/http"} {
		if r := m.sh("stat " + s + "/" + f); r.Code == 0 {
			t.Errorf("%s exists before the first claim", f)
		}
	}
	if got := m.read("app/stacks/s/lease"); got != "" {
		t.Fatalf("lease before the first claim = %q", got)
	}

	m.ok("touch " + s + "/holders/me")
	if got := m.ok("ls " + s + "/ports"); got != "DB_MAIN\nHTTP\n" {
		t.Fatalf("ls ports = %q", got)
	}
	if got := m.ok("ls " + s + "/entrypoints"); got != "db-main\nhttp\nweb\n" {
		t.Fatalf("ls entrypoints = %q", got)
	}
	for name, want := range map[string]string{
		"web":     "http://127.0.0.1:33400/app\n",
		"http":    "http://127.0.0.1:33400/\n",
		"db-main": "http://127.0.0.1:33450/\n",
	} {
		if got := m.read("app/stacks/s/entrypoints/" + name); got != want {
			t.Errorf("entrypoints/%s = %q, want %q", name, got, want)
		}
	}
	wantEnv := "DB_MAIN=33450\nHTTP=33400\nWEB_URL=http://127.0.0.1:33400/app\n" // defaults are not exported
	if got := m.read("app/stacks/s/env"); got != wantEnv {
		t.Fatalf("env = %q, want %q", got, wantEnv)
	}
	// env works as docker compose / a shell uses it.
	if got := m.ok("set -a; . " + s + "/env; set +a; echo $WEB_URL $DB_MAIN"); got != "http://127.0.0.1:33400/app 33450\n" {
		t.Fatalf("sourced env = %q", got)
	}
}

// record is the coordination record as JSON; its revision is the revision file's.
func TestClaimsRecordJSON(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 33600}, "s")
	check := func(wantRev int) map[string]any {
		rec := claimsRecord(t, m, "s")
		rev := strings.TrimSpace(m.read("app/stacks/s/revision"))
		if fmt.Sprint(rec["revision"]) != rev || rev != strconv.Itoa(wantRev) {
			t.Fatalf("record revision %v, revision file %s, want %d", rec["revision"], rev, wantRev)
		}
		if rec["format"] != "cockpit-state/v1" || rec["kind"] != "coordination" ||
			rec["cockpitId"] != "cockpit:"+claimsSha("app") || rec["subjectId"] != "stack:"+claimsSha("app/s") {
			t.Fatalf("record header: %v", rec)
		}
		return rec
	}
	rec := check(0)
	v := rec["value"].(map[string]any)
	if v["lease"] != nil || v["drain"] != nil || len(v["holders"].([]any)) != 0 {
		t.Fatalf("a new stack's value: %v", v)
	}
	m.ok("touch $M/app/stacks/s/holders/me")
	rec = check(1)
	v = rec["value"].(map[string]any)
	holders := v["holders"].([]any)
	if len(holders) != 1 || holders[0].(map[string]any)["name"] != "me" {
		t.Fatalf("holders: %v", holders)
	}
	lease := v["lease"].(map[string]any)
	if lease["offset"] != 0.0 || lease["released"] != false || lease["ports"].(map[string]any)["HTTP"] != 33600.0 {
		t.Fatalf("lease: %v", lease)
	}
}

// make sees a holder file as an ordinary target: the second run has nothing to do for it.
func TestClaimsMakefile(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 33800}, "s")
	dir := t.TempDir()
	makefile := "H := $(M)/app/stacks/s/holders/mk\n$(H): ; touch $@\nup: $(H)\n\tcat $(M)/app/stacks/s/env\n.PHONY: up\n"
	if err := os.WriteFile(filepath.Join(dir, "Makefile"), []byte(makefile), 0o644); err != nil {
		t.Fatal(err)
	}
	first := m.ok("make -C " + dir + " up")
	if !strings.Contains(first, "touch "+m.Dir+"/app/stacks/s/holders/mk") || !strings.Contains(first, "HTTP=33800") {
		t.Fatalf("first make:\n%s", first)
	}
	mtime := m.ok("stat -c %Y.%y $M/app/stacks/s/holders/mk")
	rev := m.read("app/stacks/s/revision")
	second := m.ok("make -C " + dir + " up")
	if strings.Contains(second, "touch ") || !strings.Contains(second, "HTTP=33800") {
		t.Fatalf("second make remade the holder:\n%s", second)
	}
	// Asking make about the holder target alone: up to date.
	if q := m.sh("make -q -C " + dir + " " + m.Dir + "/app/stacks/s/holders/mk"); q.Code != 0 {
		t.Fatalf("make -q says the holder is out of date: %+v", q)
	}
	if got := m.ok("stat -c %Y.%y $M/app/stacks/s/holders/mk"); got != mtime {
		t.Fatalf("holder mtime moved: %s -> %s", mtime, got)
	}
	if got := m.read("app/stacks/s/revision"); got != rev {
		t.Fatalf("second make changed the stack: revision %s -> %s", rev, got)
	}
}

// claimsSizes checks that every readable file's st_size is the length cat reads (cat through a
// pipe, so wc cannot trust st_size). The root's gc shows 0: a stat runs no survey
// (TestWorktreesGCStatLooksAtNoCheckout).
func claimsSizes(t *testing.T, m *mount) {
	t.Helper()
	out := m.ok(`find $M -type f ! -name wait ! -path $M/gc | while read -r f; do echo "$(stat -c %s "$f") $(cat "$f" | wc -c) $f"; done`)
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var size, read int
		var path string
		fmt.Sscanf(line, "%d %d %s", &size, &read, &path)
		if size != read {
			t.Errorf("%s: st_size %d, cat reads %d", path, size, read)
		}
		n++
	}
	if n < 20 {
		t.Fatalf("only %d files checked:\n%s", n, out)
	}
}

// claimsTimes are the mtimes (seconds) of the record-derived files, and the record's updatedAt.
func claimsTimes(t *testing.T, m *mount) (string, string) {
	t.Helper()
	mt := m.ok("cd $M/app/stacks/s && stat -c '%n %Y' record revision lease env")
	rec := claimsRecord(t, m, "s")
	at, err := time.Parse("2006-01-02T15:04:05.000Z", fmt.Sprint(rec["updatedAt"]))
	if err != nil {
		t.Fatalf("updatedAt %v: %v", rec["updatedAt"], err)
	}
	for _, line := range strings.Split(strings.TrimSpace(mt), "\n") {
		name, sec, _ := strings.Cut(line, " ")
		if sec != strconv.FormatInt(at.Unix(), 10) {
			t.Errorf("%s mtime %s, record updatedAt %s (%d)", name, sec, rec["updatedAt"], at.Unix())
		}
	}
	return mt, fmt.Sprint(rec["updatedAt"])
}

// Sizes are exact and times are the record's, unmoved by reads and refusals.
func TestClaimsSizesAndTimes(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 34000, "DB": 34050}, "s", "t")
	m.ok("touch $M/app/stacks/s/holders/me $M/app/stacks/t/holders/me")
	claimsSizes(t, m)
	mt, at := claimsTimes(t, m)
	// Wait past a second boundary so a moved mtime would show in whole seconds.
	time.Sleep(1100 * time.Millisecond)
	m.refused("rm $M/app/stacks/s/holders/me", syscall.EBUSY)
	m.refused("echo foo=1 > $M/app/stacks/s/holders/me", syscall.EINVAL)
	m.ok("cat $M/app/stacks/s/record $M/app/stacks/s/env > /dev/null; ls -lR $M > /dev/null")
	mt2, at2 := claimsTimes(t, m)
	if mt2 != mt || at2 != at {
		t.Fatalf("refusals or reads moved times: %s %s -> %s %s", at, mt, at2, mt2)
	}
	claimsSizes(t, m)
	// tail reads the last line of events the way cat does.
	tail := m.ok("tail -n 1 $M/app/stacks/s/events")
	if want := m.lastEvent("app/stacks/s/events") + "\n"; tail != want {
		t.Fatalf("tail -n 1 events = %q, want %q", tail, want)
	}
	var ev map[string]any
	if err := json.Unmarshal([]byte(tail), &ev); err != nil || ev["errno"] != "EINVAL" {
		t.Fatalf("tail's line: %v %v", ev, err)
	}
}

// A co-tenant's claim and release change the record but not what env, lease, ports and the
// entrypoints show: their mtimes stay, so make rebuilds nothing (spec §2); the record's moves.
func TestClaimsUnchangedContentKeepsItsTime(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 34300}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	files := "env lease ports/HTTP entrypoints.json record"
	times := func() []string { return strings.Fields(m.ok("cd $M/app/stacks/s && stat -c %Y " + files)) }
	before := times()
	time.Sleep(1100 * time.Millisecond) // a moved time shows in whole seconds
	m.ok("touch $M/app/stacks/s/holders/co && rm $M/app/stacks/s/holders/co")
	after := times()
	names := strings.Fields(files)
	for i, name := range names[:len(names)-1] {
		if after[i] != before[i] {
			t.Errorf("%s's mtime moved with a co-tenant's claim and release: %s -> %s", name, before[i], after[i])
		}
	}
	if last := len(names) - 1; after[last] == before[last] {
		t.Errorf("the record's mtime did not move with two commits: %s", after[last])
	}
}

// A stack's directories take the time of its record's last change, so `ls -lt` puts the stack a
// claim just changed first.
func TestClaimsStackDirectoryTimes(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 34400}, "old", "new")
	time.Sleep(1100 * time.Millisecond) // a moved time shows in whole seconds
	m.ok("touch $M/app/stacks/new/holders/me")
	if got := m.ok("ls -t $M/app/stacks"); got != "new\nold\n" {
		t.Errorf("ls -t stacks after a claim of new: %q", got)
	}
	dirs := m.ok("cd $M/app/stacks/new && stat -c %Y . holders ports drain")
	rec := claimsRecord(t, m, "new")
	at, err := time.Parse("2006-01-02T15:04:05.000Z", fmt.Sprint(rec["updatedAt"]))
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Repeat(strconv.FormatInt(at.Unix(), 10)+"\n", 4); dirs != want {
		t.Errorf("the stack's directories' times %q, want its record's %s", dirs, rec["updatedAt"])
	}
}

// A change by one process is what the next ls, cat and stat of another show, even a shell that
// already looked.
func TestClaimsVisibleAcrossProcesses(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 34200}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	watcher := m.shell(m.Path("app/stacks/s"))
	look := "ls holders ports; cat revision; stat -c %s record; cat record | wc -c; stat -c %s holders/other"
	before := watcher.run(look)
	if !strings.HasPrefix(before, "holders:\nme\n\nports:\nHTTP\n1\n") || !strings.Contains(before, "No such file") {
		t.Fatalf("watcher before:\n%s", before)
	}
	m.ok("touch $M/app/stacks/s/holders/other")
	after := watcher.run(look)
	lines := strings.Split(after, "\n")
	if !strings.HasPrefix(after, "holders:\nme\nother\n\nports:\nHTTP\n2\n") || len(lines) < 10 || lines[7] != lines[8] || strings.Contains(after, "No such file") {
		t.Fatalf("watcher after another shell's claim:\n%s", after)
	}
	m.ok("rm $M/app/stacks/s/holders/other")
	gone := watcher.run(look)
	if !strings.HasPrefix(gone, "holders:\nme\n\nports:\nHTTP\n3\n") || !strings.Contains(gone, "No such file") {
		t.Fatalf("watcher after another shell's release:\n%s", gone)
	}
}

// touch(1) sets the times of the holder it creates with futimens on the fd its open made, and
// FUSE sends that SETATTR without the handle: it is known for the creating open's all the same,
// whose claim bound the holder already, so it is no second claim. (Taken for a touch from
// anywhere, it would refuse a holder whose creating open chose another checkout.)
func TestTimesSetThroughTheCreatingOpen(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(2, map[string]int{"HTTP": 34800}, "s")
	holder := m.Path("app", "stacks", "s", "holders", "me")
	fd, err := unix.Open(holder, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	// Closed once: by the test below, or, if it fails first, before the mount is taken down.
	closed := false
	closeFd := func() {
		if !closed {
			closed = true
			unix.Close(fd)
		}
	}
	t.Cleanup(closeFd)
	if _, err := unix.Write(fd, []byte("checkout=/src/elsewhere\n")); err != nil {
		t.Fatal(err)
	}
	n := claimsEventCount(m, "app/stacks/s/events")
	if err := unix.UtimesNanoAt(fd, "", nil, unix.AT_EMPTY_PATH); err != nil {
		t.Fatalf("futimens on the creating open: %v; events:\n%s", err, m.lastEvent("app/stacks/s/events"))
	}
	if got := claimsEventCount(m, "app/stacks/s/events"); got != n {
		t.Fatalf("futimens on the creating open added %d events lines", got-n)
	}
	if got := m.read("app/stacks/s/holders/me"); !strings.Contains(got, "checkout_path=/src/elsewhere\n") {
		t.Fatalf("holder after futimens:\n%s", got)
	}
	// Once that open is closed, a touch from here is one from another checkout.
	closeFd()
	m.refused("touch "+holder, syscall.EINVAL)
}

// A new lease passes the families its own cockpit leases without reading their index entries
// (engine: a cockpit's leased ports); refused for want of a free family, it still says ENOSPC,
// names each family's stack, and changes nothing.
func TestClaimsExhaustedPastItsCockpitsFamilies(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(3, map[string]int{"HTTP": 34950}, "a", "b", "c")
	m.ok("mkdir $M/web && mkdir $M/web/stacks/t")
	claimsConfig(m, "web", "[ports]\nstep = 10\ncount = 1\n[ports.bases]\nWEB = 34970\n")
	m.ok("touch $M/app/stacks/a/holders/me $M/app/stacks/b/holders/me $M/web/stacks/t/holders/me")
	before := claimsSnapshot(m, "c")
	m.refused("touch $M/app/stacks/c/holders/me", syscall.ENOSPC)
	ev := claimsRefusalEvent(t, m, "app/stacks/c/events", "PORT_LEASE_EXHAUSTED", "ENOSPC")
	for _, want := range []string{"34950 (leased by app/a)", "34960 (leased by app/b)", "34970 (leased by web/t)"} {
		if msg, _ := ev["message"].(string); !strings.Contains(msg, want) {
			t.Errorf("refusal message %q does not say %q", msg, want)
		}
	}
	if after := claimsSnapshot(m, "c"); after != before {
		t.Fatalf("a refused claim changed the stack:\n%s\n->\n%s", before, after)
	}
}
