package engine

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Drains (SPEC §7): reserve, start an attempt, publish its outcome, repair an interrupted one,
// cancel an unstarted reservation. Each step is a pure transition of (record, request, now) to
// the next value; the use cases (operations.go) observe processes first, then commit one
// transition under the stack's lock (commit.go). Every step of a drain belongs to the uid of the
// drain's holder (§6).

const (
	repairCommand  = "echo terminated > drain/repair"
	repairFix      = "repair it: " + repairCommand + ", then start again"
	startFix       = "start an attempt first: echo start > drain/attempt"
	finishDrainFix = "finish the reserved drain (drain/attempt, drain/outcome) or cancel it while unstarted (rm drain/request)"
)

// reserveInput is a reservation as the transaction sees it: the request, the revision it was
// planned from, the holders observed dead before the transaction and the random identities drawn
// for it.
type reserveInput struct {
	request       DrainRequest
	caller        Caller
	expected      int64
	dead          []Holder
	mine          map[int]bool    // the caller's own processes: its own and its session's
	successor     *Holder         // the holder a request names when it is not one yet, as the caller would claim it
	groups        func() []uint32 // the caller's groups, for a successor joining (mayJoin)
	generation    string
	reservationID string
}

// reserveDrain is a drain/request write. The expected revision is checked against r as it was
// before this transaction's own dead-holder release: both happen in one commit, so the
// reservation's expectedCoordinationRevision is r.Revision and its coordinationRevision the
// revision committed. errUnchanged means the same drain is already reserved (a resume).
func reserveDrain(r Record, in reserveInput, reads stepReads, now time.Time) (Value, error) {
	q := in.request
	if q.given != nil && q.given.StackID != r.SubjectID {
		return r.Value, malformedRequest("stackId %s is not this stack's %s", q.given.StackID, r.SubjectID)
	}
	if d := r.Value.Drain; d != nil {
		return r.Value, resumeDrain(r, d, in, reads)
	}
	if in.expected != r.Revision && q.given != nil {
		// The seeds' own request: the seeds' reserveDrain answers a revision it did not issue last.
		return r.Value, refuse(ClaimCoTenant, r.SubjectID, "read record and plan again at its revision",
			"drain reservation requires the exact current coordination revision: the request names %d, the stack is at %d", in.expected, r.Revision)
	}
	if in.expected != r.Revision {
		return r.Value, refuse(ExecutionPreconditionChanged, r.SubjectID, "re-open drain/request and write again",
			"the request was planned at revision %d but the stack is now at revision %d", in.expected, r.Revision)
	}
	// A request naming a new holder takes the stack over when every holder is dead, as a claim
	// would: the drain is how a stack whose lease no claim may join is stopped.
	if in.successor != nil {
		// Taking the stack over from its dead holders is joining it.
		m, err := reads.cockpit()
		if err != nil {
			return r.Value, err
		}
		if err := mayJoin(r, m, in.successor.UID, in.groups); err != nil {
			return r.Value, err
		}
	}
	v, released := releaseDead(r.Value, in.dead, in.successor, now)
	if !v.Lease.Active() {
		return r.Value, refuse(ClaimCoTenant, r.SubjectID, "claim the stack first (touch holders/<name>)", "the stack has no active lease")
	}
	holder, err := drainRequester(r, v, q, in.caller, in.mine, reads)
	if err != nil {
		return r.Value, err
	}
	d, err := planDrain(r, v.Lease, holder, in, now)
	if err != nil {
		return r.Value, err
	}
	v.Drain = d
	reads.releasedDead(released)
	return v, nil
}

