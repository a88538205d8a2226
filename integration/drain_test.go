package integration

// Drains (SPEC §7) through the mount: reserve with drain/request, step with drain/attempt and
// drain/outcome, repair with drain/repair, cancel by unlinking drain/request; driven by echo,
// cat, a bash executor (testdata/drain-executor.sh) and make (testdata/Makefile.drain).
// Port bases here are 36xxx-37xxx, distinct per test.

import (
	"crypto/sha256"
	"encoding/hex"
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

// drainDir is a stack's directory as scripts name it.
func drainDir(stack string) string { return "$M/app/stacks/" + stack }

// drainJSON parses a JSON file below the mount point; an empty file is nil.
func drainJSON(t *testing.T, m *mount, parts ...string) map[string]any {
	t.Helper()
	text := m.read(parts...)
	if text == "" {
		return nil
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		t.Fatalf("%s is not JSON: %v\n%s", filepath.Join(parts...), err, text)
	}
	return v
}

// drainRecord is a stack's record, and drainValue its value.
func drainRecord(t *testing.T, m *mount, stack string) map[string]any {
	t.Helper()
	return drainJSON(t, m, "app/stacks", stack, "record")
}

func drainValue(t *testing.T, m *mount, stack string) map[string]any {
	t.Helper()
	return drainRecord(t, m, stack)["value"].(map[string]any)
}

// drainRevision is a stack's revision file as a number.
func drainRevision(t *testing.T, m *mount, stack string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(m.read("app/stacks", stack, "revision")))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// drainState is everything a refused drain operation must leave as it was: the stack's revision,
// record, lease, drain files, directory listings, and the machine's port index.
func drainState(m *mount, stack string) string {
	m.t.Helper()
	return m.ok(fmt.Sprintf(`cd %s && cat revision record lease drain/request drain/attempt && ls holders ports entrypoints && ls $M/ports`, drainDir(stack)))
}

// drainEvents parses a stack's events file, one map per line.
func drainEvents(t *testing.T, m *mount, stack string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(m.read("app/stacks", stack, "events"), "\n") {
		if line == "" {
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("events line is not JSON: %v\n%s", err, line)
		}
		out = append(out, ev)
	}
	return out
}

// drainRefused runs script, which must be refused with errno; the stack must be unchanged and its
// events file must end with one new refusal line of code and errno. It returns that line.
func drainRefused(t *testing.T, m *mount, stack, script string, errno syscall.Errno, code string) map[string]any {
	t.Helper()
	before, lines := drainState(m, stack), len(drainEvents(t, m, stack))
	m.refused(script, errno)
	if after := drainState(m, stack); after != before {
		t.Fatalf("refused %q changed the stack:\nbefore:\n%s\nafter:\n%s", script, before, after)
	}
	evs := drainEvents(t, m, stack)
	if len(evs) != lines+1 {
		t.Fatalf("refused %q: events went from %d to %d lines, want one more", script, lines, len(evs))
	}
	ev := evs[len(evs)-1]
	if ev["result"] != "refused" || ev["code"] != code || ev["errno"] != errnoName(errno) {
		t.Fatalf("refused %q: last event %v, want %s/%s", script, ev, code, errnoName(errno))
	}
	return ev
}

// errnoName is the symbolic name events lines use.
func errnoName(e syscall.Errno) string {
	names := map[syscall.Errno]string{syscall.EBUSY: "EBUSY", syscall.ESTALE: "ESTALE",
		syscall.ENOTRECOVERABLE: "ENOTRECOVERABLE", syscall.EINVAL: "EINVAL", syscall.ENOENT: "ENOENT",
		syscall.EACCES: "EACCES", syscall.EDQUOT: "EDQUOT", syscall.EPERM: "EPERM", syscall.EMFILE: "EMFILE"}
	if n, ok := names[e]; ok {
		return n
	}
	panic(fmt.Sprintf("errnoName: add %v", e))
}

// drainReleased checks a stack a drain completed: no holders, the lease shown released, the
// lease files gone, its ports free in the machine index, the drain's holder lastReleasedHolder.
func drainReleased(t *testing.T, m *mount, stack, holderID string, ports ...string) {
	t.Helper()
	if got := m.ok("ls -A " + drainDir(stack) + "/holders " + drainDir(stack) + "/ports " + drainDir(stack) + "/entrypoints"); strings.TrimSpace(strings.ReplaceAll(got, "\n\n", "\n")) != strings.Join([]string{
		m.Dir + "/app/stacks/" + stack + "/entrypoints:",
		m.Dir + "/app/stacks/" + stack + "/holders:",
		m.Dir + "/app/stacks/" + stack + "/ports:",
	}, "\n") {
		t.Fatalf("holders/, ports/, entrypoints/ after the drain:\n%s", got)
	}
	if r := m.sh("cat " + drainDir(stack) + "/env"); r.Code == 0 || !strings.Contains(r.Stderr, "No such file") {
		t.Fatalf("env after the drain: %+v", r)
	}
	if lease := m.read("app/stacks", stack, "lease"); !strings.Contains(lease, "released=true\n") {
		t.Fatalf("lease after the drain:\n%s", lease)
	}
	index := m.ok("ls $M/ports")
	for _, p := range ports {
		if strings.Contains(index, p) {
			t.Fatalf("ls $M/ports still lists %s after the drain:\n%s", p, index)
		}
	}
	v := drainValue(t, m, stack)
	if v["drain"] != nil || v["lastReleasedHolder"] != holderID || len(v["holders"].([]any)) != 0 {
		t.Fatalf("record value after the drain: %v", v)
	}
	if req, att := m.read("app/stacks", stack, "drain/request"), m.read("app/stacks", stack, "drain/attempt"); req != "" || att != "" {
		t.Fatalf("drain/request %q, drain/attempt %q after the drain, want both empty", req, att)
	}
}

// drainHolderID is holders/<name>'s id line.
func drainHolderID(t *testing.T, m *mount, stack, name string) string {
	t.Helper()
	for _, line := range strings.Split(m.read("app/stacks", stack, "holders", name), "\n") {
		if id, ok := strings.CutPrefix(line, "id="); ok {
			return id
		}
	}
	t.Fatalf("holders/%s has no id", name)
	return ""
}

// drainSleeper is a `sleep 600` executor in its own session, killed and reaped when the test ends.
type drainSleeper struct {
	cmd    *exec.Cmd
	reaped bool
}

func drainStartSleeper(t *testing.T) *drainSleeper {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &drainSleeper{cmd: cmd}
	t.Cleanup(s.kill)
	return s
}

// kill sends SIGKILL and reaps: an unreaped zombie still answers signal 0.
func (s *drainSleeper) kill() {
	if !s.reaped {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.reaped = true
	}
}

// A full sleep: reserve, start the runtime-stop, publish its success; the stack is released with
// its ports, and the next stack leases the same family at offset 0.
func TestDrainSleep(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 36080, "DB": 36081}, "s1", "s2")
	m.ok("touch $M/app/stacks/s1/holders/me")
	id := drainHolderID(t, m, "s1", "me")
	stackID := drainRecord(t, m, "s1")["subjectId"].(string)
	if idx := m.ok("ls $M/ports"); idx != "36080\n36081\n" {
		t.Fatalf("ls $M/ports before the drain: %q", idx)
	}

	m.ok("cd $M/app/stacks/s1 && echo sleep > drain/request")
	req := drainJSON(t, m, "app/stacks/s1/drain/request")
	actions := req["actions"].([]any)
	if req["purpose"] != "sleep" || req["holderId"] != id || len(actions) != 1 ||
		actions[0].(map[string]any)["stage"] != "runtime-stop" || actions[0].(map[string]any)["targetId"] != stackID ||
		actions[0].(map[string]any)["validForMs"] != float64(120000) {
		t.Fatalf("drain/request after echo sleep: %v", req)
	}
	if att := m.read("app/stacks/s1/drain/attempt"); att != "" {
		t.Fatalf("drain/attempt before start: %q", att)
	}

	m.ok("cd $M/app/stacks/s1 && echo start > drain/attempt")
	att := drainJSON(t, m, "app/stacks/s1/drain/attempt")
	if att["currentStage"] != "runtime-stop" || att["currentTarget"] != stackID || att["status"] != "active" || att["actionIndex"] != float64(0) {
		t.Fatalf("drain/attempt after start: %v", att)
	}
	// st_size is what a read returns (tail and wc trust it).
	if got := m.ok("cd $M/app/stacks/s1/drain && for f in request attempt; do echo $(stat -c %s $f) $(cat $f | wc -c); done"); strings.Fields(got)[0] != strings.Fields(got)[1] || strings.Fields(got)[2] != strings.Fields(got)[3] {
		t.Fatalf("st_size vs content of drain/request, drain/attempt: %q", got)
	}
	// Still leased while the runtime stops.
	if got := m.read("app/stacks/s1/ports/HTTP"); got != "36080\n" {
		t.Fatalf("ports/HTTP during the attempt: %q", got)
	}

	// wait opened before the success returns the revision the success committed.
	rev := drainRevision(t, m, "s1")
	if got := m.ok("cd $M/app/stacks/s1 && exec 3<wait && echo success > drain/outcome && cat <&3"); got != fmt.Sprintf("%d\n", rev+1) {
		t.Fatalf("wait across the success returned %q, want %d", got, rev+1)
	}
	drainReleased(t, m, "s1", id, "36080", "36081")
	if lease := m.read("app/stacks/s1/lease"); lease != "offset=0\nstep=10\ncount=20\nreleased=true\nDB=36081\nHTTP=36080\n" &&
		lease != "offset=0\nstep=10\ncount=20\nreleased=true\nHTTP=36080\nDB=36081\n" {
		t.Fatalf("lease after the drain:\n%s", lease)
	}
	if got := drainRecord(t, m, "s1")["value"].(map[string]any)["lastReleasedHolder"]; got != id {
		t.Fatalf("lastReleasedHolder = %v, want %s", got, id)
	}

	// The released family is free: the next stack leases offset 0 again.
	m.ok("touch $M/app/stacks/s2/holders/me")
	if lease := m.read("app/stacks/s2/lease"); !strings.HasPrefix(lease, "offset=0\n") || !strings.Contains(lease, "HTTP=36080\n") {
		t.Fatalf("next stack's lease:\n%s", lease)
	}
	if got := m.read("ports/36080"); got != "cockpit=app stack=s2 key=HTTP offset=0\n" {
		t.Fatalf("ports/36080 = %q", got)
	}
	// A drained stack has no holders, no active lease and no drain: it can be removed.
	m.ok("rmdir $M/app/stacks/s1")
}

