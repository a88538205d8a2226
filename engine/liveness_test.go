package engine

import (
	"context"
	"fmt"
	"os/exec"
	"reflect"
	"syscall"
	"testing"
)

// sessionSleeper starts `sleep 60` in its own session, as a terminal's shell would hold a stack,
// and kills it when the test ends.
func sessionSleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd
}

// kill ends cmd and reaps it, so its pid is gone.
func kill(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
}

func claimWithPID(t *testing.T, e *Engine, cockpit, stack, holder string, pid int) {
	t.Helper()
	proposed := &Holder{PID: pid, CheckoutPath: "/src/" + holder}
	if err := e.Claim(context.Background(), me("create", holder), cockpit, stack, holder, proposed); err != nil {
		t.Fatalf("claim %s with pid %d: %v", holder, pid, err)
	}
}

func holderState(t *testing.T, e *Engine, cockpit, stack, holder string) string {
	t.Helper()
	h, ok := stackRecord(t, e, cockpit, stack).Value.Holder(holder)
	if !ok {
		t.Fatalf("holder %s is gone", holder)
	}
	return e.HolderState(h)
}

func TestDeadHolderReleasedByAnotherClaim(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	claim(t, e, "app", "main", "alice")
	worker := sessionSleeper(t)
	claimWithPID(t, e, "app", "main", "worker", worker.Process.Pid)
	if s := holderState(t, e, "app", "main", "worker"); s != "live" {
		t.Fatalf("worker is %s while its process runs", s)
	}
	if s := holderState(t, e, "app", "main", "alice"); s != "untracked" {
		t.Fatalf("alice is %s, want untracked", s)
	}
	before := stackRecord(t, e, "app", "main")

	kill(t, worker)
	if s := holderState(t, e, "app", "main", "worker"); s != "dead" {
		t.Fatalf("worker is %s after its process was killed", s)
	}
	claim(t, e, "app", "main", "bob")
	r := stackRecord(t, e, "app", "main")
	if names := holderNames(r.Value); !reflect.DeepEqual(names, []string{"alice", "bob"}) {
		t.Fatalf("holders %v, want [alice bob]", names)
	}
	if r.Value.LastReleasedHolder == nil || *r.Value.LastReleasedHolder != holderID("worker") {
		t.Fatalf("lastReleasedHolder %v, want worker's id", r.Value.LastReleasedHolder)
	}
	// The claim's events line says whom it released, and why.
	if ev, want := lastEventOf(t, e, "app", "main"), fmt.Sprintf("released dead holders: worker (process %d)", worker.Process.Pid); ev.Warning != want {
		t.Fatalf("bob's claim's events line warns %q, want %q", ev.Warning, want)
	}
	if !reflect.DeepEqual(r.Value.Lease, before.Value.Lease) || r.Revision != before.Revision+1 {
		t.Fatalf("lease or revision moved: %+v at %d", r.Value.Lease, r.Revision)
	}
}

// Holders of one process share one probe, and all of them go when it dies; those of another,
// live process stay.
func TestDeadHoldersOfOneProcessReleasedTogether(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	claim(t, e, "app", "main", "alice")
	worker, other := sessionSleeper(t), sessionSleeper(t)
	for _, name := range []string{"w1", "w2", "w3"} {
		claimWithPID(t, e, "app", "main", name, worker.Process.Pid)
	}
	claimWithPID(t, e, "app", "main", "o1", other.Process.Pid)
	kill(t, worker)
	claim(t, e, "app", "main", "bob")
	if names := holderNames(stackRecord(t, e, "app", "main").Value); !reflect.DeepEqual(names, []string{"alice", "bob", "o1"}) {
		t.Fatalf("holders %v, want [alice bob o1]", names)
	}
}

func TestDeadOnlyHolderTakenOver(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	worker := sessionSleeper(t)
	claimWithPID(t, e, "app", "main", "worker", worker.Process.Pid)
	before := stackRecord(t, e, "app", "main")
	kill(t, worker)
	claim(t, e, "app", "main", "alice")
	r := stackRecord(t, e, "app", "main")
	if names := holderNames(r.Value); !reflect.DeepEqual(names, []string{"alice"}) {
		t.Fatalf("holders %v, want [alice]", names)
	}
	if r.Value.LastReleasedHolder == nil || *r.Value.LastReleasedHolder != holderID("worker") {
		t.Fatalf("lastReleasedHolder %v, want worker's id", r.Value.LastReleasedHolder)
	}
	if !reflect.DeepEqual(r.Value.Lease, before.Value.Lease) {
		t.Fatalf("the takeover changed the lease: %+v", r.Value.Lease)
	}
	if r.Revision != before.Revision+1 {
		t.Fatalf("the takeover took %d revisions, want one transaction", r.Revision-before.Revision)
	}
}