// resumeDrain accepts a request for the drain already reserved (errUnchanged), in the order the
// seeds' recovery checks it: the drain's own holder, its purpose, no attempt active (that one
// needs its outcome or a repair), planned at the current revision or the one the reservation
// was planned at, and the same work — resuming a drain that reclaims other targets would claim
// work not done.
func resumeDrain(r Record, d *Drain, in reserveInput, reads stepReads) error {
	q, c := in.request, in.caller
	if err := c.mayActOn(r, reads, "the drain of holder "+d.HolderName, d.UID); err != nil {
		return err
	}
	if id := q.requesterID(); id != "" && id != d.HolderID {
		return refuse(ClaimCoTenant, d.StackID, finishDrainFix,
			"the reserved %s drain belongs to holder %s, not %s", d.Purpose, d.HolderName, q.holderName())
	}
	if q.Purpose != d.Purpose {
		return refuse(DrainAttemptRepairRequired, d.StackID, finishDrainFix,
			"a %s drain by holder %s is already reserved (%d of %d actions done)", d.Purpose, d.HolderName, d.CompletedActionCount, len(d.Actions))
	}
	if a := d.Attempt; a != nil && a.Status == attemptActive {
		return refuse(DrainAttemptRepairRequired, d.StackID, "publish its outcome (drain/outcome), or "+repairFix,
			"attempt %s of the reserved drain is active%s; a resume cannot take it over", a.AttemptID, executorText(a))
	}
	if in.expected != r.Revision && in.expected != d.ExpectedCoordinationRevision {
		return refuse(ExecutionPreconditionChanged, d.StackID, "re-open drain/request and write again",
			"the request was planned at revision %d; the drain was reserved at revision %d and the stack is now at revision %d",
			in.expected, d.ExpectedCoordinationRevision, r.Revision)
	}
	if !q.samePlan(d) {
		return refuse(ClaimCoTenant, d.StackID, finishDrainFix,
			"the reserved %s drain does not match the request: it reclaims %v with the plan %s", d.Purpose, reclaimTargets(d), d.PlanDigest)
	}
	return errUnchanged
}

// drainRequester is the holder a request names, or the stack's only holder, which must be the
// only holder left after dead-holder release; c must be its owner or a steward of r's stack
// (Caller.mayActOn).
func drainRequester(r Record, v Value, q DrainRequest, c Caller, mine map[int]bool, reads stepReads) (Holder, error) {
	const fix = "let the other holders release their claims (or stop them), then write the request again"
	id := q.requesterID()
	if id == "" {
		switch len(v.Holders) {
		case 1:
			if err := c.mayActOn(r, reads, "holder "+v.Holders[0].Name, v.Holders[0].UID); err != nil {
				return Holder{}, err
			}
			return v.Holders[0], nil
		case 0:
			return Holder{}, refuse(ClaimCoTenant, "", "claim the stack first (touch holders/<name>)", "no live holder claims the stack")
		default:
			// The requester is unnamed; the caller's own holders are not the ones in its way.
			notMine := heldByOthers(v.Holders, mine)
			if len(notMine) == 0 {
				// Releasing every one would leave none to drain for (the last holder stays).
				names := make([]string, len(v.Holders))
				for i, h := range v.Holders {
					names[i] = h.Name
				}
				return Holder{}, refuse(ClaimCoTenant, "", "name the one the drain is for with holder=<name> and release the others (rm holders/<name>) first",
					"every holder of this stack is held by your own session (%s), and a drain is for one of them", strings.Join(names, ", "))
			}
			return Holder{}, refuse(ClaimCoTenant, "", fix+", or name yours with holder=<name>", "%s", liveHolderMessage(notMine, mine))
		}
	}
	var requester Holder
	var others []Holder
	for _, h := range v.Holders {
		if h.HolderID == id {
			requester = h
		} else {
			others = append(others, h)
		}
	}
	if g := q.given; g != nil && (requester.HolderID == "" || g.RequesterID != g.HolderID) {
		// The seeds' reserveDrain refuses a request whose holder is not the stack's one holder, or
		// whose requester is not that holder, as one: the requester must own what it drains.
		return Holder{}, refuse(ClaimCoTenant, r.SubjectID, "name the stack's one holder as both holderId and requesterId",
			"drain reservation requires retained holder and lease ownership: holder %s, requester %s", g.HolderID, g.RequesterID)
	}
	if requester.HolderID == "" {
		name := q.Holder
		if name == "" {
			name = id
		}
		return Holder{}, refuse(NotFound, id, "name a holder listed in holders/", "holder %s does not claim this stack", name)
	}
	// Whose the drain would be comes before who is in its way: the others' pids are not the
	// caller's to end when the holder is not the caller's to drain for.
	if err := c.mayActOn(r, reads, "holder "+requester.Name, requester.UID); err != nil {
		return Holder{}, err
	}
	if len(others) > 0 {
		return Holder{}, refuse(ClaimCoTenant, id, fix, "%s", liveHolderMessage(others, mine))
	}
	return requester, nil
}

