package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// testClock is the engine's clock in drain tests, so validity windows pass exactly when told.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newDrainEngine is cockpit app with stacks s and t, holder "me" (untracked) claiming s.
func newDrainEngine(t *testing.T) (*Engine, *testClock) {
	t.Helper()
	e := newEngine(t)
	clock := &testClock{t: time.Date(2030, 1, 2, 3, 4, 5, 6_000_000, time.UTC)}
	e.now = clock.now
	newCockpit(t, e, "app", exampleConfig, "s", "t")
	claimStack(t, e, "s", "me", untracked("me"))
	return e, clock
}

func claimStack(t *testing.T, e *Engine, stack, holder string, proposed *Holder) {
	t.Helper()
	if err := e.Claim(context.Background(), me("create", "app/stacks/"+stack+"/holders/"+holder), "app", stack, holder, proposed); err != nil {
		t.Fatalf("claim %s/%s: %v", stack, holder, err)
	}
}

// stackS reads stack s and asserts its invariants.
func stackOf(t *testing.T, e *Engine) Record {
	t.Helper()
	r, err := e.Stack("app", "s")
	if err != nil {
		t.Fatal(err)
	}
	if err := checkRecord(r); err != nil {
		t.Fatalf("record breaks invariants: %v", err)
	}
	return r
}

// ok asserts a step succeeded and left a valid record.
func mustStep(t *testing.T, e *Engine, err error) Record {
	t.Helper()
	if err != nil {
		t.Fatalf("step refused: %v", err)
	}
	return stackOf(t, e)
}

// refused asserts op is refused with code and leaves stack s exactly as it was.
func mustRefuse(t *testing.T, e *Engine, code Code, op func() error) *Refusal {
	t.Helper()
	before, _ := json.Marshal(stackOf(t, e))
	err := op()
	if err == nil {
		t.Fatalf("expected %s, got success", code)
	}
	r := AsRefusal(err)
	if r.Code != code {
		t.Fatalf("expected %s, got %v", code, err)
	}
	if after, _ := json.Marshal(stackOf(t, e)); string(after) != string(before) {
		t.Fatalf("refusal changed the record:\nbefore %s\nafter  %s", before, after)
	}
	return r
}

var drainCtx = context.Background()

func drainCaller(file string) Caller { return me("write", "app/stacks/s/drain/"+file) }

// request parses text and reserves it on stack s as opened at the current revision.
func reserveText(t *testing.T, e *Engine, text string) error {
	t.Helper()
	q, err := ParseDrainRequest(text)
	if err != nil {
		t.Fatalf("parse %q: %v", text, err)
	}
	return e.ReserveDrain(drainCtx, drainCaller("request"), "app", "s", q, stackOf(t, e).Revision)
}

func startExecutor(e *Engine, pid int) error {
	return e.StartAttempt(drainCtx, drainCaller("attempt"), "app", "s", pid)
}

func publish(e *Engine, success bool, id string) error {
	return e.PublishOutcome(drainCtx, drainCaller("outcome"), "app", "s", Outcome{Success: success, AttemptID: id})
}

func repairStack(e *Engine) error { return e.Repair(drainCtx, drainCaller("repair"), "app", "s") }

func cancelStack(e *Engine) error { return e.CancelDrain(drainCtx, drainCaller("request"), "app", "s") }

// spawnSleep starts a process the test can kill; it is killed at cleanup either way.
func spawnSleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func killProcess(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

func assertReleased(t *testing.T, e *Engine, r Record) {
	t.Helper()
	v := r.Value
	if len(v.Holders) != 0 || v.Lease == nil || !v.Lease.Released || v.Drain != nil ||
		v.LastReleasedHolder == nil || *v.LastReleasedHolder != holderID("me") {
		t.Fatalf("drain did not release the stack: %+v", v)
	}
	ports, err := e.Ports()
	if err != nil || len(ports) != 0 {
		t.Fatalf("ports still indexed after the drain: %v %v", ports, err)
	}
}

func TestDrainSleepCompletes(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t)
	before := stackOf(t, e)
	r := mustStep(t, e, reserveText(t, e, "sleep"))
	d := r.Value.Drain
	if r.Revision != before.Revision+1 || d.ExpectedCoordinationRevision != before.Revision ||
		d.CoordinationRevision != r.Revision || d.ProgressRevision != r.Revision || d.CompletedActionCount != 0 {
		t.Fatalf("revisions: record %d, drain %+v", r.Revision, d)
	}
	if d.Purpose != "sleep" || !equalStrings(d.TargetIDs, []string{r.SubjectID}) || len(d.Actions) != 1 ||
		d.Actions[0] != (drainAction{Stage: stageRuntimeStop, TargetID: r.SubjectID, ValidForMs: 120000}) {
		t.Fatalf("plan: %+v", d)
	}
	if d.ConfigSha256 != before.Value.Lease.Declaration.SHA256() || d.PlanDigest != digest(canonicalJSON(d.Actions)) ||
		d.OperationBasis != digest(canonicalJSON(before)) || d.Generation == d.ReservationID {
		t.Fatalf("derived digests: %+v", d)
	}
	if d.HolderName != "me" || d.HolderID != holderID("me") || d.UID != uint32(os.Getuid()) || d.ReservedAt != r.UpdatedAt {
		t.Fatalf("holder: %+v", d)
	}

	r = mustStep(t, e, startExecutor(e, -1))
	a := r.Value.Drain.Attempt
	if a.ExecutorPID != os.Getpid() || a.ExecutorStart == "" || a.CommittedRevision != r.Revision || a.Status != attemptActive {
		t.Fatalf("attempt: %+v", a)
	}
	committed, _ := ParseStamp(a.CommittedAt)
	if valid, _ := ParseStamp(a.ValidThrough); valid.Sub(committed) != 120*time.Second {
		t.Fatalf("validThrough %s is not committedAt %s + 120s", a.ValidThrough, a.CommittedAt)
	}
	if ports, _ := e.Ports(); len(ports) != 2 {
		t.Fatalf("ports before the drain ends: %v", ports)
	}
	r = mustStep(t, e, publish(e, true, ""))
	assertReleased(t, e, r)
	events, _ := e.events("app", "s")
	if !strings.Contains(string(events), fmt.Sprintf(`"result":"ok","revision":%d`, r.Revision)) {
		t.Fatalf("no events line for the final step:\n%s", events)
	}

	// The family is free for the next stack of the cockpit.
	claimStack(t, e, "t", "you", untracked("you"))
	if next, _ := e.Stack("app", "t"); next.Value.Lease.Offset != 0 {
		t.Fatalf("stack t leased offset %d, want 0", next.Value.Lease.Offset)
	}
}

