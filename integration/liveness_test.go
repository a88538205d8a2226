package integration

// SPEC §5 (dead holders) and the liveness parts of §4 (a new holder's default pid), driven
// through the mount with real processes: sleepers killed with SIGKILL, shells in their own
// sessions, make, and a pid reused for real through /proc/sys/kernel/ns_last_pid.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// livenessProc is a process a test started; it is killed and reaped when the test ends.
type livenessProc struct {
	cmd    *exec.Cmd
	reaped bool
}

func (p *livenessProc) Pid() int { return p.cmd.Process.Pid }

// kill ends the process with SIGKILL and reaps it: an unreaped zombie still answers signal 0
// and keeps its /proc entry, so it would still read as present.
func (p *livenessProc) kill(t *testing.T) {
	t.Helper()
	if p.reaped {
		return
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill -9 %d: %v", p.Pid(), err)
	}
	p.cmd.Wait() // "signal: killed" is the expected error
	p.reaped = true
}

// livenessStart starts `sleep 600` in a session of its own (as a terminal's shell would be), so
// it is its own session leader and nothing of the test's process group reaches it.
func livenessStart(t *testing.T) *livenessProc {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &livenessProc{cmd: cmd}
	t.Cleanup(func() {
		if !p.reaped {
			p.cmd.Process.Kill()
			p.cmd.Wait()
			p.reaped = true
		}
	})
	return p
}

// livenessHolder reads a holder file as its key=value lines.
func livenessHolder(m *mount, stack, name string) map[string]string {
	m.t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(m.read("app/stacks", stack, "holders", name)), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			m.t.Fatalf("holder %s: malformed line %q", name, line)
		}
		out[k] = v
	}
	return out
}

// livenessState is what reading holders/<name> says about its process.
func livenessState(m *mount, stack, name string) string {
	m.t.Helper()
	return livenessHolder(m, stack, name)["state"]
}

// livenessRecord is the part of `record` these tests compare.
type livenessRecord struct {
	Revision int64 `json:"revision"`
	Value    struct {
		Holders []struct {
			HolderID     string `json:"holderId"`
			Name         string `json:"name"`
			PID          int    `json:"pid"`
			ProcessStart string `json:"processStart"`
		} `json:"holders"`
		Lease *struct {
			Offset   int            `json:"offset"`
			Ports    map[string]int `json:"ports"`
			Released bool           `json:"released"`
		} `json:"lease"`
		LastReleasedHolder *string `json:"lastReleasedHolder"`
	} `json:"value"`
}

func livenessReadRecord(m *mount, stack string) livenessRecord {
	m.t.Helper()
	var r livenessRecord
	text := m.read("app/stacks", stack, "record")
	if err := json.Unmarshal([]byte(text), &r); err != nil {
		m.t.Fatalf("record of %s: %v\n%s", stack, err, text)
	}
	return r
}

// livenessNames lists holders/ with ls, as a user would see it.
func livenessNames(m *mount, stack string) string {
	m.t.Helper()
	return strings.Join(strings.Fields(m.ok("ls $M/app/stacks/"+stack+"/holders")), " ")
}

// livenessClaimPid creates holders/<name> and sets its pid in the same open.
func livenessClaimPid(m *mount, stack, name, pid string) {
	m.t.Helper()
	m.ok(fmt.Sprintf("echo pid=%s > $M/app/stacks/%s/holders/%s", pid, stack, name))
}

// livenessLease is the stack's lease and ports as the files show them, to compare before/after.
func livenessLease(m *mount, stack string) string {
	m.t.Helper()
	return m.read("app/stacks", stack, "lease") + "--\n" + m.read("app/stacks", stack, "env")
}