func TestLiveAndUntrackedHoldersStay(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	worker := sessionSleeper(t)
	claimWithPID(t, e, "app", "main", "worker", worker.Process.Pid)
	claim(t, e, "app", "main", "alice")
	claim(t, e, "app", "main", "bob")
	r := stackRecord(t, e, "app", "main")
	if names := holderNames(r.Value); !reflect.DeepEqual(names, []string{"alice", "bob", "worker"}) {
		t.Fatalf("holders %v, want alice, bob and the live worker", names)
	}
	if r.Value.LastReleasedHolder != nil {
		t.Fatalf("lastReleasedHolder %s with nobody released", *r.Value.LastReleasedHolder)
	}
	if s := holderState(t, e, "app", "main", "worker"); s != "live" {
		t.Fatalf("worker is %s", s)
	}
}

func TestClaimRefusesDeadPID(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	refusedUnchanged(t, e, "app", "main", StateRecordMalformed, func() error {
		proposed := &Holder{PID: deadPID(t), CheckoutPath: "/src/ghost"}
		return e.Claim(context.Background(), me("create", "ghost"), "app", "main", "ghost", proposed)
	})
}

func TestClaimDefaultsToCallerSession(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	shell := sessionSleeper(t)
	// The caller is the session leader itself here: a process that started its own session.
	if err := e.ChmodStack(context.Background(), me("chmod", "app/stacks/main"), "app", "main", 0o777); err != nil {
		t.Fatal(err)
	}
	c := Caller{PID: shell.Process.Pid, UID: 1000, Op: "create", Path: "h"}
	if err := e.Claim(context.Background(), c, "app", "main", "term", nil); err != nil {
		t.Fatal(err)
	}
	h, _ := stackRecord(t, e, "app", "main").Value.Holder("term")
	if h.PID != shell.Process.Pid || h.UID != 1000 || h.ProcessStart == "" || h.CheckoutPath == "" {
		t.Fatalf("default holder %+v, want the caller's session leader %d", h, shell.Process.Pid)
	}
	kill(t, shell)
	claim(t, e, "app", "main", "alice")
	if names := holderNames(stackRecord(t, e, "app", "main").Value); !reflect.DeepEqual(names, []string{"alice"}) {
		t.Fatalf("holders %v after the session ended, want [alice]", names)
	}
}

// A claim taking the stack over from its dead holder would join a lease the config no longer
// declares: refused like a co-tenant's (the reference refuses it too). The stack is not stranded:
// a drain request naming a new holder takes it over in the reservation, under the lease's own
// declaration, as the reference's down and sleep release dead holders with the requester as the
// successor before they reserve.
func TestTakeoverKeepsLeaseUnderOldDeclaration(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	worker := sessionSleeper(t)
	claimWithPID(t, e, "app", "main", "worker", worker.Process.Pid)
	moved := "[ports]\nstep = 10\ncount = 20\n[ports.bases]\nHTTP = 19080\nDB = 16432\n"
	if err := e.SetConfig(context.Background(), me("write", "app/config"), "app", []byte(moved)); err != nil {
		t.Fatal(err)
	}
	refusedUnchanged(t, e, "app", "main", ConfigChangedDuringExecution, func() error { return claimErr(e, "app", "main", "bob") })
	kill(t, worker)
	refusedUnchanged(t, e, "app", "main", ConfigChangedDuringExecution, func() error { return claimErr(e, "app", "main", "alice") })
	q, err := ParseDrainRequest("sleep holder=alice")
	if err != nil {
		t.Fatal(err)
	}
	before := stackRecord(t, e, "app", "main")
	if err := e.ReserveDrain(context.Background(), me("write", "app/stacks/main/drain/request"), "app", "main", q, before.Revision); err != nil {
		t.Fatal(err)
	}
	r := stackRecord(t, e, "app", "main")
	if names := holderNames(r.Value); !reflect.DeepEqual(names, []string{"alice"}) || r.Value.Drain == nil || r.Value.Drain.HolderName != "alice" {
		t.Fatalf("holders %v, drain %+v, want alice's", names, r.Value.Drain)
	}
	requirePorts(t, r, map[string]int{"HTTP": 18080, "DB": 15432})
}

