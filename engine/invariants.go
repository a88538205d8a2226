package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cockpitfs/cockpitfs/engine/liveness"
)

// isSHA256Hex says s is a SHA-256 in lower-case hex, as the identities below hold one. By hand,
// not by a regexp: a commit checks one at least, and a cold regexp match costs microseconds.
func isSHA256Hex(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// isHolderID says s is shaped as holderID makes one: holder:<sha256 hex>:session.
func isHolderID(s string) bool {
	rest, ok := strings.CutPrefix(s, "holder:")
	hash, ok2 := strings.CutSuffix(rest, ":session")
	return ok && ok2 && isSHA256Hex(hash)
}

// isStackID says s is shaped as StackID makes one: stack:<sha256 hex>.
func isStackID(s string) bool {
	hash, ok := strings.CutPrefix(s, "stack:")
	return ok && isSHA256Hex(hash)
}

// checkRecord reports every invariant r breaks (the seeds' coordination and drain schemas plus the
// identities of the names it carries); nil means r is a record the engine may hold.
func checkRecord(r Record) error { return check(r, Value{}) }

// check is checkRecord trusting what r keeps unchanged of checked, the value of a record that
// passed it: each holder kept as it is (checked's are sorted), and the lease when r keeps the very
// same one (a lease is never changed in place: a step makes a new one). A commit checks what it
// changes, not every holder and the declaration of the stack again.
func check(r Record, checked Value) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if r.Format != recordFormat || r.Kind != recordKind {
		bad("format/kind %q/%q is not %s/%s", r.Format, r.Kind, recordFormat, recordKind)
	}
	if !ValidCockpitName(r.Cockpit) || !ValidName(r.Stack) {
		bad("names %q/%q are invalid", r.Cockpit, r.Stack)
	}
	if r.CockpitID != cockpitID(r.Cockpit) || r.SubjectID != StackID(r.Cockpit, r.Stack) {
		bad("identities do not match the names %s/%s", r.Cockpit, r.Stack)
	}
	if r.Revision < 0 {
		bad("revision %d is negative", r.Revision)
	}
	if _, ok := ParseStamp(r.UpdatedAt); !ok {
		bad("updatedAt %q is not canonical", r.UpdatedAt)
	}
	v := r.Value
	errs = append(errs, checkHolders(v.Holders, checked.Holders)...)
	if v.Lease != nil && v.Lease != checked.Lease {
		if err := checkLease(v.Lease); err != nil {
			bad("lease: %v", err)
		}
	}
	if l := v.LastReleasedHolder; l != nil && (!isHolderID(*l) || slices.ContainsFunc(v.Holders, func(h Holder) bool { return h.HolderID == *l })) {
		bad("lastReleasedHolder %q is malformed or still a holder", *l)
	}
	if len(v.Holders) > 0 && !v.Lease.Active() {
		bad("the stack has holders but no active lease")
	}
	if len(v.Holders) == 0 && v.Lease.Active() && v.LastReleasedHolder == nil {
		bad("an active lease with no holders names no lastReleasedHolder")
	}
	if d := v.Drain; d != nil {
		if len(v.Holders) != 1 || !v.Lease.Active() || d.HolderID != d.RequesterID || v.Holders[0].HolderID != d.HolderID {
			bad("a drain needs exactly its own holder and an active lease")
		}
		if d.StackID != r.SubjectID {
			bad("drain stackId %s is not the record's", d.StackID)
		}
		if r.Revision != d.boundaryRevision() {
			bad("revision %d is not the drain's last step %d", r.Revision, d.boundaryRevision())
		}
		if err := checkDrain(d); err != nil {
			bad("drain: %v", err)
		}
	}
	return errors.Join(errs...)
}