// A holder whose process is killed reads dead, and the next claim by another holder releases it
// while the lease (same ports) is kept for the holders that remain.
func TestLivenessDeadHolderReleasedByNextClaim(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 31080, "DB": 31432}, "s")
	// keeper keeps the stack held (untracked), so releasing victim is not a takeover.
	livenessClaimPid(m, "s", "keeper", "none")
	sleeper := livenessStart(t)
	livenessClaimPid(m, "s", "victim", strconv.Itoa(sleeper.Pid()))

	h := livenessHolder(m, "s", "victim")
	if h["pid"] != strconv.Itoa(sleeper.Pid()) || h["state"] != "live" || !strings.HasPrefix(h["process_start"], "proc:") {
		t.Fatalf("victim while its process runs: %v", h)
	}
	victimID := h["id"]

	sleeper.kill(t)
	if got := livenessState(m, "s", "victim"); got != "dead" {
		t.Fatalf("victim after kill -9: state=%s, want dead", got)
	}
	// Reading a holder is an observation, not a change: the victim stays until a claim.
	if got := livenessNames(m, "s"); got != "keeper victim" {
		t.Fatalf("holders after kill, before any claim: %s", got)
	}
	leaseBefore := livenessLease(m, "s")
	before := livenessReadRecord(m, "s")

	m.ok("touch $M/app/stacks/s/holders/next")

	if got := livenessNames(m, "s"); got != "keeper next" {
		t.Fatalf("holders after next's claim: %q, want keeper next", got)
	}
	// The kernel kept the name from the reads above; it must not keep it alive.
	if _, err := os.Stat(m.Path("app/stacks/s/holders/victim")); !os.IsNotExist(err) {
		t.Fatalf("stat holders/victim after its release: %v, want ENOENT", err)
	}
	m.refused("cat $M/app/stacks/s/holders/victim", syscall.ENOENT)
	if got := livenessLease(m, "s"); got != leaseBefore {
		t.Fatalf("lease changed by the release:\nbefore:\n%s\nafter:\n%s", leaseBefore, got)
	}
	if got := m.read("app/stacks/s/ports/HTTP"); got != "31080\n" {
		t.Fatalf("ports/HTTP = %q", got)
	}
	after := livenessReadRecord(m, "s")
	if after.Revision != before.Revision+1 {
		t.Fatalf("revision %d → %d, want one commit for claim + release", before.Revision, after.Revision)
	}
	if after.Value.LastReleasedHolder == nil || *after.Value.LastReleasedHolder != victimID {
		t.Fatalf("lastReleasedHolder = %v, want %s", after.Value.LastReleasedHolder, victimID)
	}
	if ev := m.lastEvent("app/stacks/s/events"); !strings.Contains(ev, `"result":"ok"`) || !strings.Contains(ev, fmt.Sprintf(`"revision":%d`, after.Revision)) {
		t.Fatalf("events after the claim: %s", ev)
	}
}

// The last holder dead: a new holder's claim takes the running stack over in one transaction,
// keeping its lease.
func TestLivenessLastHolderDeadTakeover(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 31280}, "s")
	sleeper := livenessStart(t)
	livenessClaimPid(m, "s", "solo", strconv.Itoa(sleeper.Pid()))
	soloID := livenessHolder(m, "s", "solo")["id"]
	sleeper.kill(t)
	if got := livenessState(m, "s", "solo"); got != "dead" {
		t.Fatalf("solo after kill -9: state=%s, want dead", got)
	}
	leaseBefore := livenessLease(m, "s")
	before := livenessReadRecord(m, "s")

	m.ok("touch $M/app/stacks/s/holders/heir")

	if got := livenessNames(m, "s"); got != "heir" {
		t.Fatalf("holders after the takeover: %q, want heir", got)
	}
	if got := livenessLease(m, "s"); got != leaseBefore {
		t.Fatalf("lease changed by the takeover:\nbefore:\n%s\nafter:\n%s", leaseBefore, got)
	}
	after := livenessReadRecord(m, "s")
	if after.Revision <= before.Revision {
		t.Fatalf("revision %d → %d, want it advanced", before.Revision, after.Revision)
	}
	if after.Value.Lease == nil || after.Value.Lease.Released || after.Value.Lease.Ports["HTTP"] != 31280 {
		t.Fatalf("lease after the takeover: %+v", after.Value.Lease)
	}
	if after.Value.LastReleasedHolder == nil || *after.Value.LastReleasedHolder != soloID {
		t.Fatalf("lastReleasedHolder = %v, want %s", after.Value.LastReleasedHolder, soloID)
	}
	if got := livenessState(m, "s", "heir"); got != "live" {
		t.Fatalf("heir: state=%s", got)
	}
}