func TestDrainDownWithFailureAndRetry(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t)
	r := mustStep(t, e, reserveText(t, e, "down volume:db volume:cache valid_for=60000"))
	d := r.Value.Drain
	if want := []string{r.SubjectID, "volume:cache", "volume:db"}; !equalStrings(d.TargetIDs, want) {
		t.Fatalf("targets %v, want %v", d.TargetIDs, want)
	}
	for i, target := range []string{r.SubjectID, "volume:cache", "volume:db"} {
		if d.Actions[i].TargetID != target || d.Actions[i].ValidForMs != 60000 {
			t.Fatalf("action %d: %+v", i, d.Actions[i])
		}
	}
	if c := d.Actions[1].TargetCommitment; c.Body != `{"stackId":"`+r.SubjectID+`","target":"volume:cache"}` || c.Sha256 != digest(c.Body) {
		t.Fatalf("commitment: %+v", c)
	}

	r = mustStep(t, e, startExecutor(e, 0))
	first := r.Value.Drain.Attempt
	if first.ExecutorPID != 0 || first.CurrentStage != stageRuntimeStop {
		t.Fatalf("first attempt: %+v", first)
	}
	r = mustStep(t, e, publish(e, true, first.AttemptID))
	if d := r.Value.Drain; d.CompletedActionCount != 1 || d.ProgressRevision != first.CommittedRevision+1 || d.Attempt != nil {
		t.Fatalf("after the runtime stop: %+v", d)
	}

	r = mustStep(t, e, startExecutor(e, 0))
	second := r.Value.Drain.Attempt
	r = mustStep(t, e, publish(e, false, ""))
	failed := r.Value.Drain.Attempt
	if failed.Status != attemptFailed || *failed.FailedRevision != second.CommittedRevision+1 || *failed.FailedAt != r.UpdatedAt {
		t.Fatalf("failed attempt: %+v", failed)
	}
	mustRefuse(t, e, ExecutionPreconditionChanged, func() error { return publish(e, true, "") })

	r = mustStep(t, e, startExecutor(e, 0))
	retry := r.Value.Drain.Attempt
	if retry.ActionIndex != 1 || retry.CurrentTarget != "volume:cache" || retry.CommittedRevision != *failed.FailedRevision+1 || retry.AttemptID == second.AttemptID {
		t.Fatalf("retry: %+v", retry)
	}
	mustRefuse(t, e, ExecutionPreconditionChanged, func() error { return publish(e, true, second.AttemptID) })
	mustStep(t, e, publish(e, true, retry.AttemptID))
	r = mustStep(t, e, startExecutor(e, 0))
	if r.Value.Drain.Attempt.CurrentTarget != "volume:db" {
		t.Fatalf("last attempt: %+v", r.Value.Drain.Attempt)
	}
	assertReleased(t, e, mustStep(t, e, publish(e, true, "")))
}

func TestDrainLateSuccessThenRepairOfKilledExecutor(t *testing.T) {
	t.Parallel()
	e, clock := newDrainEngine(t)
	executor := spawnSleeper(t)
	pid := executor.Process.Pid
	mustStep(t, e, reserveText(t, e, "sleep valid_for=1"))
	r := mustStep(t, e, startExecutor(e, pid))
	if a := r.Value.Drain.Attempt; a.ExecutorPID != pid || a.ExecutorStart == "" {
		t.Fatalf("executor not recorded: %+v", a)
	}
	clock.advance(5 * time.Millisecond)
	late := mustRefuse(t, e, ExecutionPreconditionChanged, func() error { return publish(e, true, "") })
	if !strings.Contains(late.Fix, "drain/repair") {
		t.Fatalf("late success fix %q does not name the repair", late.Fix)
	}
	busy := mustRefuse(t, e, DrainAttemptRepairRequired, func() error { return repairStack(e) })
	if !strings.Contains(busy.Message, fmt.Sprintf("kill %d", pid)) {
		t.Fatalf("repair refusal %q does not name the executor", busy.Message)
	}
	killProcess(t, executor)
	r = mustStep(t, e, repairStack(e))
	if a := r.Value.Drain.Attempt; a.Status != attemptFailed {
		t.Fatalf("repair did not fail the attempt: %+v", a)
	}
	mustRefuse(t, e, DrainAttemptRepairRequired, func() error { return repairStack(e) })
	mustStep(t, e, startExecutor(e, 0))
	assertReleased(t, e, mustStep(t, e, publish(e, true, "")))
}