func checkHolders(hs, checked []Holder) []error {
	var errs []error
	if len(hs) > maxHolders {
		errs = append(errs, fmt.Errorf("%d holders exceed %d", len(hs), maxHolders))
	}
	for i, h := range hs {
		for len(checked) > 0 && checked[0].HolderID < h.HolderID {
			checked = checked[1:]
		}
		if len(checked) > 0 && checked[0] == h {
			if i > 0 && hs[i-1].HolderID >= h.HolderID {
				errs = append(errs, fmt.Errorf("holders are not unique and sorted at %s", h.Name))
			}
			continue
		}
		switch {
		case !ValidName(h.Name) || h.HolderID != holderID(h.Name):
			errs = append(errs, fmt.Errorf("holder %q: identity does not match its name", h.Name))
		case h.CheckoutPath != "" && !filepath.IsAbs(h.CheckoutPath) || h.CheckoutID != checkoutID(h.CheckoutPath):
			errs = append(errs, fmt.Errorf("holder %s: checkout %q is not absolute or its identity differs", h.Name, h.CheckoutPath))
		case !isStamp(h.ClaimedAt):
			errs = append(errs, fmt.Errorf("holder %s: claimedAt %q is not canonical", h.Name, h.ClaimedAt))
		case h.PID != 0 && !liveness.ValidPID(h.PID):
			errs = append(errs, fmt.Errorf("holder %s: pid %d is out of range", h.Name, h.PID))
		case h.ProcessStart != "" && (h.PID == 0 || !liveness.IsStart(h.ProcessStart)):
			errs = append(errs, fmt.Errorf("holder %s: process start %q without a pid or malformed", h.Name, h.ProcessStart))
		case i > 0 && hs[i-1].HolderID >= h.HolderID:
			errs = append(errs, fmt.Errorf("holders are not unique and sorted at %s", h.Name))
		}
	}
	return errs
}

func checkLease(l *Lease) error {
	if err := l.Declaration.Validate(); err != nil {
		return fmt.Errorf("declaration: %w", err)
	}
	family, ok := l.Declaration.FamilyAt(l.Offset)
	if !ok || len(family.Ports) != len(l.Ports) {
		return fmt.Errorf("offset %d or its ports do not match the declaration", l.Offset)
	}
	for key, port := range l.Ports {
		if family.Ports[key] != port {
			return fmt.Errorf("port %s=%d does not match the declaration", key, port)
		}
	}
	return nil
}

func isStamp(s string) bool { _, ok := ParseStamp(s); return ok }

func checkDrain(d *Drain) error {
	switch {
	case d.Purpose != "sleep" && d.Purpose != "down" && d.Purpose != "reset":
		return fmt.Errorf("purpose %q", d.Purpose)
	case !isStackID(d.StackID) || !isHolderID(d.HolderID) || !isHolderID(d.RequesterID):
		return errors.New("identities are malformed")
	case !isSHA256Hex(d.ConfigSha256) || !isSHA256Hex(d.PlanDigest) ||
		!isSHA256Hex(d.OperationBasis) || !isSHA256Hex(d.Generation) || !isSHA256Hex(d.ReservationID):
		return errors.New("digests are malformed")
	case d.Generation == d.ReservationID:
		return errors.New("generation equals reservationId")
	case d.CoordinationRevision != d.ExpectedCoordinationRevision+1 || d.ExpectedCoordinationRevision < 0:
		return errors.New("coordinationRevision is not expectedCoordinationRevision + 1")
	case d.ProgressRevision < d.CoordinationRevision:
		return errors.New("progressRevision precedes coordinationRevision")
	case d.CompletedActionCount < 0 || d.CompletedActionCount >= len(d.Actions):
		return fmt.Errorf("completedActionCount %d is outside the %d actions", d.CompletedActionCount, len(d.Actions))
	case !isStamp(d.ReservedAt):
		return errors.New("reservedAt is not canonical")
	}
	if err := checkTargets(d.TargetIDs); err != nil {
		return err
	}
	if err := checkActions(d.Purpose, d.StackID, d.TargetIDs, d.Actions); err != nil {
		return err
	}
	if d.Attempt != nil {
		return checkAttempt(d, d.Attempt)
	}
	return nil
}

func checkTargets(targets []string) error {
	if len(targets) == 0 || len(targets) > maxHolders {
		return fmt.Errorf("%d targets", len(targets))
	}
	for i, t := range targets {
		if t == "" || len(t) > maxTargetBytes || strings.ContainsRune(t, 0) || i > 0 && !lessUTF16(targets[i-1], t) {
			return fmt.Errorf("targets are not distinct, sorted and 1-%d bytes without NUL", maxTargetBytes)
		}
	}
	return nil
}