// A holder whose process lives, and an untracked one, survive every other claim; the live one
// still blocks a drain, and the refusal names its pid and how to end it.
func TestLivenessLiveAndUntrackedNeverReleased(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 31480}, "s")
	sleeper := livenessStart(t)
	livenessClaimPid(m, "s", "alive", strconv.Itoa(sleeper.Pid()))
	livenessClaimPid(m, "s", "ghost", "none")
	if got := livenessState(m, "s", "alive"); got != "live" {
		t.Fatalf("alive: state=%s", got)
	}
	if got := livenessState(m, "s", "ghost"); got != "untracked" {
		t.Fatalf("ghost: state=%s", got)
	}
	for _, name := range []string{"c1", "c2", "c3"} {
		m.ok("touch $M/app/stacks/s/holders/" + name)
	}
	if got := livenessNames(m, "s"); got != "alive c1 c2 c3 ghost" {
		t.Fatalf("holders after three claims: %q", got)
	}
	if r := livenessReadRecord(m, "s"); r.Value.LastReleasedHolder != nil {
		t.Fatalf("lastReleasedHolder = %s, want none released", *r.Value.LastReleasedHolder)
	}

	// A drain needs the stack to itself: alive (pid shown) and the others stand in the way.
	before := m.read("app/stacks/s/record")
	m.refused("echo sleep holder=c1 > $M/app/stacks/s/drain/request", syscall.EBUSY)
	if got := m.read("app/stacks/s/record"); got != before {
		t.Fatalf("record changed by a refused drain request:\n%s\n%s", before, got)
	}
	ev := m.lastEvent("app/stacks/s/events")
	want := fmt.Sprintf("kill %d", sleeper.Pid())
	if !strings.Contains(ev, `"code":"CLAIM_CO_TENANT"`) || !strings.Contains(ev, `"errno":"EBUSY"`) || !strings.Contains(ev, want) {
		t.Fatalf("events line lacks CLAIM_CO_TENANT/EBUSY/%q: %s", want, ev)
	}
}

// Dead holders are released before a drain reservation too (§5), so the one live holder left
// can reserve.
func TestLivenessDrainReservationReleasesDead(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 31580}, "s")
	livenessClaimPid(m, "s", "me", "none")
	sleeper := livenessStart(t)
	livenessClaimPid(m, "s", "gone", strconv.Itoa(sleeper.Pid()))
	goneID := livenessHolder(m, "s", "gone")["id"]
	sleeper.kill(t)

	m.ok("echo sleep holder=me > $M/app/stacks/s/drain/request")

	if got := livenessNames(m, "s"); got != "me" {
		t.Fatalf("holders after the reservation: %q, want me", got)
	}
	r := livenessReadRecord(m, "s")
	if r.Value.LastReleasedHolder == nil || *r.Value.LastReleasedHolder != goneID {
		t.Fatalf("lastReleasedHolder = %v, want %s", r.Value.LastReleasedHolder, goneID)
	}
	if !strings.Contains(m.read("app/stacks/s/drain/request"), `"sleep"`) {
		t.Fatalf("drain/request: %s", m.read("app/stacks/s/drain/request"))
	}
}

// livenessStartTicks reads field 22 of /proc/<pid>/stat (after the last ')').
func livenessStartTicks(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return fields[19]
}

// livenessReuse starts `sleep 600`, in a session of its own, as pid, which must be free: as root,
// writing pid-1 to ns_last_pid makes the next fork get pid unless another process forks in
// between, so it retries. The write and the fork are a bash's, one right after the other: done
// from the test's process, where the suite's parallel tests fork and the runtime's threads take
// pids too, 200 tries all failed in a full run. A process started within the same clock tick
// as the one it replaces would carry the same start identity, which is not reuse anyone could
// detect, so that retries too.
func livenessReuse(t *testing.T, pid int, oldTicks string) int {
	t.Helper()
	const launch = `for try in {1..1000}; do
			echo $(($1 - 1)) > /proc/sys/kernel/ns_last_pid || exit 1
			setsid sleep 600 & p=$!
			if [ "$p" = "$1" ]; then echo "$try"; exec >&-; wait "$p"; exit 0; fi
			kill -9 "$p"; wait "$p"
		done 2>/dev/null
		exit 1`
	for round := 0; round < 3; round++ {
		cmd := exec.Command("bash", "-c", launch, "bash", strconv.Itoa(pid))
		tries := testtool.StartReady(t, cmd) // no line: 1,000 tries did not get pid back
		testtool.KillAtEnd(t, pid)           // the sleep: in a session of its own
		if livenessStartTicks(t, pid) != oldTicks {
			t.Logf("pid %d reused after %s tries", pid, strings.TrimSpace(tries))
			return pid
		}
		syscall.Kill(pid, syscall.SIGKILL)
		cmd.Wait()
		time.Sleep(20 * time.Millisecond) // let a clock tick pass
	}
	t.Fatalf("pid %d came back only within its first start's clock tick", pid)
	return 0
}