// A shell that wrote `start` and then `terminated` is told to publish the outcome, not to kill
// its own pid.
func TestDrainRepairByItsOwnExecutor(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t)
	mustStep(t, e, reserveText(t, e, "sleep"))
	mustStep(t, e, startExecutor(e, os.Getpid()))
	self := mustRefuse(t, e, DrainAttemptRepairRequired, func() error { return repairStack(e) })
	if strings.Contains(self.Message+self.Fix, "kill") || !strings.Contains(self.Fix, "drain/outcome") {
		t.Fatalf("repair by the executor itself: %q, fix %q", self.Message, self.Fix)
	}
	assertReleased(t, e, mustStep(t, e, publish(e, true, "")))
}

func TestDrainRepairWithoutExecutorWaitsForValidity(t *testing.T) {
	t.Parallel()
	e, clock := newDrainEngine(t)
	mustStep(t, e, reserveText(t, e, "sleep valid_for=1000"))
	mustStep(t, e, startExecutor(e, 0))
	mustRefuse(t, e, DrainAttemptRepairRequired, func() error { return repairStack(e) })
	clock.advance(1000 * time.Millisecond)
	mustRefuse(t, e, DrainAttemptRepairRequired, func() error { return repairStack(e) }) // validThrough itself is still valid
	clock.advance(time.Millisecond)
	if a := mustStep(t, e, repairStack(e)).Value.Drain.Attempt; a.Status != attemptFailed {
		t.Fatalf("attempt not failed: %+v", a)
	}
}

func TestDrainCancel(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t)
	before := mustStep(t, e, reserveText(t, e, "down volume:db"))
	r := mustStep(t, e, cancelStack(e))
	if r.Value.Drain != nil || r.Revision != before.Revision+1 || len(r.Value.Holders) != 1 || !r.Value.Lease.Active() {
		t.Fatalf("cancel: %+v", r)
	}
	mustRefuse(t, e, NotFound, func() error { return cancelStack(e) })

	mustStep(t, e, reserveText(t, e, "down volume:db"))
	mustStep(t, e, startExecutor(e, 0))
	mustRefuse(t, e, ClaimCoTenant, func() error { return cancelStack(e) })
	mustStep(t, e, publish(e, false, ""))
	mustRefuse(t, e, ClaimCoTenant, func() error { return cancelStack(e) }) // a failed attempt has started
	mustStep(t, e, startExecutor(e, 0))
	mustStep(t, e, publish(e, true, ""))
	mustRefuse(t, e, ClaimCoTenant, func() error { return cancelStack(e) }) // an action is done
}

// Resuming follows the seeds' recovery: the drain's own holder, its purpose, no attempt active,
// planned at the current revision (or the one the reservation names), and the same work.
func TestDrainResume(t *testing.T) {
	t.Parallel()
	e, clock := newDrainEngine(t)
	reserved := mustStep(t, e, reserveText(t, e, "down volume:db valid_for=60000"))
	planned := reserved.Value.Drain.ExpectedCoordinationRevision
	resumes := []string{"down volume:db", "down target=volume:db holder=me", "down volume:db valid_for=60000",
		fmt.Sprintf("down volume:db revision=%d", planned), fmt.Sprintf("down volume:db revision=%d", reserved.Revision)}
	for _, same := range resumes {
		if r := mustStep(t, e, reserveText(t, e, same)); r.Revision != reserved.Revision {
			t.Fatalf("resume %q changed the record", same)
		}
	}
	// Another holder (the seeds: "persisted drain belongs to another holder"), then another
	// purpose, then other work.
	claimOther := "down volume:db holder=other"
	mustRefuse(t, e, ClaimCoTenant, func() error { return reserveText(t, e, claimOther) })
	for _, other := range []string{"sleep", "reset volume:db"} {
		mustRefuse(t, e, DrainAttemptRepairRequired, func() error { return reserveText(t, e, other) })
	}
	for _, other := range []string{"down volume:other", "down", "down volume:db valid_for=1000"} {
		mustRefuse(t, e, ClaimCoTenant, func() error { return reserveText(t, e, other) })
	}
	// Planned from a revision that is neither the reservation's nor the current one.
	stale := fmt.Sprintf("down volume:db revision=%d", planned-1)
	mustRefuse(t, e, ExecutionPreconditionChanged, func() error { return reserveText(t, e, stale) })

	// While an attempt is active the drain needs its outcome or a repair, not a resume.
	clock.advance(time.Millisecond)
	mustStep(t, e, startExecutor(e, 0))
	mustRefuse(t, e, DrainAttemptRepairRequired, func() error { return reserveText(t, e, "down volume:db") })
	clock.advance(time.Millisecond)
	failed := mustStep(t, e, publish(e, false, ""))
	// After its failure it resumes at the current revision, no longer at the one of the start.
	mustStep(t, e, reserveText(t, e, "down volume:db"))
	startedAt := fmt.Sprintf("down volume:db revision=%d", failed.Revision-1)
	mustRefuse(t, e, ExecutionPreconditionChanged, func() error { return reserveText(t, e, startedAt) })
}