// heldByOthers is holders but those held by one of the caller's own processes.
func heldByOthers(holders []Holder, mine map[int]bool) []Holder {
	var out []Holder
	for _, h := range holders {
		if h.PID == 0 || !mine[h.PID] {
			out = append(out, h)
		}
	}
	return out
}

// planDrain derives the reservation: runtime-stop of the stack, then one committed reclaim per
// other target in sorted order. A JSON request states its own plan, kept as given when it is in
// that order (the seeds' validDrainActions): each action its own validForMs, each reclaim its own
// commitment, a canonical JSON body and its sha256.
func planDrain(r Record, lease *Lease, holder Holder, in reserveInput, now time.Time) (*Drain, error) {
	q := in.request
	stackID := r.SubjectID
	var targets []string
	var actions []drainAction
	if g := q.given; g != nil {
		if err := checkTargets(g.TargetIDs); err != nil {
			return nil, malformedRequest("targetIds: %v", err)
		}
		if err := checkActions(q.Purpose, stackID, g.TargetIDs, g.Actions); err != nil {
			return nil, malformedRequest("actions: %v", err)
		}
		targets, actions = g.TargetIDs, g.Actions
	} else {
		reclaim := sortedCopy(q.Targets)
		validFor := q.validForMs()
		actions = []drainAction{{Stage: stageRuntimeStop, TargetID: stackID, ValidForMs: validFor}}
		for _, t := range reclaim {
			if t == stackID {
				return nil, malformedRequest("target %s is the stack itself, which every drain stops first", t)
			}
			actions = append(actions, drainAction{Stage: stageReclaim, TargetID: t, ValidForMs: validFor, TargetCommitment: commitTo(stackID, t)})
		}
		targets = sortedCopy(append([]string{stackID}, reclaim...))
	}
	d := &Drain{
		drainPlan: drainPlan{
			Purpose:                      q.Purpose,
			StackID:                      stackID,
			HolderID:                     holder.HolderID,
			RequesterID:                  holder.HolderID,
			ConfigSha256:                 orDerived(q.ConfigSha256, lease.Declaration.SHA256),
			PlanDigest:                   orDerived(q.PlanDigest, func() string { return digest(canonicalJSON(actions)) }),
			OperationBasis:               orDerived(q.OperationBasis, func() string { return digest(canonicalJSON(r)) }),
			Generation:                   orDerived(q.Generation, func() string { return in.generation }),
			TargetIDs:                    targets,
			Actions:                      actions,
			ExpectedCoordinationRevision: r.Revision,
		},
		CoordinationRevision: r.Revision + 1,
		ProgressRevision:     r.Revision + 1,
		ReservedAt:           r.stampAfter(now),
		ReservationID:        in.reservationID,
		HolderName:           holder.Name,
		UID:                  holder.UID,
	}
	return d, nil
}

func orDerived(given string, derive func() string) string {
	if given != "" {
		return given
	}
	return derive()
}

// commitTo binds a reclaim to its target: the canonical JSON body naming it and its sha256.
func commitTo(stackID, target string) *reclaimCommitment {
	body := canonicalJSON(map[string]string{"stackId": stackID, "target": target})
	return &reclaimCommitment{Format: commitmentFormat, Sha256: digest(body), Body: body}
}