// drainWorkDirs makes one directory per volume, plus one no drain names, under a temp dir.
func drainWorkDirs(t *testing.T) string {
	t.Helper()
	work := t.TempDir()
	for _, d := range []string{"db", "cache", "keep"} {
		if err := os.MkdirAll(filepath.Join(work, d, "data"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return work
}

// drainCheckReclaimed checks the volumes are gone and the unnamed directory stays.
func drainCheckReclaimed(t *testing.T, work string) {
	t.Helper()
	for _, d := range []string{"db", "cache"} {
		if _, err := os.Stat(filepath.Join(work, d)); !os.IsNotExist(err) {
			t.Fatalf("volume directory %s survived the drain: %v", d, err)
		}
	}
	if _, err := os.Stat(filepath.Join(work, "keep", "data")); err != nil {
		t.Fatalf("a directory no target names was touched: %v", err)
	}
}

// drainOkSequence lists the drain files written by the events file's ok lines from index from,
// checking their revisions are consecutive; it fails on any refusal among them.
func drainOkSequence(t *testing.T, evs []map[string]any) []string {
	t.Helper()
	var files []string
	var last float64
	for i, ev := range evs {
		if ev["result"] != "ok" {
			t.Fatalf("events line %d is not ok: %v", i, ev)
		}
		rev := ev["revision"].(float64)
		if i > 0 && rev != last+1 {
			t.Fatalf("events line %d: revision %v after %v", i, rev, last)
		}
		last = rev
		path := ev["path"].(string)
		files = append(files, path[strings.LastIndex(path, "/")+1:])
	}
	return files
}

// The executor script takes a down of two volumes through: runtime-stop, then the reclaims in
// sorted order (volume:cache before volume:db), the first try of volume:cache failing and retried.
func TestDrainDownExecutor(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 36180, "DB": 36181}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	id := drainHolderID(t, m, "s", "me")
	stackID := drainRecord(t, m, "s")["subjectId"].(string)
	claimEvents := len(drainEvents(t, m, "s"))
	startRev := drainRevision(t, m, "s")
	work := drainWorkDirs(t)
	marker := filepath.Join(t.TempDir(), "failed-once")
	script, err := filepath.Abs("../examples/drain-executor.sh")
	if err != nil {
		t.Fatal(err)
	}

	out := m.ok(fmt.Sprintf("WORK=%s %s %s %s", work, script, drainDir("s"), marker))
	want := "stop " + stackID + "\nreclaim volume:cache failed\nreclaim volume:cache\nreclaim volume:db\ndrained\n"
	if out != want {
		t.Fatalf("executor output:\n%s\nwant:\n%s", out, want)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the fail-once marker was not made: %v", err)
	}
	drainCheckReclaimed(t, work)
	drainReleased(t, m, "s", id, "36180", "36181")

	// Reserve, then (start, outcome) for runtime-stop, the failed cache, the retried cache, db:
	// nine steps, one revision each.
	files := drainOkSequence(t, drainEvents(t, m, "s")[claimEvents:])
	if got := strings.Join(files, " "); got != "request attempt outcome attempt outcome attempt outcome attempt outcome" {
		t.Fatalf("drain steps in events: %s", got)
	}
	if got := drainRevision(t, m, "s"); got != startRev+9 {
		t.Fatalf("revision %d after the drain, want %d", got, startRev+9)
	}
}

// The Makefile's down target does the same; a drain begun by hand is resumed by `make down`.
func TestDrainDownMakefile(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	// count = 1: the cockpit's one lease must be given back by the drain for s2 to claim.
	m.setupApp(1, map[string]int{"HTTP": 36280, "DB": 36281}, "s1", "s2")
	makefile, err := filepath.Abs("../examples/Makefile.drain")
	if err != nil {
		t.Fatal(err)
	}

	m.ok("touch $M/app/stacks/s1/holders/me")
	m.refused("touch $M/app/stacks/s2/holders/me", syscall.ENOSPC)
	id := drainHolderID(t, m, "s1", "me")
	work := drainWorkDirs(t)
	out := m.ok(fmt.Sprintf("make -s -f %s down S=%s WORK=%s", makefile, drainDir("s1"), work))
	if !strings.Contains(out, "reclaim volume:cache\nreclaim volume:db\ndrained\n") {
		t.Fatalf("make down output:\n%s", out)
	}
	drainCheckReclaimed(t, work)
	drainReleased(t, m, "s1", id, "36280", "36281")

	// s2 leases offset 0 again (s1 released it); its runtime is stopped by hand, then make resumes
	// the same reservation (the request write is accepted unchanged).
	m.ok("touch $M/app/stacks/s2/holders/me")
	id2 := drainHolderID(t, m, "s2", "me")
	if got := m.read("app/stacks/s2/ports/HTTP"); got != "36280\n" {
		t.Fatalf("s2 ports/HTTP = %q", got)
	}
	m.ok("cd $M/app/stacks/s2 && echo 'down volume:README volume:cache' > drain/request && echo start > drain/attempt && echo success > drain/outcome")
	if got := drainJSON(t, m, "app/stacks/s2/drain/request")["completedActionCount"]; got != float64(1) {
		t.Fatalf("completedActionCount after the manual runtime-stop: %v", got)
	}
	// A reclaim whose work fails: with WORK=$M, `rm -rf $M/README` is refused by the mount, so
	// make publishes failure and stops (volume:README sorts before volume:cache).
	r := m.sh(fmt.Sprintf("make -s -f %s down S=%s WORK=$M VOLUMES='README cache'", makefile, drainDir("s2")))
	if r.Code == 0 || strings.Contains(r.Stdout, "drained") {
		t.Fatalf("make down with a failing reclaim: %+v", r)
	}
	att := drainJSON(t, m, "app/stacks/s2/drain/attempt")
	if att["status"] != "failed" || att["currentTarget"] != "volume:README" || att["actionIndex"] != float64(1) {
		t.Fatalf("attempt after the failed make: %v", att)
	}
	// make down again resumes and retries that action.
	work2 := drainWorkDirs(t)
	out = m.ok(fmt.Sprintf("make -s -f %s down S=%s WORK=%s VOLUMES='README cache'", makefile, drainDir("s2"), work2))
	if strings.Contains(out, "stop ") || !strings.Contains(out, "reclaim volume:README\nreclaim volume:cache\ndrained\n") {
		t.Fatalf("make down (resuming) output:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(work2, "cache")); !os.IsNotExist(err) {
		t.Fatalf("cache survived: %v", err)
	}
	if _, err := os.Stat(filepath.Join(work2, "db")); err != nil {
		t.Fatalf("db is no target of this drain but was removed: %v", err)
	}
	drainReleased(t, m, "s2", id2, "36280", "36281")
}

// While a drain is reserved the record changes only by the drain's own steps: claims, releases,
// holder writes and rmdir are refused, and so are steps out of order.
func TestDrainRefusalsWhileDraining(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 36380}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	m.ok("echo sleep > $M/app/stacks/s/drain/request")

	drainRefused(t, m, "s", "touch $M/app/stacks/s/holders/other", syscall.EBUSY, "CLAIM_CO_TENANT")
	drainRefused(t, m, "s", "rm $M/app/stacks/s/holders/me", syscall.EBUSY, "CLAIM_CO_TENANT")
	drainRefused(t, m, "s", "echo pid=none > $M/app/stacks/s/holders/me", syscall.EBUSY, "CLAIM_CO_TENANT")
	// No attempt yet: nothing to publish or repair.
	drainRefused(t, m, "s", "echo success > $M/app/stacks/s/drain/outcome", syscall.ESTALE, "EXECUTION_PRECONDITION_CHANGED")
	drainRefused(t, m, "s", "echo terminated > $M/app/stacks/s/drain/repair", syscall.ENOTRECOVERABLE, "DRAIN_ATTEMPT_REPAIR_REQUIRED")
	drainRefused(t, m, "s", "echo 'sleep valid_for=0' > $M/app/stacks/s/drain/request", syscall.EINVAL, "STATE_RECORD_MALFORMED")

	m.ok("echo start pid=none > $M/app/stacks/s/drain/attempt")
	drainRefused(t, m, "s", "echo start > $M/app/stacks/s/drain/attempt", syscall.EBUSY, "CLAIM_CO_TENANT")
	// An outcome naming another attempt than the active one applies to nothing.
	drainRefused(t, m, "s", "echo success attempt="+strings.Repeat("0", 64)+" > $M/app/stacks/s/drain/outcome", syscall.ESTALE, "EXECUTION_PRECONDITION_CHANGED")
	drainRefused(t, m, "s", "touch $M/app/stacks/s/holders/other", syscall.EBUSY, "CLAIM_CO_TENANT")
	// A stack with a drain is not removed (the refusal goes to the cockpit's events).
	before := drainState(m, "s")
	m.refused("rmdir $M/app/stacks/s", syscall.EBUSY)
	if ev := m.lastEvent("app/events"); !strings.Contains(ev, `"code":"CLAIM_CO_TENANT"`) || !strings.Contains(ev, `"errno":"EBUSY"`) {
		t.Fatalf("cockpit events after rmdir: %s", ev)
	}
	if after := drainState(m, "s"); after != before {
		t.Fatalf("rmdir changed the stack:\n%s\n%s", before, after)
	}
}

// drain/request's revision defaults to the one when the file was opened: a change in between
// (here a holder attribute write, which keeps one holder) refuses with ESTALE.
func TestDrainStaleRequest(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 36480}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")

	before := drainState(m, "s")
	r := m.sh("cd $M/app/stacks/s && exec 3>drain/request && echo pid=none > holders/me && echo sleep >&3")
	if r.Code == 0 || !strings.Contains(strings.ToLower(r.Stderr), syscall.ESTALE.Error()) {
		t.Fatalf("want ESTALE, got %+v", r)
	}
	if after := drainState(m, "s"); after == before {
		t.Fatalf("the holder write did not move the stack")
	}
	ev := drainEvents(t, m, "s")
	if last := ev[len(ev)-1]; last["code"] != "EXECUTION_PRECONDITION_CHANGED" || last["errno"] != "ESTALE" {
		t.Fatalf("last event: %v", last)
	}
	if v := drainValue(t, m, "s"); v["drain"] != nil {
		t.Fatalf("a drain was reserved: %v", v["drain"])
	}
	// The same through drainRefused, now that nothing moves between the open and the write
	// except what the script does before the write: the state is the one after pid=none.
	rev := drainRevision(t, m, "s")
	drainRefused(t, m, "s", fmt.Sprintf("echo 'sleep revision=%d' > $M/app/stacks/s/drain/request", rev-1), syscall.ESTALE, "EXECUTION_PRECONDITION_CHANGED")

	// Opened after the change: accepted; revision= overrides the open's revision.
	m.ok("cd $M/app/stacks/s && exec 3>drain/request && echo sleep >&3")
	if d := drainValue(t, m, "s")["drain"]; d == nil || d.(map[string]any)["expectedCoordinationRevision"] != float64(rev) {
		t.Fatalf("drain after a fresh open: %v", d)
	}
}

// A success after validThrough is refused; repair waits for the executor to be gone.
func TestDrainLateSuccessRepair(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 36580}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	id := drainHolderID(t, m, "s", "me")
	m.ok("echo 'sleep valid_for=2000' > $M/app/stacks/s/drain/request")
	executor := drainStartSleeper(t)
	pid := executor.cmd.Process.Pid
	m.ok(fmt.Sprintf("echo start pid=%d > $M/app/stacks/s/drain/attempt", pid))
	att := drainJSON(t, m, "app/stacks/s/drain/attempt")
	if att["executorPid"] != float64(pid) || att["status"] != "active" {
		t.Fatalf("attempt: %v", att)
	}

	// The executor's work outlasts the attempt's 2 s validity: its success is not trusted.
	time.Sleep(2100 * time.Millisecond)
	drainRefused(t, m, "s", "echo success > $M/app/stacks/s/drain/outcome", syscall.ESTALE, "EXECUTION_PRECONDITION_CHANGED")

	// Repair is refused while the executor lives, naming its pid.
	ev := drainRefused(t, m, "s", "echo terminated > $M/app/stacks/s/drain/repair", syscall.ENOTRECOVERABLE, "DRAIN_ATTEMPT_REPAIR_REQUIRED")
	if msg := fmt.Sprint(ev["message"], ev["fix"]); !strings.Contains(msg, strconv.Itoa(pid)) {
		t.Fatalf("repair refusal does not name executor %d: %v", pid, ev)
	}

	executor.kill()
	m.ok("echo terminated > $M/app/stacks/s/drain/repair")
	att = drainJSON(t, m, "app/stacks/s/drain/attempt")
	if att["status"] != "failed" || att["failedRevision"] == nil || att["failedAt"] == nil {
		t.Fatalf("attempt after repair: %v", att)
	}
	// Repaired: nothing is active, so repair again has nothing to do.
	drainRefused(t, m, "s", "echo terminated > $M/app/stacks/s/drain/repair", syscall.ENOTRECOVERABLE, "DRAIN_ATTEMPT_REPAIR_REQUIRED")

	// A retry in time completes the drain.
	m.ok("cd $M/app/stacks/s && echo start > drain/attempt && echo success > drain/outcome")
	drainReleased(t, m, "s", id, "36580")
}