func TestDrainReleasesDeadHolderAtReservation(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t)
	gone := spawnSleeper(t)
	claimStack(t, e, "s", "other", &Holder{PID: gone.Process.Pid, CheckoutPath: "/src/other"})
	killProcess(t, gone)
	before := stackOf(t, e)
	r := mustStep(t, e, reserveText(t, e, "sleep holder=me"))
	if len(r.Value.Holders) != 1 || r.Value.Holders[0].Name != "me" || r.Revision != before.Revision+1 ||
		r.Value.Drain.ExpectedCoordinationRevision != before.Revision || *r.Value.LastReleasedHolder != holderID("other") {
		t.Fatalf("dead holder not released in the reservation: %+v", r)
	}
	if ev, want := lastEventOf(t, e, "app", "s"), fmt.Sprintf("released dead holders: other (process %d)", gone.Process.Pid); ev.Warning != want {
		t.Fatalf("the reservation's events line warns %q, want %q", ev.Warning, want)
	}
}

func TestDrainJSONRequest(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t)
	planned := mustStep(t, e, reserveText(t, e, "reset volume:db valid_for=30000")).Value.Drain
	r := mustStep(t, e, cancelStack(e))
	given := map[string]any{
		"purpose": "reset", "stackId": planned.StackID, "holderId": planned.HolderID, "requesterId": planned.RequesterID,
		"configSha256": digest("config"), "planDigest": digest("plan"), "operationBasis": digest("basis"), "generation": digest("generation"),
		"targetIds": planned.TargetIDs, "actions": planned.Actions, "expectedCoordinationRevision": r.Revision,
	}
	text := func(change func(map[string]any)) string {
		m := map[string]any{}
		for k, v := range given {
			m[k] = v
		}
		change(m)
		data, _ := json.Marshal(m)
		return string(data)
	}
	for name, change := range map[string]func(map[string]any){
		"another stack": func(m map[string]any) { m["stackId"] = StackID("app", "t") },
		"fewer actions": func(m map[string]any) { m["actions"] = planned.Actions[:1] },
		"valid for 0": func(m map[string]any) {
			a := append([]drainAction{}, planned.Actions...)
			a[1].ValidForMs = 0
			m["actions"] = a
		},
		"commitment sha256 of another body": func(m map[string]any) {
			a := append([]drainAction{}, planned.Actions...)
			c := *a[1].TargetCommitment
			c.Sha256 = digest(`{"other":1}`)
			a[1].TargetCommitment = &c
			m["actions"] = a
		},
		"commitment body not canonical": func(m map[string]any) {
			a := append([]drainAction{}, planned.Actions...)
			body := `{ "target": "volume:db" }`
			a[1].TargetCommitment = &reclaimCommitment{Format: commitmentFormat, Sha256: digest(body), Body: body}
			m["actions"] = a
		},
		"targets unsorted": func(m map[string]any) {
			m["targetIds"] = []string{planned.TargetIDs[1], planned.TargetIDs[0]}
		},
		"stack twice": func(m map[string]any) {
			m["purpose"] = "down"
			m["targetIds"] = []string{planned.StackID, planned.StackID}
		},
	} {
		t.Run(name, func(t *testing.T) {
			mustRefuse(t, e, StateRecordMalformed, func() error { return reserveText(t, e, text(change)) })
		})
	}
	d := mustStep(t, e, reserveText(t, e, text(func(map[string]any) {}))).Value.Drain
	if d.ConfigSha256 != digest("config") || d.PlanDigest != digest("plan") || d.OperationBasis != digest("basis") ||
		d.Generation != digest("generation") || canonicalJSON(d.Actions) != canonicalJSON(planned.Actions) || d.HolderName != "me" {
		t.Fatalf("JSON reservation: %+v", d)
	}
}