// canonicalJSON renders v with every object's keys sorted: encoding/json sorts map keys, so a
// round trip through generic values (numbers kept exact) canonicalises struct fields too.
func canonicalJSON(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("engine: marshal %T: %v", v, err)) // records and plans are plain data
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		panic(fmt.Sprintf("engine: re-read %T: %v", v, err))
	}
	out, _ := json.Marshal(generic)
	return string(out)
}

// sortedCopy orders targets as the seeds' JavaScript sorts them (UTF-16 code units), so a plan
// a caller built there is the order it is checked in here.
func sortedCopy(s []string) []string {
	out := append([]string{}, s...)
	sort.Slice(out, func(i, j int) bool { return lessUTF16(out[i], out[j]) })
	return out
}

func reclaimTargets(d *Drain) []string {
	out := []string{}
	for _, a := range d.Actions[1:] {
		out = append(out, a.TargetID)
	}
	return out
}

func randomHex() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails; it aborts the program instead
	return hex.EncodeToString(b[:])
}

// ownDrain returns the stack's drain when c may act on it: its holder's uid, root, or a steward
// of the stack (Caller.mayActOn).
func ownDrain(r Record, c Caller, reads stepReads, missing error) (*Drain, error) {
	d := r.Value.Drain
	if d == nil {
		return nil, missing
	}
	if err := c.mayActOn(r, reads, "the drain of holder "+d.HolderName, d.UID); err != nil {
		return nil, err
	}
	return d, nil
}

func noDrain(r Record) error {
	return refuse(NotFound, r.SubjectID, "reserve one first: echo sleep > drain/request", "no drain is reserved on stack %s", r.Stack)
}

func noActiveAttempt(r Record, what string) error {
	return refuse(ExecutionPreconditionChanged, r.SubjectID, startFix, "no attempt is active on stack %s to %s", r.Stack, what)
}

// cancelDrain removes a reservation no attempt has started; a failed attempt counts as started.
func cancelDrain(r Record, c Caller, reads stepReads) (Value, error) {
	d, err := ownDrain(r, c, reads, noDrain(r))
	if err != nil {
		return r.Value, err
	}
	if d.Attempt != nil || d.CompletedActionCount > 0 {
		return r.Value, refuse(ClaimCoTenant, r.SubjectID, "finish it: echo start > drain/attempt, then publish its outcome",
			"the %s drain has started (%d of %d actions done) and cannot be cancelled", d.Purpose, d.CompletedActionCount, len(d.Actions))
	}
	v := r.Value
	v.Drain = nil
	return v, nil
}

// executor is the process an attempt names as running it; pid 0 is none.
type executor struct {
	pid   int
	start string
}

// startAttempt commits an attempt of the next action: its first try, or a retry after a failure.
func startAttempt(r Record, c Caller, reads stepReads, ex executor, attemptID string, now time.Time) (Value, error) {
	d, err := ownDrain(r, c, reads, noDrain(r))
	if err != nil {
		return r.Value, err
	}
	if a := d.Attempt; a != nil && a.Status == attemptActive {
		return r.Value, refuse(ClaimCoTenant, r.SubjectID, "publish its outcome (drain/outcome) or repair it ("+repairCommand+")",
			"attempt %s is already active%s", a.AttemptID, executorText(a))
	}
	if err := inOrder(r, now); err != nil {
		return r.Value, err
	}
	action := d.Actions[d.CompletedActionCount]
	committed := now.Truncate(time.Millisecond)
	next := *d
	next.Attempt = &Attempt{
		AttemptID:     attemptID,
		ReservationID: d.ReservationID,
		Purpose:       d.Purpose,
		TargetIDs:     d.TargetIDs,
		Generation:    d.Generation,
		ActionIndex:   d.CompletedActionCount,
		CurrentTarget: action.TargetID,
		CurrentStage:  action.Stage,
		// With no attempt or a failed one, the record is at the drain's last step (progress or
		// failure), so this is the revision the commit produces.
		CommittedRevision: d.boundaryRevision() + 1,
		CommittedAt:       stamp(committed),
		ValidThrough:      stamp(committed.Add(time.Duration(action.ValidForMs) * time.Millisecond)),
		Status:            attemptActive,
		ExecutorPID:       ex.pid,
		ExecutorStart:     ex.start,
	}
	if action.Stage == stageReclaim {
		next.Attempt.Planning = &attemptPlanning{UpdatedAt: r.UpdatedAt, Attempt: d.Attempt}
	}
	v := r.Value
	v.Drain = &next
	return v, nil
}