// checkActions is the seeds' validDrainActions: the order is persisted so no executor chooses
// destructive work.
func checkActions(purpose, stackID string, targets []string, actions []drainAction) error {
	if len(actions) != len(targets) || actions[0].Stage != stageRuntimeStop || actions[0].TargetID != stackID ||
		actions[0].TargetCommitment != nil {
		return errors.New("actions must be runtime-stop of the stack, then one reclaim per other target")
	}
	var reclaim []string
	for _, t := range targets {
		if t != stackID {
			reclaim = append(reclaim, t)
		}
	}
	if len(reclaim) != len(actions)-1 {
		return errors.New("targets must include the stack once")
	}
	for i, a := range actions {
		if a.ValidForMs < 1 || a.ValidForMs > maxValidForMs {
			return fmt.Errorf("action %d: validForMs %d", i, a.ValidForMs)
		}
		if i == 0 {
			continue
		}
		if a.Stage != stageReclaim || a.TargetID != reclaim[i-1] {
			return fmt.Errorf("action %d is not the reclaim of %q", i, reclaim[i-1])
		}
		if err := checkCommitment(a.TargetCommitment); err != nil {
			return fmt.Errorf("action %d: %w", i, err)
		}
	}
	if purpose == "sleep" && len(actions) != 1 {
		return errors.New("sleep has exactly one action")
	}
	return nil
}

func checkCommitment(c *reclaimCommitment) error {
	if c == nil || c.Format != commitmentFormat || len(c.Body) < 2 || len(c.Body) > 32768 {
		return errors.New("target commitment is missing or malformed")
	}
	sum := sha256.Sum256([]byte(c.Body))
	if hex.EncodeToString(sum[:]) != c.Sha256 {
		return errors.New("target commitment sha256 does not match its body")
	}
	if !json.Valid([]byte(c.Body)) {
		return errors.New("target commitment body is not JSON")
	}
	if !isCanonicalJSON(c.Body) {
		return errors.New("target commitment body is not canonical JSON")
	}
	return nil
}

// checkAttempt is the seeds' attempt schema and its chronology against the reservation.
func checkAttempt(d *Drain, a *Attempt) error {
	committed, okC := ParseStamp(a.CommittedAt)
	valid, okV := ParseStamp(a.ValidThrough)
	reserved, _ := ParseStamp(d.ReservedAt)
	action := d.Actions[d.CompletedActionCount]
	switch {
	case !isSHA256Hex(a.AttemptID):
		return errors.New("attemptId is malformed")
	case a.ReservationID != d.ReservationID || a.Purpose != d.Purpose || a.Generation != d.Generation || !equalStrings(a.TargetIDs, d.TargetIDs):
		return errors.New("attempt does not belong to the reservation")
	case a.ActionIndex != d.CompletedActionCount || a.CurrentStage != action.Stage || a.CurrentTarget != action.TargetID:
		return errors.New("attempt is not for the current action")
	case !okC || !okV || !valid.After(committed) || valid.Sub(committed).Milliseconds() != action.ValidForMs:
		return errors.New("validThrough - committedAt is not the action's validForMs")
	case committed.Before(reserved):
		return errors.New("attempt committed before the reservation")
	case a.CommittedRevision <= d.ProgressRevision || (a.CommittedRevision-d.ProgressRevision)%2 != 1:
		return errors.New("committedRevision is not an odd distance past progressRevision")
	case a.ExecutorPID != 0 && !liveness.ValidPID(a.ExecutorPID):
		return errors.New("executor pid is out of range")
	case a.ExecutorStart != "" && (a.ExecutorPID == 0 || !liveness.IsStart(a.ExecutorStart)):
		return errors.New("executor start without a pid or malformed")
	}
	if a.Planning != nil {
		if a.Status != attemptActive || a.CurrentStage != stageReclaim {
			return errors.New("planning on an attempt that is not an active reclaim")
		}
		planned := *d
		planned.Attempt = a.Planning.Attempt
		if err := planningPrecedes(&planned, a, a.CommittedRevision-1); err != nil {
			return err
		}
	}
	switch a.Status {
	case attemptActive:
		if a.FailedRevision != nil || a.FailedAt != nil {
			return errors.New("an active attempt has failure fields")
		}
	case attemptFailed:
		if a.FailedRevision == nil || *a.FailedRevision != a.CommittedRevision+1 || a.FailedAt == nil {
			return errors.New("failedRevision is not committedRevision + 1")
		}
		failed, ok := ParseStamp(*a.FailedAt)
		if !ok || failed.Before(committed) {
			return errors.New("failedAt precedes committedAt")
		}
	default:
		return fmt.Errorf("status %q", a.Status)
	}
	return nil
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