func TestDrainRefusals(t *testing.T) {
	t.Parallel()
	stranger := me("write", "app/stacks/s/drain/request")
	stranger.UID = 54321
	if uint32(os.Getuid()) == stranger.UID {
		stranger.UID = 54322
	}
	reserved := func(t *testing.T, e *Engine) { mustStep(t, e, reserveText(t, e, "sleep")) }
	active := func(t *testing.T, e *Engine) { reserved(t, e); mustStep(t, e, startExecutor(e, 0)) }
	nothing := func(*testing.T, *Engine) {}
	cases := []struct {
		name     string
		setup    func(*testing.T, *Engine)
		op       func(*testing.T, *Engine) error
		code     Code
		contains string
	}{
		{"stale revision=", nothing, func(t *testing.T, e *Engine) error { return reserveText(t, e, "sleep revision=0") },
			ExecutionPreconditionChanged, "planned at revision 0 but the stack is now at revision 1"},
		{"stale open", nothing, func(t *testing.T, e *Engine) error {
			return e.ReserveDrain(drainCtx, drainCaller("request"), "app", "s", DrainRequest{Purpose: "sleep"}, 0)
		}, ExecutionPreconditionChanged, "revision 1"},
		{"no lease", nothing, func(t *testing.T, e *Engine) error {
			return e.ReserveDrain(drainCtx, drainCaller("request"), "app", "t", DrainRequest{Purpose: "sleep"}, 0)
		}, ClaimCoTenant, "no active lease"},
		{"unknown holder", nothing, func(t *testing.T, e *Engine) error { return reserveText(t, e, "sleep holder=ghost") }, NotFound, "ghost"},
		{"two untracked holders", func(t *testing.T, e *Engine) { claimStack(t, e, "s", "other", untracked("other")) },
			func(t *testing.T, e *Engine) error { return reserveText(t, e, "sleep") }, ClaimCoTenant, "rm holders/<name>"},
		{"stack as target", nothing, func(t *testing.T, e *Engine) error { return reserveText(t, e, "down "+StackID("app", "s")) },
			StateRecordMalformed, "the stack itself"},
		{"reserve as stranger", nothing, func(t *testing.T, e *Engine) error {
			return e.ReserveDrain(drainCtx, stranger, "app", "s", DrainRequest{Purpose: "sleep"}, 1)
		}, PermissionDenied, ""},
		{"resume as stranger", reserved, func(t *testing.T, e *Engine) error {
			return e.ReserveDrain(drainCtx, stranger, "app", "s", DrainRequest{Purpose: "sleep"}, 2)
		}, PermissionDenied, ""},
		{"start as stranger", reserved, func(t *testing.T, e *Engine) error { return e.StartAttempt(drainCtx, stranger, "app", "s", 0) }, PermissionDenied, ""},
		{"outcome as stranger", active, func(t *testing.T, e *Engine) error {
			return e.PublishOutcome(drainCtx, stranger, "app", "s", Outcome{Success: true})
		}, PermissionDenied, ""},
		{"repair as stranger", active, func(t *testing.T, e *Engine) error { return e.Repair(drainCtx, stranger, "app", "s") }, PermissionDenied, ""},
		{"cancel as stranger", reserved, func(t *testing.T, e *Engine) error { return e.CancelDrain(drainCtx, stranger, "app", "s") }, PermissionDenied, ""},
		{"reserve for another uid's holder, one's own beside it", func(t *testing.T, e *Engine) {
			if err := e.ChmodStack(drainCtx, drainCaller("chmod"), "app", "s", 0o757); err != nil {
				t.Fatal(err)
			}
			if err := e.Claim(drainCtx, Caller{PID: os.Getpid(), UID: stranger.UID, Op: "create"}, "app", "s", "theirs", untracked("theirs")); err != nil {
				t.Fatal(err)
			}
		}, func(t *testing.T, e *Engine) error {
			r, err := e.Stack("app", "s")
			if err != nil {
				t.Fatal(err)
			}
			return e.ReserveDrain(drainCtx, stranger, "app", "s", DrainRequest{Purpose: "sleep", Holder: "me"}, r.Revision)
		}, PermissionDenied, "holder me belongs to uid"},
		{"unnamed, every holder one's own", func(t *testing.T, e *Engine) {
			claimStack(t, e, "t", "a", &Holder{PID: os.Getpid(), CheckoutPath: "/src/a"})
			claimStack(t, e, "t", "b", &Holder{PID: os.Getpid(), CheckoutPath: "/src/b"})
		}, func(t *testing.T, e *Engine) error {
			before := recordSnapshot(t, e, "app", "t")
			err := e.ReserveDrain(drainCtx, drainCaller("request"), "app", "t", DrainRequest{Purpose: "sleep"}, stackRecord(t, e, "app", "t").Revision)
			if after := recordSnapshot(t, e, "app", "t"); after != before {
				t.Fatalf("the refusal changed stack t:\nbefore %s\nafter  %s", before, after)
			}
			return err
		}, ClaimCoTenant, "name the one the drain is for with holder=<name>"},
		{"start without drain", nothing, func(t *testing.T, e *Engine) error { return startExecutor(e, 0) }, NotFound, "no drain"},
		{"outcome without drain", nothing, func(t *testing.T, e *Engine) error { return publish(e, true, "") }, ExecutionPreconditionChanged, ""},
		{"outcome before start", reserved, func(t *testing.T, e *Engine) error { return publish(e, false, "") }, ExecutionPreconditionChanged, ""},
		{"outcome of another attempt", active, func(t *testing.T, e *Engine) error { return publish(e, true, digest("x")) },
			ExecutionPreconditionChanged, digest("x")},
		{"repair without drain", nothing, func(t *testing.T, e *Engine) error { return repairStack(e) }, DrainAttemptRepairRequired, "repair"},
		{"repair before start", reserved, func(t *testing.T, e *Engine) error { return repairStack(e) }, DrainAttemptRepairRequired, "repair"},
		{"cancel without drain", nothing, func(t *testing.T, e *Engine) error { return cancelStack(e) }, NotFound, ""},
		{"start while active", active, func(t *testing.T, e *Engine) error { return startExecutor(e, 0) }, ClaimCoTenant, "already active"},
		{"start with a gone executor", reserved, func(t *testing.T, e *Engine) error {
			gone := spawnSleeper(t)
			killProcess(t, gone)
			return startExecutor(e, gone.Process.Pid)
		}, StateRecordMalformed, "does not exist"},
		{"start from an unresolved writer", reserved, func(t *testing.T, e *Engine) error {
			return e.StartAttempt(drainCtx, Caller{UID: uint32(os.Getuid())}, "app", "s", -1)
		}, StateRecordMalformed, "pid=none"},
		{"claim while draining", reserved, func(t *testing.T, e *Engine) error {
			return e.Claim(drainCtx, me("create", "holders/other"), "app", "s", "other", untracked("other"))
		}, ClaimCoTenant, ""},
		{"release while draining", reserved, func(t *testing.T, e *Engine) error {
			return e.Release(drainCtx, me("unlink", "holders/me"), "app", "s", "me")
		}, ClaimCoTenant, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, _ := newDrainEngine(t)
			tc.setup(t, e)
			r := mustRefuse(t, e, tc.code, func() error { return tc.op(t, e) })
			if !strings.Contains(r.Message+" "+r.Fix, tc.contains) {
				t.Fatalf("refusal %q does not mention %q", r, tc.contains)
			}
		})
	}
}