// A pid reused by a stranger is dead (its start identity differs), and a claim releases it even
// though the pid exists.
func TestLivenessPidReuse(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("pid reuse needs root (ns_last_pid) and CI=true")
		}
		t.Skip("SKIPPING pid reuse: needs root to write /proc/sys/kernel/ns_last_pid")
	}
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 31680}, "s")
	livenessClaimPid(m, "s", "keeper", "none")
	first := livenessStart(t)
	pid := first.Pid()
	livenessClaimPid(m, "s", "reused", strconv.Itoa(pid))
	h := livenessHolder(m, "s", "reused")
	if h["state"] != "live" {
		t.Fatalf("reused before the kill: %v", h)
	}
	recorded := h["process_start"]
	oldTicks := livenessStartTicks(t, pid)
	if !strings.HasSuffix(recorded, ":"+oldTicks) {
		t.Fatalf("process_start %s does not end in the start ticks %s of /proc/%d/stat", recorded, oldTicks, pid)
	}
	first.kill(t)

	stranger := livenessReuse(t, pid, oldTicks)
	// The pid exists again: only the start identity can tell the holder is dead.
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("kill -0 %d: %v", pid, err)
	}
	h = livenessHolder(m, "s", "reused")
	if h["pid"] != strconv.Itoa(pid) || h["process_start"] != recorded || h["state"] != "dead" {
		t.Fatalf("reused with its pid taken by another process: %v, want state=dead", h)
	}
	leaseBefore := livenessLease(m, "s")
	m.ok("touch $M/app/stacks/s/holders/next")
	if got := livenessNames(m, "s"); got != "keeper next" {
		t.Fatalf("holders after next's claim: %q, want keeper next", got)
	}
	if got := livenessLease(m, "s"); got != leaseBefore {
		t.Fatalf("lease changed:\n%s\n%s", leaseBefore, got)
	}
	r := livenessReadRecord(m, "s")
	if r.Value.LastReleasedHolder == nil || *r.Value.LastReleasedHolder != h["id"] {
		t.Fatalf("lastReleasedHolder = %v, want %s", r.Value.LastReleasedHolder, h["id"])
	}
	// The stranger itself is untouched.
	if err := syscall.Kill(stranger, 0); err != nil {
		t.Fatalf("the stranger %d is gone: %v", stranger, err)
	}
}

// `touch holders/me` from a shell in its own session holds the stack with that shell (the
// session leader), not with touch; through make, with the shell that ran make.
func TestLivenessDefaultPidIsSessionLeader(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 31880}, "s")
	holders := m.Path("app/stacks/s/holders")

	// Inside the session: the holder names this bash and reads live; touch's own pid is gone
	// by then, so a wrong default would read dead.
	out := m.ok(`setsid bash -c 'touch ` + holders + `/me; echo $$; cat ` + holders + `/me'`)
	lines := strings.SplitN(out, "\n", 2)
	bashPid := lines[0]
	if !strings.Contains(lines[1], "\npid="+bashPid+"\n") || !strings.Contains(lines[1], "\nstate=live\n") {
		t.Fatalf("holder me as its session saw it (bash pid %s):\n%s", bashPid, lines[1])
	}
	if got := livenessHolder(m, "s", "me")["pid"]; got != bashPid {
		t.Fatalf("me: pid=%s, want the session leader %s", got, bashPid)
	}

	// make runs the recipe's touch in a child (of a child); the session is still the bash's.
	dir := t.TempDir()
	mk := "all:\n\ttouch $(H)\n"
	if err := os.WriteFile(filepath.Join(dir, "Makefile"), []byte(mk), 0o644); err != nil {
		t.Fatal(err)
	}
	out = m.ok(`setsid bash -c 'make -s -C ` + dir + ` H=` + holders + `/made >&2; echo $$'`)
	bashPid = strings.TrimSpace(out)
	h := livenessHolder(m, "s", "made")
	if h["pid"] != bashPid {
		t.Fatalf("made: pid=%s, want the session leader (the bash that ran make) %s", h["pid"], bashPid)
	}
	// The checkout defaults to the creating process's working directory: make -C's.
	if h["checkout_path"] != dir {
		t.Fatalf("made: checkout_path=%s, want %s", h["checkout_path"], dir)
	}
}