// With no executor recorded, repair waits for validThrough.
func TestDrainRepairNoExecutor(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 36680}, "s1", "s2")
	m.ok("touch $M/app/stacks/s1/holders/me")
	m.ok("cd $M/app/stacks/s1 && echo sleep > drain/request && echo start pid=none > drain/attempt")
	if att := drainJSON(t, m, "app/stacks/s1/drain/attempt"); att["executorPid"] != nil {
		t.Fatalf("attempt with pid=none names an executor: %v", att)
	}
	// Valid for the default 120 s: no repair yet.
	ev := drainRefused(t, m, "s1", "echo terminated > $M/app/stacks/s1/drain/repair", syscall.ENOTRECOVERABLE, "DRAIN_ATTEMPT_REPAIR_REQUIRED")
	if !strings.Contains(ev["message"].(string), "no executor") {
		t.Fatalf("refusal message: %v", ev["message"])
	}

	// Valid for 1 ms: once it has passed, repair records the attempt failed and start retries.
	m.ok("touch $M/app/stacks/s2/holders/me")
	m.ok("cd $M/app/stacks/s2 && echo 'down volume:x valid_for=1' > drain/request && echo start pid=none > drain/attempt")
	m.ok("sleep 0.05 && echo terminated > $M/app/stacks/s2/drain/repair")
	att := drainJSON(t, m, "app/stacks/s2/drain/attempt")
	if att["status"] != "failed" || att["currentStage"] != "runtime-stop" {
		t.Fatalf("attempt after repair: %v", att)
	}
	m.ok("echo start pid=none > $M/app/stacks/s2/drain/attempt")
	if att := drainJSON(t, m, "app/stacks/s2/drain/attempt"); att["status"] != "active" || att["actionIndex"] != float64(0) {
		t.Fatalf("retried attempt: %v", att)
	}
}