func TestDrainCoTenantNamesLiveHolder(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t)
	live := spawnSleeper(t)
	pid := live.Process.Pid
	claimStack(t, e, "s", "other", &Holder{PID: pid, CheckoutPath: "/src/other"})
	r := mustRefuse(t, e, ClaimCoTenant, func() error { return reserveText(t, e, "sleep holder=me") })
	if !strings.Contains(r.Message, fmt.Sprintf("other (process %d)", pid)) || !strings.Contains(r.Message, fmt.Sprintf("kill %d", pid)) {
		t.Fatalf("co-tenant refusal %q does not name process %d", r.Message, pid)
	}
}

// The seeds accept any request whose actions are in the persisted order, each with its own
// validForMs and a commitment whose sha256 matches a canonical JSON body: the reservation keeps
// them as given, and each attempt is valid for its own action's validForMs.
func TestDrainJSONRequestOwnValidityAndCommitment(t *testing.T) {
	t.Parallel()
	e, clock := newDrainEngine(t)
	r := stackOf(t, e)
	stackID, holderID := r.SubjectID, holderID("me")
	// Canonical as JSON.stringify writes it: keys sorted, "<" and "\u2028" written raw.
	body := "{\"kind\":\"volume\",\"n\":1.5,\"name\":\"db <main>\u2028\"}"
	actions := []drainAction{
		{Stage: stageRuntimeStop, TargetID: stackID, ValidForMs: 5000},
		{Stage: stageReclaim, TargetID: "volume:db", ValidForMs: 250000,
			TargetCommitment: &reclaimCommitment{Format: commitmentFormat, Sha256: digest(body), Body: body}},
	}
	request := map[string]any{
		"purpose": "down", "stackId": stackID, "holderId": holderID, "requesterId": holderID,
		"configSha256": digest("config"), "planDigest": digest("plan"), "operationBasis": digest("basis"), "generation": digest("generation"),
		"targetIds": sortedCopy([]string{stackID, "volume:db"}), "actions": actions, "expectedCoordinationRevision": r.Revision,
	}
	data, _ := json.Marshal(request)
	d := mustStep(t, e, reserveText(t, e, string(data))).Value.Drain
	if canonicalJSON(d.Actions) != canonicalJSON(actions) {
		t.Fatalf("reservation actions %s, want %s", canonicalJSON(d.Actions), canonicalJSON(actions))
	}
	for i, want := range []int64{5000, 250000} {
		a := mustStep(t, e, startExecutor(e, 0)).Value.Drain.Attempt
		committed, _ := ParseStamp(a.CommittedAt)
		valid, _ := ParseStamp(a.ValidThrough)
		if got := valid.Sub(committed).Milliseconds(); got != want {
			t.Fatalf("attempt %d valid for %d ms, want %d", i, got, want)
		}
		clock.advance(time.Millisecond)
		mustStep(t, e, publish(e, true, ""))
	}
}

// A clock stepped back never makes a drain's chronology run backwards: a retry cannot start
// before the failure it retries, an outcome cannot be published before its attempt started (the
// seeds refuse both), and no record's updatedAt goes back.
func TestDrainRefusesAClockSteppedBack(t *testing.T) {
	t.Parallel()
	e, clock := newDrainEngine(t)
	mustStep(t, e, reserveText(t, e, "down volume:db"))
	clock.advance(time.Second)
	mustStep(t, e, startExecutor(e, 0))
	clock.advance(time.Second)
	failed := mustStep(t, e, publish(e, false, "")).Value.Drain.Attempt
	failedAt, _ := ParseStamp(*failed.FailedAt)

	clock.advance(-time.Minute)
	back := mustRefuse(t, e, ExecutionPreconditionChanged, func() error { return startExecutor(e, 0) })
	if !strings.Contains(back.Message, *failed.FailedAt) {
		t.Fatalf("refusal %q does not name the failure it would precede", back.Message)
	}
	clock.advance(time.Minute)
	retry := mustStep(t, e, startExecutor(e, 0)).Value.Drain.Attempt
	if committed, _ := ParseStamp(retry.CommittedAt); committed.Before(failedAt) {
		t.Fatalf("retry committed at %s, before the failure at %s", retry.CommittedAt, *failed.FailedAt)
	}

	clock.advance(-time.Millisecond)
	mustRefuse(t, e, ExecutionPreconditionChanged, func() error { return publish(e, true, "") })
	mustRefuse(t, e, ExecutionPreconditionChanged, func() error { return publish(e, false, "") })
	mustRefuse(t, e, ExecutionPreconditionChanged, func() error { return repairStack(e) })
	clock.advance(time.Millisecond)
	mustStep(t, e, publish(e, true, ""))
}

func TestUpdatedAtNeverGoesBack(t *testing.T) {
	t.Parallel()
	e, clock := newDrainEngine(t)
	before := stackOf(t, e)
	clock.advance(-time.Hour)
	claimStack(t, e, "s", "other", untracked("other"))
	after := stackOf(t, e)
	if after.Revision != before.Revision+1 || after.UpdatedAt != before.UpdatedAt {
		t.Fatalf("updatedAt went from %s to %s at revision %d", before.UpdatedAt, after.UpdatedAt, after.Revision)
	}
	// The reservation is stamped no earlier than the record it follows.
	mustStep(t, e, e.Release(drainCtx, me("unlink", "app/stacks/s/holders/me"), "app", "s", "me"))
	d := mustStep(t, e, reserveText(t, e, "sleep holder=other")).Value.Drain
	if d.ReservedAt != after.UpdatedAt {
		t.Fatalf("reserved at %s, before the record's %s", d.ReservedAt, after.UpdatedAt)
	}
}