// A holder created from a session whose leader has since exited is dead; the next claim
// releases it.
func TestLivenessSessionLeaderExited(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 32080}, "s")
	livenessClaimPid(m, "s", "keeper", "none")
	holders := m.Path("app/stacks/s/holders")
	// `; echo $$` keeps bash from exec'ing touch, so bash (not touch) is the session leader.
	bashPid := strings.TrimSpace(m.ok(`setsid bash -c 'touch ` + holders + `/x; echo $$'`))
	h := livenessHolder(m, "s", "x")
	if h["pid"] != bashPid {
		t.Fatalf("x: pid=%s, want the session leader %s", h["pid"], bashPid)
	}
	// bash was our direct child (setsid exec'd it) and has been reaped by now.
	if h["state"] != "dead" {
		t.Fatalf("x after its session ended: state=%s, want dead", h["state"])
	}
	m.ok("touch $M/app/stacks/s/holders/y")
	if got := livenessNames(m, "s"); got != "keeper y" {
		t.Fatalf("holders after y's claim: %q, want keeper y", got)
	}
	r := livenessReadRecord(m, "s")
	if r.Value.LastReleasedHolder == nil || *r.Value.LastReleasedHolder != h["id"] {
		t.Fatalf("lastReleasedHolder = %v, want %s", r.Value.LastReleasedHolder, h["id"])
	}
}

// In a pid namespace whose processes' session leader lives outside it (a container, a CI job) the
// kernel reports session 0; the holder is then the outermost process of the session the daemon
// can see, so a claim from a short-lived touch is not dead the moment touch exits.
func TestLivenessSessionOutsidePidNamespace(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("a pid namespace needs root and CI=true")
		}
		t.Skip("SKIPPING pid namespace test: needs root for unshare --pid")
	}
	if out, err := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "true").CombinedOutput(); err != nil {
		t.Skipf("SKIPPING pid namespace test: this machine refuses one (%v: %s)", err, out)
	}
	base := t.TempDir()
	// The namespace's init is this bash; when it exits the kernel kills the daemon with it, and
	// the mount, private to the namespace's mount namespace, goes too. --kill-child ends it if
	// the test's timeout kills unshare first.
	script := `set -e
"$COCKPITFS" mount --daemon --data "$B/data" "$B/mnt" >/dev/null
S="$B/mnt/app/stacks/s"
mkdir "$B/mnt/app"
cat > "$B/mnt/app/config" <<'EOF'
[ports]
step = 10
count = 20
[ports.bases]
HTTP = 32280
EOF
mkdir "$S"
echo "sid=$(cut -d' ' -f6 /proc/$$/stat) pid=$$"
touch "$S/holders/first"
touch "$S/holders/second"
echo "holders=$(ls "$S/holders" | tr '\n' ,)"
grep -E '^(pid|state)=' "$S/holders/first"
"$COCKPITFS" unmount "$B/mnt" >/dev/null
`
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--pid", "--kill-child", "--mount-proc", "bash", "-c", script)
	cmd.Env = append(os.Environ(), "COCKPITFS="+binary, "B="+base)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in a new pid namespace: %v\n%s", err, out)
	}
	want := "sid=0 pid=1\nholders=first,second,\npid=1\nstate=live\n"
	if string(out) != want {
		t.Fatalf("in a new pid namespace:\n%s\nwant:\n%s", out, want)
	}
}