// Unlinking drain/request cancels a reservation no attempt has started; afterwards it is refused.
func TestDrainCancel(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 36780}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	lease := m.read("app/stacks/s/lease")
	m.ok("echo 'down volume:db' > $M/app/stacks/s/drain/request")
	rev := drainRevision(t, m, "s")

	m.ok("rm $M/app/stacks/s/drain/request")
	if got := drainRevision(t, m, "s"); got != rev+1 {
		t.Fatalf("revision after cancel: %d, want %d", got, rev+1)
	}
	if v := drainValue(t, m, "s"); v["drain"] != nil || len(v["holders"].([]any)) != 1 {
		t.Fatalf("record after cancel: %v", v)
	}
	if got := m.read("app/stacks/s/lease"); got != lease {
		t.Fatalf("lease after cancel:\n%s\nwant:\n%s", got, lease)
	}
	if got := m.read("app/stacks/s/ports/HTTP"); got != "36780\n" {
		t.Fatalf("ports/HTTP after cancel: %q", got)
	}
	if got := m.ok("ls $M/app/stacks/s/drain"); got != "attempt\noutcome\nplanning\nrepair\nrequest\n" {
		t.Fatalf("drain/ after cancel: %q", got)
	}
	if ev := drainEvents(t, m, "s"); ev[len(ev)-1]["op"] != "unlink" || ev[len(ev)-1]["result"] != "ok" {
		t.Fatalf("cancel event: %v", ev[len(ev)-1])
	}
	// The holder may now leave... but not as the last one; a co-tenant may join again.
	m.ok("touch $M/app/stacks/s/holders/other && rm $M/app/stacks/s/holders/other")

	// Nothing reserved: nothing to cancel.
	drainRefused(t, m, "s", "rm $M/app/stacks/s/drain/request", syscall.ENOENT, "NOT_FOUND")

	// Started: no longer cancellable.
	m.ok("cd $M/app/stacks/s && echo sleep > drain/request && echo start > drain/attempt")
	drainRefused(t, m, "s", "rm $M/app/stacks/s/drain/request", syscall.EBUSY, "CLAIM_CO_TENANT")
	// A published failure still counts as started.
	m.ok("echo failure > $M/app/stacks/s/drain/outcome")
	drainRefused(t, m, "s", "rm $M/app/stacks/s/drain/request", syscall.EBUSY, "CLAIM_CO_TENANT")
}