// The live-holder refusal names only the others: never the requester, never a process of the
// caller's own session as one to kill (the seeds name the holders other than the requester).
func TestDrainCoTenantRefusalNamesOnlyTheOthers(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t)
	live := spawnSleeper(t)
	pid, mine := live.Process.Pid, os.Getpid()
	claimStack(t, e, "s", "mine", &Holder{PID: mine, CheckoutPath: "/src/mine"})
	claimStack(t, e, "s", "other", &Holder{PID: pid, CheckoutPath: "/src/other"})
	for _, text := range []string{"sleep", "sleep holder=mine"} {
		r := mustRefuse(t, e, ClaimCoTenant, func() error { return reserveText(t, e, text) })
		if !strings.Contains(r.Message, fmt.Sprintf("kill %d`", pid)) || strings.Contains(r.Message, fmt.Sprint(mine)) {
			t.Fatalf("%q: refusal %q must say kill %d and never name the caller's process %d", text, r.Message, pid, mine)
		}
		if strings.Contains(r.Message, "mine (") {
			t.Fatalf("%q: refusal %q names the caller's own holder", text, r.Message)
		}
	}
	// Holders of the caller's own session are released by the caller, not killed.
	mustStep(t, e, e.Release(drainCtx, me("unlink", "app/stacks/s/holders/other"), "app", "s", "other"))
	r := mustRefuse(t, e, ClaimCoTenant, func() error { return reserveText(t, e, "sleep holder=me") })
	if strings.Contains(r.Message, "kill") || !strings.Contains(r.Message, "rm holders/mine") {
		t.Fatalf("refusal %q for a holder of the caller's own session", r.Message)
	}
}

// A failed reclaim names what is done, what failed and what is left, each with its committed
// target, as the seeds' inspectFailedReclaimRecovery reads them from the failure's record.
func TestFailedReclaimRecovery(t *testing.T) {
	t.Parallel()
	e, clock := newDrainEngine(t)
	mustStep(t, e, reserveText(t, e, "down volume:a volume:b volume:c"))
	for range 2 {
		clock.advance(time.Millisecond)
		mustStep(t, e, startExecutor(e, 0))
		if got := FailedReclaimRecovery(stackOf(t, e).Value.Drain); got != nil {
			t.Fatalf("recovery of an active attempt: %+v", got)
		}
		clock.advance(time.Millisecond)
		mustStep(t, e, publish(e, true, ""))
	}
	clock.advance(time.Millisecond)
	mustStep(t, e, startExecutor(e, 0))
	clock.advance(time.Millisecond)
	d := mustStep(t, e, publish(e, false, "")).Value.Drain
	got := FailedReclaimRecovery(d)
	if got == nil || got.FreshAfter != *d.Attempt.FailedAt || got.PlanDigest != d.PlanDigest || got.ConfigSha256 != d.ConfigSha256 {
		t.Fatalf("recovery %+v", got)
	}
	targets := func(ts []recoveryTarget) (out []string) {
		for _, t := range ts {
			out = append(out, t.TargetID)
		}
		return out
	}
	if c, p := targets(got.Completed), targets(got.Pending); !equalStrings(c, []string{"volume:a"}) || got.Current.TargetID != "volume:b" || !equalStrings(p, []string{"volume:c"}) {
		t.Fatalf("completed %v, current %s, pending %v", c, got.Current.TargetID, p)
	}
	if got.Current.TargetCommitment == nil || got.Current.TargetCommitment.Sha256 != d.Actions[2].TargetCommitment.Sha256 {
		t.Fatalf("current commitment %+v", got.Current.TargetCommitment)
	}
}

// A reclaim's attempt carries what its start replaced, so the record it was planned from is
// served exactly (the seeds' reclaimDrainStep): the progress before a first try, the failure
// before a retry; and Check refuses a planning that does not directly precede its attempt.
func TestDrainReclaimPlanningRecord(t *testing.T) {
	t.Parallel()
	e, clock := newDrainEngine(t)
	mustStep(t, e, reserveText(t, e, "down volume:db volume:web"))
	mustStep(t, e, startExecutor(e, 0))
	if _, ok := stackOf(t, e).PlanningRecord(); ok {
		t.Fatal("a runtime-stop has a planning record")
	}
	mustStep(t, e, publish(e, true, ""))
	for _, success := range []bool{false, true} {
		clock.advance(time.Second)
		before := stackOf(t, e)
		r := mustStep(t, e, startExecutor(e, 0))
		planning, ok := r.PlanningRecord()
		if want, _ := json.Marshal(before); !ok || string(mustJSON(t, planning)) != string(want) {
			t.Fatalf("PlanningRecord = %s (%v), want the record before the start %s", mustJSON(t, planning), ok, want)
		}
		broken := r
		d := *r.Value.Drain
		a := *d.Attempt
		p := *a.Planning
		p.UpdatedAt = stamp(clock.now().Add(time.Hour))
		a.Planning, d.Attempt, broken.Value.Drain = &p, &a, &d
		if err := checkRecord(broken); err == nil || !strings.Contains(err.Error(), "dated after the attempt") {
			t.Fatalf("Check of a planning dated after its attempt = %v", err)
		}
		if _, ok := broken.PlanningRecord(); ok {
			t.Fatal("PlanningRecord served a planning dated after its attempt")
		}
		mustRefuse(t, e, LifecycleEvidenceInvalid, func() error {
			return e.PublishOutcome(drainCtx, drainCaller("outcome"), "app", "s", Outcome{Success: success, Planned: ptr(planning.Revision + 1)})
		})
		clock.advance(time.Second)
		mustStep(t, e, e.PublishOutcome(drainCtx, drainCaller("outcome"), "app", "s", Outcome{Success: success, Planned: &planning.Revision}))
		// The same outcome again finds its publication (the seeds' matchReclaimDrainContinuation)
		// and changes nothing; the other outcome, or another planning record, does not match.
		published := mustJSON(t, stackOf(t, e))
		if err := e.PublishOutcome(drainCtx, drainCaller("outcome"), "app", "s", Outcome{Success: success, Planned: &planning.Revision}); err != nil {
			t.Fatalf("the outcome repeated: %v", err)
		}
		if again := mustJSON(t, stackOf(t, e)); string(again) != string(published) {
			t.Fatalf("the repeated outcome changed the record:\n%s\n%s", published, again)
		}
		mustRefuse(t, e, ExecutionPreconditionChanged, func() error {
			return e.PublishOutcome(drainCtx, drainCaller("outcome"), "app", "s", Outcome{Success: !success, Planned: &planning.Revision})
		})
		mustRefuse(t, e, ExecutionPreconditionChanged, func() error {
			return e.PublishOutcome(drainCtx, drainCaller("outcome"), "app", "s", Outcome{Success: success, Planned: ptr(planning.Revision - 1)})
		})
	}
}

