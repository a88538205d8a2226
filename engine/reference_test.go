package engine

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The reference's paths past the nine compared in issue 36 (docs/fidelity.md, one section per
// reference function): each difference fixed here has its test, named after the function.

// A holder claiming again (its touch) releases the other holders proven dead first, as the
// reference's session start runs releaseDeadSessionHolders before it leases.
func TestReleaseDeadSessionHolders_TouchOfAHolderReleasesDeadCoHolders(t *testing.T) {
	e := newEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "main")
	if err := e.Claim(ctx, me("create", "app/stacks/main/holders/alice"), "app", "main", "alice", nil); err != nil {
		t.Fatal(err)
	}
	ghost := sessionSleeper(t)
	claimWithPID(t, e, "app", "main", "ghost", ghost.Process.Pid)
	kill(t, ghost)
	before := stackRecord(t, e, "app", "main")
	if err := e.Rebind(ctx, me("touch", "app/stacks/main/holders/alice"), "app", "main", "alice"); err != nil {
		t.Fatal(err)
	}
	r := stackRecord(t, e, "app", "main")
	if names := holderNames(r.Value); !reflect.DeepEqual(names, []string{"alice"}) || r.Revision != before.Revision+1 {
		t.Fatalf("after alice's touch: holders %v at revision %d (was %d), want the dead ghost released", names, r.Revision, before.Revision)
	}
	if r.Value.LastReleasedHolder == nil || *r.Value.LastReleasedHolder != holderID("ghost") {
		t.Fatalf("lastReleasedHolder %v, want ghost's id", r.Value.LastReleasedHolder)
	}
	if !r.Value.Lease.Active() || !reflect.DeepEqual(r.Value.Lease, before.Value.Lease) {
		t.Fatalf("the lease changed: %+v -> %+v", before.Value.Lease, r.Value.Lease)
	}
	if ev, want := lastEventOf(t, e, "app", "main"), fmt.Sprintf("released dead holders: ghost (process %d)", ghost.Process.Pid); ev.Warning != want || ev.Op != "touch" {
		t.Fatalf("events line %+v, want op touch with warning %q", ev, want)
	}
	// Nothing dead left: the touch changes nothing, as before.
	if err := e.Rebind(ctx, me("touch", "app/stacks/main/holders/alice"), "app", "main", "alice"); err != nil {
		t.Fatal(err)
	}
	if again := stackRecord(t, e, "app", "main"); again.Revision != r.Revision {
		t.Fatalf("a touch with nothing to release moved the revision to %d", again.Revision)
	}
}

// Every repair that records nothing is the reference's DRAIN_ATTEMPT_REPAIR_REQUIRED
// (settleInterruptedDrainRepair): termination not proven (the executor runs, or none is recorded
// and the attempt may still run), nothing active to repair, or the attempt changed since it was
// observed.
func TestSettleInterruptedDrainRepair_UnprovenTerminationIsRepairRequired(t *testing.T) {
	e, clock := newDrainEngine(t)
	mustRefuse(t, e, DrainAttemptRepairRequired, func() error { return repairStack(e) }) // no drain
	mustStep(t, e, reserveText(t, e, "sleep valid_for=1000"))
	mustRefuse(t, e, DrainAttemptRepairRequired, func() error { return repairStack(e) }) // no attempt
	executor := spawnSleeper(t)
	pid := executor.Process.Pid
	mustStep(t, e, startExecutor(e, pid))
	running := mustRefuse(t, e, DrainAttemptRepairRequired, func() error { return repairStack(e) })
	if !strings.Contains(running.Message, fmt.Sprintf("kill %d", pid)) {
		t.Fatalf("refusal %q does not name the executor", running.Message)
	}
	killProcess(t, executor)
	mustStep(t, e, repairStack(e))
	mustRefuse(t, e, DrainAttemptRepairRequired, func() error { return repairStack(e) }) // repaired already
	mustStep(t, e, startExecutor(e, 0))
	mustRefuse(t, e, DrainAttemptRepairRequired, func() error { return repairStack(e) }) // no executor, still valid
	clock.advance(1001 * time.Millisecond)
	mustStep(t, e, repairStack(e))
}

// The executor is observed before Repair's transaction; an attempt started in between is not the
// one proven gone, so the pure transition refuses it (the reference: the record changed before
// the termination could be recorded).
func TestSettleInterruptedDrainRepair_ChangedAttemptIsRepairRequired(t *testing.T) {
	e, clock := newDrainEngine(t)
	mustStep(t, e, reserveText(t, e, "sleep"))
	r := mustStep(t, e, startExecutor(e, 0))
	c := drainCaller("repair")
	clock.advance(time.Hour)
	if _, err := repairAttempt(r, c, &fakeReads{}, executorCheck{attemptID: digest("earlier"), gone: true}, clock.now()); AsRefusal(err).Code != DrainAttemptRepairRequired {
		t.Fatalf("repair of an attempt replaced since it was observed: %v", err)
	}
	v, err := repairAttempt(r, c, &fakeReads{}, executorCheck{attemptID: r.Value.Drain.Attempt.AttemptID}, clock.now())
	if err != nil || v.Drain.Attempt.Status != attemptFailed || checkRecord(r.next(v, clock.now())) != nil {
		t.Fatalf("repair of the observed attempt: %+v %v", v.Drain, err)
	}
}

// A record holding a drain stays at the revision the drain's last step committed, which the
// reference's settlement builds on (failedRevision is the settled record's revision, the
// attempt's committedRevision + 1): a chmod of the stack, which would commit a revision of its
// own in between, is refused while a drain is reserved.
func TestSettleInterruptedDrainRepair_RecordStaysAtTheAttemptsRevision(t *testing.T) {
	e, clock := newDrainEngine(t)
	mustStep(t, e, reserveText(t, e, "sleep valid_for=1"))
	r := mustStep(t, e, startExecutor(e, 0))
	mustRefuse(t, e, ClaimCoTenant, func() error {
		return e.ChmodStack(drainCtx, me("chmod", "app/stacks/s"), "app", "s", StackModeClosed|stackModeJoin)
	})
	clock.advance(time.Second)
	repaired := mustStep(t, e, repairStack(e))
	a := repaired.Value.Drain.Attempt
	if a.FailedRevision == nil || *a.FailedRevision != repaired.Revision || repaired.Revision != r.Revision+1 {
		t.Fatalf("settled at revision %d, failedRevision %v, attempt committed at %d", repaired.Revision, a.FailedRevision, a.CommittedRevision)
	}
}