// Writing the reserved request again resumes it (no change); another purpose is refused.
func TestDrainResume(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 36880}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	m.ok("echo sleep > $M/app/stacks/s/drain/request")
	before := drainState(m, "s")
	lines := len(drainEvents(t, m, "s"))

	m.ok("echo sleep > $M/app/stacks/s/drain/request")
	m.ok("echo sleep holder=me > $M/app/stacks/s/drain/request")
	if after := drainState(m, "s"); after != before {
		t.Fatalf("resuming changed the stack:\n%s\n%s", before, after)
	}
	if got := len(drainEvents(t, m, "s")); got != lines {
		t.Fatalf("resuming added %d events lines", got-lines)
	}

	drainRefused(t, m, "s", "echo down > $M/app/stacks/s/drain/request", syscall.ENOTRECOVERABLE, "DRAIN_ATTEMPT_REPAIR_REQUIRED")
	drainRefused(t, m, "s", "echo 'down volume:db' > $M/app/stacks/s/drain/request", syscall.ENOTRECOVERABLE, "DRAIN_ATTEMPT_REPAIR_REQUIRED")
	// Another holder's request for the same purpose: the drain is not theirs (the seeds'
	// CLAIM_CO_TENANT), and a request planned before the last step is stale.
	drainRefused(t, m, "s", "echo 'sleep holder=other' > $M/app/stacks/s/drain/request", syscall.EBUSY, "CLAIM_CO_TENANT")
	reservedAt := drainValue(t, m, "s")["drain"].(map[string]any)["expectedCoordinationRevision"].(float64)
	drainRefused(t, m, "s", fmt.Sprintf("echo 'sleep revision=%d' > $M/app/stacks/s/drain/request", int(reservedAt)-1), syscall.ESTALE, "EXECUTION_PRECONDITION_CHANGED")
	// While an attempt is active a resume would take over a running executor's work: the
	// attempt needs its outcome or a repair first.
	m.ok("echo start pid=none > $M/app/stacks/s/drain/attempt")
	drainRefused(t, m, "s", "echo sleep > $M/app/stacks/s/drain/request", syscall.ENOTRECOVERABLE, "DRAIN_ATTEMPT_REPAIR_REQUIRED")
	// After a failure it resumes again.
	m.ok("cd $M/app/stacks/s && echo failure > drain/outcome && echo sleep > drain/request")
	if att := drainJSON(t, m, "app/stacks/s/drain/attempt"); att["status"] != "failed" {
		t.Fatalf("attempt after resume: %v", att)
	}
}