func executorText(a *Attempt) string {
	if a.ExecutorPID == 0 {
		return " (no executor process recorded)"
	}
	return fmt.Sprintf(" (executor process %d)", a.ExecutorPID)
}

// inOrder refuses a drain step the clock would date before the stack's last step, as the seeds
// do: a retry before the failure it retries, an outcome before its attempt started. Clamping the
// stamp instead would record a step at a time it did not happen.
func inOrder(r Record, now time.Time) error {
	if at := stamp(now); at < r.UpdatedAt {
		return refuse(ExecutionPreconditionChanged, r.SubjectID, "correct the system clock, or wait until it passes "+r.UpdatedAt+", then retry",
			"the clock reads %s, before the stack's last step at %s: a drain step never precedes the step it follows", at, r.UpdatedAt)
	}
	return nil
}

// activeAttempt returns the active attempt c may publish to; attemptID "" names whichever is active.
func activeAttempt(r Record, c Caller, reads stepReads, attemptID, what string) (*Drain, *Attempt, error) {
	d, err := ownDrain(r, c, reads, noActiveAttempt(r, what))
	if err != nil {
		return nil, nil, err
	}
	a := d.Attempt
	if a == nil || a.Status != attemptActive {
		return nil, nil, noActiveAttempt(r, what)
	}
	if attemptID != "" && attemptID != a.AttemptID {
		return nil, nil, refuse(ExecutionPreconditionChanged, r.SubjectID, "read drain/attempt for the active attempt",
			"attempt %s is not the active attempt %s", attemptID, a.AttemptID)
	}
	return d, a, nil
}

// publishOutcome is a drain/outcome write (the seeds' reduceDrainOutcome).
func publishOutcome(r Record, c Caller, reads stepReads, o Outcome, now time.Time) (Value, error) {
	if o.Planned != nil && r.Value.Drain != nil && c.mayActOn(r, reads, "", r.Value.Drain.UID) == nil && continues(r, *o.Planned, o) {
		return r.Value, errUnchanged // published already: a write repeated after a lost answer
	}
	d, a, err := activeAttempt(r, c, reads, o.AttemptID, "publish an outcome for")
	if err != nil {
		return r.Value, err
	}
	if o.Planned != nil {
		if err := plannedFrom(r, a, *o.Planned); err != nil {
			return r.Value, err
		}
	}
	if err := inOrder(r, now); err != nil {
		return r.Value, err
	}
	if !o.Success {
		return failAttempt(r.Value, d, now), nil
	}
	validThrough, _ := ParseStamp(a.ValidThrough)
	if now.Truncate(time.Millisecond).After(validThrough) {
		// Its executor, still running, may not repair it (repairAttempt): failure it may publish.
		return r.Value, refuse(ExecutionPreconditionChanged, r.SubjectID, "publish failure instead (echo failure > drain/outcome), then start again; or, once its executor is gone, "+repairFix,
			"attempt %s was valid through %s; its success arrived at %s, too late to trust", a.AttemptID, a.ValidThrough, stamp(now))
	}
	if a.ActionIndex < len(d.Actions)-1 {
		next := *d
		next.CompletedActionCount++
		next.ProgressRevision = a.CommittedRevision + 1
		next.Attempt = nil
		v := r.Value
		v.Drain = &next
		return v, nil
	}
	// The last action: the drain ends and the stack is released with its ports.
	lease := *r.Value.Lease
	lease.Released = true
	holderID := d.HolderID
	return Value{Holders: []Holder{}, Lease: &lease, LastReleasedHolder: &holderID}, nil
}