func ptr[T any](v T) *T { return &v }

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// jsonRequest is the seeds' drain request for stack s held by "me", as change leaves it.
func jsonRequest(t *testing.T, e *Engine, change func(map[string]any)) string {
	t.Helper()
	r := stackOf(t, e)
	id := holderID("me")
	m := map[string]any{
		"purpose": "sleep", "stackId": r.SubjectID, "holderId": id, "requesterId": id,
		"configSha256": digest("config"), "planDigest": digest("plan"), "operationBasis": digest("basis"), "generation": digest("generation"),
		"targetIds":                    []string{r.SubjectID},
		"actions":                      []drainAction{{Stage: stageRuntimeStop, TargetID: r.SubjectID, ValidForMs: 1000}},
		"expectedCoordinationRevision": r.Revision,
	}
	change(m)
	data, _ := json.Marshal(m)
	return string(data)
}

// The seeds' reserveDrain answers its own request at a revision it is not at, older or never
// issued, with CLAIM_CO_TENANT: a script written against it checks that code.
func TestReserveDrainStaleRevision(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t)
	rev := stackOf(t, e).Revision
	for _, at := range []int64{rev - 1, rev + 1} {
		ref := mustRefuse(t, e, ClaimCoTenant, func() error {
			return reserveText(t, e, jsonRequest(t, e, func(m map[string]any) { m["expectedCoordinationRevision"] = at }))
		})
		if !strings.Contains(ref.Message, "requires the exact current coordination revision") {
			t.Fatalf("refusal %q does not say the seeds' reason", ref.Message)
		}
	}
}

// Targets are ordered as the seeds' JavaScript orders strings, by UTF-16 code units: U+1F600
// (0xD83D 0xDE00) sorts before U+FF01 there, after it by bytes.
func TestReserveDrainTargetOrderUTF16(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t)
	stackID := stackOf(t, e).SubjectID
	astral, high := "volume:\U0001F600x", "volume:\uFF01x"
	targets := sortedCopy([]string{stackID, high, astral})
	actions := []drainAction{{Stage: stageRuntimeStop, TargetID: stackID, ValidForMs: 1000}}
	for _, target := range targets {
		if target != stackID {
			actions = append(actions, drainAction{Stage: stageReclaim, TargetID: target, ValidForMs: 1000, TargetCommitment: commitTo(stackID, target)})
		}
	}
	if actions[1].TargetID != astral {
		t.Fatalf("reclaims in order %s, %s: want U+1F600 first, as JavaScript sorts", actions[1].TargetID, actions[2].TargetID)
	}
	d := mustStep(t, e, reserveText(t, e, jsonRequest(t, e, func(m map[string]any) {
		m["purpose"], m["targetIds"], m["actions"] = "down", targets, actions
	}))).Value.Drain
	if !equalStrings(d.TargetIDs, targets) {
		t.Fatalf("reserved targets %q, want %q", d.TargetIDs, targets)
	}
	// The text form derives the same order.
	mustStep(t, e, cancelStack(e))
	d = mustStep(t, e, reserveText(t, e, "down "+high+" "+astral)).Value.Drain
	if !equalStrings(d.TargetIDs, targets) {
		t.Fatalf("text request reserved targets %q, want %q", d.TargetIDs, targets)
	}
}

// The seeds' reserveDrain refuses with CLAIM_CO_TENANT a requester that is not the holder, and
// a holder that is not the stack's: "drain reservation requires retained holder and lease
// ownership".
func TestReserveDrainRetainedHolderOwnership(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t)
	for name, change := range map[string]func(map[string]any){
		"requester is another holder": func(m map[string]any) { m["requesterId"] = holderID("other") },
		"holder is not on the stack": func(m map[string]any) {
			m["holderId"], m["requesterId"] = holderID("ghost"), holderID("ghost")
		},
	} {
		t.Run(name, func(t *testing.T) {
			ref := mustRefuse(t, e, ClaimCoTenant, func() error { return reserveText(t, e, jsonRequest(t, e, change)) })
			if !strings.Contains(ref.Message, "requires retained holder and lease ownership") {
				t.Fatalf("refusal %q does not say the seeds' reason", ref.Message)
			}
		})
	}
}