// The reference implementation's JSON request is accepted when it states the plan the stack
// derives; the given digests are kept.
func TestDrainJSONRequest(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 36980, "DB": 36981}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	rec := drainRecord(t, m, "s")
	stackID := rec["subjectId"].(string)
	holderID := drainHolderID(t, m, "s", "me")
	decl := rec["value"].(map[string]any)["lease"].(map[string]any)["declaration"]
	canonical, err := json.Marshal(decl) // maps marshal with sorted keys: the canonical form
	if err != nil {
		t.Fatal(err)
	}
	hexsum := func(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }
	// The executor's own commitment body (any canonical JSON with its sha256), and a validity of
	// its own for each action: the reservation keeps both as given.
	commitmentBody := fmt.Sprintf(`{"driver":"local","labels":{"stack":%q},"volume":"db"}`, stackID)
	actions := []map[string]any{
		{"stage": "runtime-stop", "targetId": stackID, "validForMs": 60000},
		{"stage": "reclaim", "targetId": "volume:db", "validForMs": 90000,
			"targetCommitment": map[string]any{"format": "cockpit-reclaim-target/v1", "sha256": hexsum(commitmentBody), "body": commitmentBody}},
	}
	actionsJSON, _ := json.Marshal(actions)
	targets := []string{stackID, "volume:db"}
	if targets[1] < targets[0] {
		targets[0], targets[1] = targets[1], targets[0]
	}
	request := map[string]any{
		"purpose": "down", "stackId": stackID, "holderId": holderID, "requesterId": holderID,
		"configSha256": hexsum(string(canonical)), "planDigest": hexsum(string(actionsJSON)),
		"operationBasis": hexsum("basis"), "generation": hexsum("generation"),
		"targetIds": targets, "actions": actions, "expectedCoordinationRevision": rec["revision"],
	}
	body, _ := json.Marshal(request)
	path := filepath.Join(t.TempDir(), "request.json")
	if err := os.WriteFile(path, body, 0o644); err != nil {
		t.Fatal(err)
	}

	// A stale expectedCoordinationRevision is refused as the seeds' reserveDrain refuses it.
	stale := strings.Replace(string(body), fmt.Sprintf(`"expectedCoordinationRevision":%v`, rec["revision"]), fmt.Sprintf(`"expectedCoordinationRevision":%v`, rec["revision"].(float64)+5), 1)
	stalePath := filepath.Join(t.TempDir(), "stale.json")
	if err := os.WriteFile(stalePath, []byte(stale), 0o644); err != nil {
		t.Fatal(err)
	}
	drainRefused(t, m, "s", "cat "+stalePath+" > $M/app/stacks/s/drain/request", syscall.EBUSY, "CLAIM_CO_TENANT")
	// A plan other than the derived one (targets unsorted, no commitment) is malformed.
	var wrong map[string]any
	json.Unmarshal(body, &wrong)
	wrong["actions"] = []map[string]any{actions[0], {"stage": "reclaim", "targetId": "volume:db", "validForMs": 60000}}
	wrongBody, _ := json.Marshal(wrong)
	wrongPath := filepath.Join(t.TempDir(), "wrong.json")
	os.WriteFile(wrongPath, wrongBody, 0o644)
	drainRefused(t, m, "s", "cat "+wrongPath+" > $M/app/stacks/s/drain/request", syscall.EINVAL, "STATE_RECORD_MALFORMED")

	m.ok("cat " + path + " > $M/app/stacks/s/drain/request")
	d := drainJSON(t, m, "app/stacks/s/drain/request")
	for _, k := range []string{"purpose", "stackId", "holderId", "requesterId", "configSha256", "planDigest", "operationBasis", "generation"} {
		if d[k] != request[k] {
			t.Errorf("reservation %s = %v, want %v", k, d[k], request[k])
		}
	}
	got, _ := json.Marshal(d["actions"])
	if string(got) != string(actionsJSON) {
		t.Errorf("reservation actions:\n%s\nwant:\n%s", got, actionsJSON)
	}
	if d["holderName"] != "me" || d["expectedCoordinationRevision"] != rec["revision"] {
		t.Errorf("reservation: %v", d)
	}
	// Each attempt is valid for its own action's validForMs.
	for _, validFor := range []time.Duration{60 * time.Second, 90 * time.Second} {
		m.ok("echo start > $M/app/stacks/s/drain/attempt")
		att := drainJSON(t, m, "app/stacks/s/drain/attempt")
		committed, _ := time.Parse(time.RFC3339Nano, att["committedAt"].(string))
		valid, _ := time.Parse(time.RFC3339Nano, att["validThrough"].(string))
		if valid.Sub(committed) != validFor {
			t.Fatalf("attempt %v: valid for %s, want %s", att["actionIndex"], valid.Sub(committed), validFor)
		}
		m.ok("echo success > $M/app/stacks/s/drain/outcome")
	}
	drainReleased(t, m, "s", holderID, "36980", "36981")
}