// plannedFrom refuses an outcome whose executor acted on another record than the one the active
// reclaim a was planned from: the seeds bind a reclaim step to its planning record
// (reclaimDrainStep), so a plan never runs under another try.
func plannedFrom(r Record, a *Attempt, planned int64) error {
	p, ok := r.PlanningRecord()
	if !ok {
		return refuse(LifecycleEvidenceInvalid, r.SubjectID, "publish without planned=: only a reclaim's outcome names its planning record",
			"attempt %s (%s of %s) has no planning record, yet the outcome names revision %d as one", a.AttemptID, a.CurrentStage, a.CurrentTarget, planned)
	}
	if p.Revision != planned {
		return refuse(LifecycleEvidenceInvalid, r.SubjectID, fmt.Sprintf("act on the record drain/planning serves (revision %d), then publish with planned=%d", p.Revision, p.Revision),
			"revision %d is not the record attempt %s was planned from (revision %d)", planned, a.AttemptID, p.Revision)
	}
	return nil
}

// continues says r is the record the outcome o of the reclaim planned from revision planned
// published, as the seeds' matchReclaimDrainContinuation matches it: the progress that reclaim's
// success made (not its last one, which ends the drain), or the failure it recorded. Only one
// attempt is ever planned from a revision (it commits the next one), so planned names the step.
func continues(r Record, planned int64, o Outcome) bool {
	d := r.Value.Drain
	published := planned + 2 // the attempt commits planned+1, its outcome planned+2
	if r.Revision != published {
		return false
	}
	if o.Success {
		i := d.CompletedActionCount - 1
		return d.Attempt == nil && d.ProgressRevision == published && i >= 0 && d.Actions[i].Stage == stageReclaim
	}
	a := d.Attempt
	return a != nil && a.Status == attemptFailed && a.CurrentStage == stageReclaim && a.FailedRevision != nil &&
		*a.FailedRevision == published && a.CommittedRevision == planned+1 && (o.AttemptID == "" || o.AttemptID == a.AttemptID)
}

// PlanningRecord is the record the stack's active reclaim attempt was planned from, as the seeds'
// reclaimDrainStep binds it: the attempt's own record one revision back, which it must directly
// follow. ok is false without an active reclaim attempt, or when that record does not precede it.
func (r Record) PlanningRecord() (planning Record, ok bool) {
	d := r.Value.Drain
	if d == nil || d.Attempt == nil || d.Attempt.Planning == nil {
		return Record{}, false
	}
	a := d.Attempt
	if a.Status != attemptActive || a.CurrentStage != stageReclaim || a.ActionIndex >= len(d.Actions) ||
		d.Actions[a.ActionIndex].Stage != stageReclaim || d.Actions[a.ActionIndex].TargetID != a.CurrentTarget ||
		r.Revision != a.CommittedRevision {
		return Record{}, false
	}
	planning = r
	planning.Revision = a.CommittedRevision - 1
	planning.UpdatedAt = a.Planning.UpdatedAt
	drain := *d
	drain.Attempt = a.Planning.Attempt
	planning.Value.Drain = &drain
	return planning, planningPrecedes(&drain, a, planning.Revision) == nil
}