// ClaimObserved returns the holder exactly as its claim recorded it, in the state HolderState
// reports of it: a caller's session (live), a pid proposed (live), none (untracked); and nothing
// when the name claimed the stack already.
func TestClaimObservedIsTheRecordedHolderAndItsState(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	ctx := context.Background()
	sleeper := sessionSleeper(t)
	for name, proposed := range map[string]*Holder{
		"session": nil,
		"pid":     {PID: sleeper.Process.Pid, CheckoutPath: "/src/pid"},
		"none":    untracked("none"),
	} {
		claimed, err := e.ClaimObserved(ctx, me("create", name), "app", "main", name, proposed)
		if err != nil {
			t.Fatalf("claim %s: %v", name, err)
		}
		recorded, ok := stackRecord(t, e, "app", "main").Value.Holder(name)
		if !ok || claimed == nil || claimed.Holder != recorded {
			t.Fatalf("claim %s returned %+v; the record holds %+v", name, claimed, recorded)
		}
		if probed := e.HolderState(recorded); claimed.State != probed {
			t.Errorf("claim %s observed its holder %s; HolderState says %s", name, claimed.State, probed)
		}
		if name != "none" && claimed.State != "live" {
			t.Errorf("claim %s observed %s, want live", name, claimed.State)
		}
		again, err := e.ClaimObserved(ctx, me("create", name), "app", "main", name, proposed)
		if err != nil || again != nil {
			t.Errorf("claiming %s again = %+v, %v; want nothing added", name, again, err)
		}
	}
}

// A holder of the process a claim just observed present (the claimant's session) is taken as
// present without a second probe; any other holder of a dead process is found gone.
func TestDeadHoldersTrustWhatTheOperationObserved(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	worker := sessionSleeper(t)
	start, err := processOf(worker.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	held := []Holder{
		{HolderID: holderID("w1"), Name: "w1", PID: worker.Process.Pid, ProcessStart: start},
		{HolderID: holderID("w2"), Name: "w2", PID: worker.Process.Pid, ProcessStart: start},
	}
	kill(t, worker)
	if dead := e.deadHolders(held, "", Holder{}); len(dead) != 2 {
		t.Fatalf("dead holders %+v, want both", dead)
	}
	observed := Holder{PID: worker.Process.Pid, ProcessStart: start}
	if dead := e.deadHolders(held, "", observed); len(dead) != 0 {
		t.Fatalf("dead holders %+v, want none: the operation observed their process present", dead)
	}
	other := Holder{PID: worker.Process.Pid, ProcessStart: start + "0"}
	if dead := e.deadHolders(held, "", other); len(dead) != 2 {
		t.Fatalf("dead holders %+v, want both: another start is another process", dead)
	}
}

// A drain request naming a new holder takes over a stack whose holders are dead only where its
// uid may join: refused (PERMISSION_DENIED) and unchanged on a closed stack of another uid's, a
// reservation for it once the stack is open.
func TestTakeoverByDrainRequestFollowsTheStackMode(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "main")
	worker := sessionSleeper(t)
	claimWithPID(t, e, "app", "main", "worker", worker.Process.Pid)
	kill(t, worker)
	q, err := ParseDrainRequest("sleep holder=alice")
	if err != nil {
		t.Fatal(err)
	}
	const stranger = 1000
	request := func() error {
		return e.ReserveDrain(ctx, callerAs(stranger, "write", "app/stacks/main/drain/request"), "app", "main", q, stackRecord(t, e, "app", "main").Revision)
	}
	refusedUnchanged(t, e, "app", "main", PermissionDenied, request)
	if err := e.ChmodStack(ctx, me("chmod", "app/stacks/main"), "app", "main", 0o757); err != nil {
		t.Fatal(err)
	}
	if err := request(); err != nil {
		t.Fatal(err)
	}
	if d := stackRecord(t, e, "app", "main").Value.Drain; d == nil || d.HolderName != "alice" || d.UID != stranger {
		t.Fatalf("drain %+v, want alice's of uid %d", d, stranger)
	}
}