// A reservation needs the stack's one live holder and an active lease.
func TestDrainReserveRefusals(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 37080}, "s")
	// No holder, no lease: nothing to drain.
	drainRefused(t, m, "s", "echo sleep > $M/app/stacks/s/drain/request", syscall.EBUSY, "CLAIM_CO_TENANT")

	m.ok("touch $M/app/stacks/s/holders/me")
	other := drainStartSleeper(t)
	m.ok(fmt.Sprintf("echo pid=%d > $M/app/stacks/s/holders/other", other.cmd.Process.Pid))
	// A live co-tenant: refused, naming its pid and how to end it.
	ev := drainRefused(t, m, "s", "echo sleep holder=me > $M/app/stacks/s/drain/request", syscall.EBUSY, "CLAIM_CO_TENANT")
	if msg := ev["message"].(string); !strings.Contains(msg, fmt.Sprintf("kill %d", other.cmd.Process.Pid)) {
		t.Fatalf("co-tenant refusal does not say how to end it: %v", ev)
	}
	// Without holder= there is no "only holder" to default to.
	drainRefused(t, m, "s", "echo sleep > $M/app/stacks/s/drain/request", syscall.EBUSY, "CLAIM_CO_TENANT")
	// A holder that does not claim the stack.
	drainRefused(t, m, "s", "echo sleep holder=ghost > $M/app/stacks/s/drain/request", syscall.ENOENT, "NOT_FOUND")
	// Malformed: unknown key, sleep with targets, a repeated target, valid_for out of range.
	for _, bad := range []string{"sleep color=red", "sleep volume:db", "down volume:db volume:db", "down valid_for=300001", "stop"} {
		drainRefused(t, m, "s", "echo '"+bad+"' > $M/app/stacks/s/drain/request", syscall.EINVAL, "STATE_RECORD_MALFORMED")
	}

	// Once the co-tenant's process is gone, the reservation releases it and proceeds.
	other.kill()
	m.ok("echo sleep holder=me > $M/app/stacks/s/drain/request")
	if got := m.ok("ls $M/app/stacks/s/holders"); got != "me\n" {
		t.Fatalf("holders after the reservation: %q", got)
	}
}