// planningPrecedes says why the drain d of a planning record at revision does not directly
// precede attempt a (the seeds' planningRecordPrecedesAttempt), nil when it does: a first try
// follows the drain's last progress, a retry the published failure of the same action.
func planningPrecedes(d *Drain, a *Attempt, revision int64) error {
	if a.Planning.UpdatedAt > a.CommittedAt || !isStamp(a.Planning.UpdatedAt) {
		return errors.New("the planning record is dated after the attempt")
	}
	f := d.Attempt
	if f == nil {
		if revision != d.ProgressRevision {
			return errors.New("a first try's planning record is not the drain's last progress")
		}
		return nil
	}
	switch {
	case f.Status != attemptFailed || f.FailedRevision == nil || *f.FailedRevision != revision || f.Planning != nil:
		return errors.New("a retry's planning record does not hold the published failure it retries")
	case f.ActionIndex != a.ActionIndex || f.CurrentStage != a.CurrentStage || f.CurrentTarget != a.CurrentTarget ||
		f.ReservationID != a.ReservationID || f.Purpose != a.Purpose || f.Generation != a.Generation || !equalStrings(f.TargetIDs, a.TargetIDs):
		return errors.New("a retry's planning record failed another action")
	}
	return nil
}

// failAttempt records d's active attempt as failed in the next revision. A failed attempt keeps
// no planning: its retry plans from the failure.
func failAttempt(v Value, d *Drain, now time.Time) Value {
	failed := *d.Attempt
	failed.Planning = nil
	failedRevision := failed.CommittedRevision + 1
	failedAt := stamp(now)
	failed.Status, failed.FailedRevision, failed.FailedAt = attemptFailed, &failedRevision, &failedAt
	next := *d
	next.Attempt = &failed
	v.Drain = &next
	return v
}

// executorCheck is what Repair observed before its transaction: the attempt it looked at and
// whether that attempt's executor is proven gone.
type executorCheck struct {
	attemptID string
	gone      bool
}

// repairAttempt records an interrupted attempt as failed once its executor is proven gone, or,
// with no executor recorded, once the attempt's validity has passed. A repair that records
// nothing is DRAIN_ATTEMPT_REPAIR_REQUIRED, as every such answer of the seeds'
// settleInterruptedDrainRepair is: the repair is still owed.
func repairAttempt(r Record, c Caller, reads stepReads, seen executorCheck, now time.Time) (Value, error) {
	d, a, err := activeAttempt(r, c, reads, "", "repair")
	if err != nil {
		if rf := AsRefusal(err); rf.Code == ExecutionPreconditionChanged {
			return r.Value, refuse(DrainAttemptRepairRequired, rf.Target, "nothing to repair: read drain/attempt", "%s", rf.Message)
		}
		return r.Value, err
	}
	if a.AttemptID != seen.attemptID {
		return r.Value, refuse(DrainAttemptRepairRequired, r.SubjectID, "write terminated again", "attempt %s replaced the one observed", a.AttemptID)
	}
	if err := inOrder(r, now); err != nil {
		return r.Value, err
	}
	if a.ExecutorPID != 0 && !seen.gone && a.ExecutorPID == c.PID {
		// The writer is the executor itself (a shell that wrote `start`, then `terminated`):
		// telling it to kill its own pid would end the user's shell.
		return r.Value, refuse(DrainAttemptRepairRequired, r.SubjectID, "publish its outcome instead: echo success > drain/outcome, or echo failure > drain/outcome (the only one accepted past its validThrough), then start again",
			"executor process %d is the writer of this repair: an attempt is repaired only once its executor is gone", a.ExecutorPID)
	}
	if a.ExecutorPID != 0 && !seen.gone {
		return r.Value, refuse(DrainAttemptRepairRequired, r.SubjectID, fmt.Sprintf("let it finish and publish its outcome, or stop it with `kill %d`", a.ExecutorPID),
			"executor process %d is still running; stop it with `kill %d`", a.ExecutorPID, a.ExecutorPID)
	}
	validThrough, _ := ParseStamp(a.ValidThrough)
	if a.ExecutorPID == 0 && !now.Truncate(time.Millisecond).After(validThrough) {
		return r.Value, refuse(DrainAttemptRepairRequired, r.SubjectID, "wait until "+a.ValidThrough+", or publish its outcome",
			"attempt %s records no executor, so it may still run until %s", a.AttemptID, a.ValidThrough)
	}
	return failAttempt(r.Value, d, now), nil
}

// ReclaimRecovery is what a failed reclaim leaves to recover (the seeds'
// inspectFailedReclaimRecovery): the reclaims done, the one that failed and those left, each with
// the target it committed to, valid for evidence observed after FreshAfter (the failure).
type ReclaimRecovery struct {
	Purpose      string           `json:"purpose"`
	StackID      string           `json:"stackId"`
	ConfigSha256 string           `json:"configSha256"`
	PlanDigest   string           `json:"planDigest"`
	FreshAfter   string           `json:"freshAfter"`
	Completed    []recoveryTarget `json:"completed"`
	Current      recoveryTarget   `json:"current"`
	Pending      []recoveryTarget `json:"pending"`
}

// recoveryTarget is a reclaim's target and its commitment.
type recoveryTarget struct {
	TargetID         string             `json:"targetId"`
	TargetCommitment *reclaimCommitment `json:"targetCommitment"`
}

// FailedReclaimRecovery is d's recovery when its attempt is a failed reclaim, nil otherwise.
func FailedReclaimRecovery(d *Drain) *ReclaimRecovery {
	if d == nil || d.Attempt == nil || d.Attempt.Status != attemptFailed || d.Attempt.CurrentStage != stageReclaim ||
		d.Attempt.FailedAt == nil || d.Attempt.ActionIndex < 1 || d.Attempt.ActionIndex >= len(d.Actions) {
		return nil
	}
	target := func(a drainAction) recoveryTarget {
		return recoveryTarget{TargetID: a.TargetID, TargetCommitment: a.TargetCommitment}
	}
	rec := &ReclaimRecovery{
		Purpose: d.Purpose, StackID: d.StackID, ConfigSha256: d.ConfigSha256, PlanDigest: d.PlanDigest,
		FreshAfter: *d.Attempt.FailedAt, Completed: []recoveryTarget{}, Pending: []recoveryTarget{},
		Current: target(d.Actions[d.Attempt.ActionIndex]),
	}
	for i, a := range d.Actions[1:] {
		switch {
		case i+1 < d.Attempt.ActionIndex:
			rec.Completed = append(rec.Completed, target(a))
		case i+1 > d.Attempt.ActionIndex:
			rec.Pending = append(rec.Pending, target(a))
		}
	}
	return rec
}

// liveHolderMessage names the other holders and how to end them (the seeds' liveHolderMessage).
// A holder held by one of the caller's own processes (mine) is to be released, never killed:
// `kill` there would end the caller's own shell.
func liveHolderMessage(others []Holder, mine map[int]bool) string {
	var names, pids, own []string
	seen := map[int]bool{}
	for _, h := range others {
		switch {
		case h.PID == 0:
			names = append(names, h.Name)
		case mine[h.PID]:
			names = append(names, h.Name+" (held by your own session)")
			own = append(own, "rm holders/"+h.Name)
		default:
			names = append(names, fmt.Sprintf("%s (process %d)", h.Name, h.PID))
			if !seen[h.PID] {
				seen[h.PID] = true
				pids = append(pids, fmt.Sprint(h.PID))
			}
		}
	}
	msg := fmt.Sprintf("another holder claims this stack (%s), and a drain never displaces a running session; ", strings.Join(names, ", "))
	var ways []string
	if len(own) > 0 {
		ways = append(ways, "release yours with `"+strings.Join(own, "; ")+"`")
	}
	if len(pids) > 0 {
		ways = append(ways, fmt.Sprintf("let its command finish or stop it with `kill %s`", strings.Join(pids, " ")))
	}
	if len(ways) == 0 {
		ways = append(ways, "let it release its claim (rm holders/<name>)")
	}
	return msg + strings.Join(ways, ", and ") + ", then retry"
}