// drainServeInPidNamespace restarts m's daemon inside a new pid namespace (same store, same mount
// point). The kernel then reports every caller from this test's namespace as pid 0: a writer
// cockpitfs cannot resolve. It skips when unshare cannot make the namespace here.
func drainServeInPidNamespace(t *testing.T, m *mount) {
	t.Helper()
	testtool.Need(t, "unshare")
	m.Stop()
	var log strings.Builder
	cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child=SIGTERM", binary, "mount", "--data", m.Data, m.Dir)
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := m.ns.Do(cmd.Start); err != nil {
		t.Skipf("unshare: %v", err)
	}
	signal := testtool.GroupSignaler(t, cmd.Process.Pid)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Registered after newMount's cleanup, so it runs first: stop the namespaced daemon (SIGTERM
	// to the group reaches it as its namespace's init, which handles the signal), then detach.
	t.Cleanup(func() {
		signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			signal(syscall.SIGKILL)
			<-done
			t.Errorf("namespaced daemon did not stop on SIGTERM\n%s", log.String())
		}
		detach(m.Dir)
	})
	deadline := time.Now().Add(10 * time.Second)
	for !serving(m.Dir) {
		select {
		case err := <-done:
			done <- err
			t.Skipf("daemon in a pid namespace did not serve (%v):\n%s", err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespaced daemon not serving after 10s\n%s", log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// `start` names the writer as the executor; a writer cockpitfs cannot resolve must be refused
// (the engine's StartAttempt says so), not recorded as an attempt with no executor, which repair
// would then fail after validThrough while the writer may still be working.
func TestDrainStartUnresolvedWriter(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 37180}, "s")
	m.ok("touch $M/app/stacks/s/holders/me") // a claim needs a resolved caller: made before
	drainServeInPidNamespace(t, m)

	m.ok("echo sleep > $M/app/stacks/s/drain/request")
	evs := drainEvents(t, m, "s")
	if ev := evs[len(evs)-1]; ev["result"] != "ok" || ev["pid"] != float64(0) {
		t.Fatalf("the writer was resolved after all (the test needs pid 0): %v", ev)
	}
	drainRefused(t, m, "s", "echo start > $M/app/stacks/s/drain/attempt", syscall.EINVAL, "STATE_RECORD_MALFORMED")
	// Naming the executor explicitly is the way out.
	m.ok("echo start pid=none > $M/app/stacks/s/drain/attempt")
	if att := drainJSON(t, m, "app/stacks/s/drain/attempt"); att["status"] != "active" {
		t.Fatalf("attempt: %v", att)
	}
}

// A reservation refused for co-tenants names only them: holders of the writer's own session are
// to be released, never killed (the message once said `kill <your shell> <your shell>`).
func TestDrainCoTenantRefusalSparesTheWriter(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 37180}, "s")
	other := drainStartSleeper(t)
	m.ok(fmt.Sprintf("touch $M/app/stacks/s/holders/them && echo pid=%d > $M/app/stacks/s/holders/them", other.cmd.Process.Pid))
	// One session claims two holders and asks for the drain.
	r := m.sh(`setsid -w bash -c 'cd $M/app/stacks/s && touch holders/me holders/also-me && echo "$$" > /dev/stderr && echo sleep > drain/request'`)
	session := strings.TrimSpace(strings.SplitN(r.Stderr, "\n", 2)[0])
	if r.Code == 0 || session == "" {
		t.Fatalf("the reservation was not refused: %+v", r)
	}
	ev := drainEvents(t, m, "s")
	last := ev[len(ev)-1]
	msg := last["message"].(string)
	if last["code"] != "CLAIM_CO_TENANT" || last["errno"] != "EBUSY" {
		t.Fatalf("last event %v", last)
	}
	if !strings.Contains(msg, fmt.Sprintf("kill %d`", other.cmd.Process.Pid)) || strings.Contains(msg, session) {
		t.Fatalf("refusal %q must name kill %d and never the writer's session %s", msg, other.cmd.Process.Pid, session)
	}
}

// drain/attempt of a failed reclaim names the reclaims done, the one that failed and those left,
// each with its committed target (the seeds' inspectFailedReclaimRecovery).
func TestDrainFailedReclaimRecovery(t *testing.T) {
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 37280}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	m.ok(`cd $M/app/stacks/s && echo "down volume:a volume:b volume:c" > drain/request &&
		for i in 1 2; do echo start > drain/attempt && echo success > drain/outcome; done &&
		echo start > drain/attempt && echo failure > drain/outcome`)
	att := drainJSON(t, m, "app/stacks/s/drain/attempt")
	rec, ok := att["recovery"].(map[string]any)
	if !ok || att["status"] != "failed" || rec["freshAfter"] != att["failedAt"] {
		t.Fatalf("drain/attempt after a failed reclaim: %v", att)
	}
	ids := func(v any) (out []string) {
		for _, x := range v.([]any) {
			out = append(out, x.(map[string]any)["targetId"].(string))
		}
		return out
	}
	if c, p, cur := ids(rec["completed"]), ids(rec["pending"]), rec["current"].(map[string]any)["targetId"]; fmt.Sprint(c) != "[volume:a]" || cur != "volume:b" || fmt.Sprint(p) != "[volume:c]" {
		t.Fatalf("recovery: completed %v, current %v, pending %v", c, cur, p)
	}
	// A retry is an active attempt again: no recovery to show.
	m.ok("echo start > $M/app/stacks/s/drain/attempt")
	if att := drainJSON(t, m, "app/stacks/s/drain/attempt"); att["recovery"] != nil {
		t.Fatalf("an active attempt shows a recovery: %v", att)
	}
}
