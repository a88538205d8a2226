package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/storage"
)

const (
	validStart = "proc:01234567-89ab-cdef-0123-456789abcdef:12345"
	reclaimID  = "volume:db"
)

var invariantsNow = time.Date(2026, 11, 29, 19, 0, 0, 0, time.UTC)

func hexOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func invariantDecl() portdecl.Declaration {
	return portdecl.Declaration{Step: 10, Count: 20, Bases: map[string]int{"HTTP": 18080, "DB": 15432}}
}

func invariantHolder(name string, pid int) Holder {
	h := Holder{Name: name, CheckoutPath: "/src/" + name, UID: 1000}.claimed(invariantsNow)
	if pid != 0 {
		h.PID, h.ProcessStart = pid, validStart
	}
	return h
}

// validRecord is a record two holders share, one tracked and one not, with a declared
// entrypoint and a previous holder released.
func validRecord() Record {
	r := newRecord("app", "main", 0, 0, invariantsNow)
	r.Revision = 5
	holders := []Holder{invariantHolder("alice", 4242), invariantHolder("bob", 0)}
	sortHolders(holders)
	decl := invariantDecl()
	family, _ := decl.FamilyAt(10)
	last := holderID("carol")
	r.Value = Value{
		Holders:            holders,
		Lease:              &Lease{Offset: 10, Ports: family.Ports, Declaration: decl},
		LastReleasedHolder: &last,
	}
	return r
}

func commitment(body string) *reclaimCommitment {
	return &reclaimCommitment{Format: commitmentFormat, Sha256: hexOf(body), Body: body}
}

// drainedRecord is a record with a reserved down drain (runtime-stop, then one reclaim) whose
// first attempt is active.
func drainedRecord() Record {
	r := validRecord()
	r.Value.Holders = []Holder{invariantHolder("alice", 4242)}
	r.Value.LastReleasedHolder = nil
	stack := r.SubjectID
	targets := []string{stack, reclaimID}
	reserved := invariantsNow.Add(time.Minute)
	committed := reserved.Add(time.Second)
	d := &Drain{
		drainPlan: drainPlan{
			Purpose: "down", StackID: stack, HolderID: holderID("alice"), RequesterID: holderID("alice"),
			ConfigSha256: invariantDecl().SHA256(), PlanDigest: hexOf("plan"), OperationBasis: hexOf("basis"),
			Generation: hexOf("generation"),
			TargetIDs:  targets,
			Actions: []drainAction{
				{Stage: stageRuntimeStop, TargetID: stack, ValidForMs: 60000},
				{Stage: stageReclaim, TargetID: reclaimID, ValidForMs: 60000, TargetCommitment: commitment(`{"target":"volume:db"}`)},
			},
			ExpectedCoordinationRevision: 5,
		},
		ReservationID: hexOf("reservation"), CoordinationRevision: 6, ProgressRevision: 6,
		ReservedAt: stamp(reserved), HolderName: "alice", UID: 1000,
	}
	d.Attempt = &Attempt{
		AttemptID: hexOf("attempt"), ReservationID: d.ReservationID, Purpose: d.Purpose,
		TargetIDs: append([]string(nil), targets...), Generation: d.Generation,
		ActionIndex: 0, CurrentTarget: stack, CurrentStage: stageRuntimeStop,
		CommittedRevision: 7, CommittedAt: stamp(committed), ValidThrough: stamp(committed.Add(time.Minute)),
		Status: attemptActive, ExecutorPID: 4343, ExecutorStart: validStart,
	}
	r.Value.Drain = d
	r.Revision = 7
	return r
}

// markAttemptFailed turns r's active attempt into a failed one, as the drain's next step records it.
func markAttemptFailed(r *Record) {
	a := r.Value.Drain.Attempt
	failedRevision := a.CommittedRevision + 1
	committed, _ := ParseStamp(a.CommittedAt)
	failedAt := stamp(committed.Add(time.Second))
	a.Status, a.FailedRevision, a.FailedAt = attemptFailed, &failedRevision, &failedAt
	r.Revision = failedRevision
}

func joinedErrors(err error) []error {
	if err == nil {
		return nil
	}
	if u, ok := err.(interface{ Unwrap() []error }); ok {
		return u.Unwrap()
	}
	return []error{err}
}

func TestCheckAcceptsValidRecords(t *testing.T) {
	failed := drainedRecord()
	markAttemptFailed(&failed)
	noAttempt := drainedRecord()
	noAttempt.Value.Drain.Attempt = nil
	noAttempt.Revision = noAttempt.Value.Drain.ProgressRevision
	sleep := drainedRecord()
	sleep.Value.Drain.Purpose, sleep.Value.Drain.Attempt.Purpose = "sleep", "sleep"
	sleep.Value.Drain.TargetIDs = sleep.Value.Drain.TargetIDs[:1]
	sleep.Value.Drain.Attempt.TargetIDs = sleep.Value.Drain.TargetIDs
	sleep.Value.Drain.Actions = sleep.Value.Drain.Actions[:1]
	orphanLease := validRecord()
	orphanLease.Value.Holders = []Holder{}
	fresh := newRecord("app", "main", 0, 0, invariantsNow)
	for name, r := range map[string]Record{
		"shared": validRecord(), "fresh": fresh, "active attempt": drainedRecord(), "failed attempt": failed,
		"no attempt": noAttempt, "sleep": sleep, "lease kept after its holders died": orphanLease,
	} {
		if err := checkRecord(r); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		// What the store holds reads back the same.
		data, _ := json.Marshal(r)
		back, err := decodeHead(data)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkRecord(back); err != nil {
			t.Errorf("%s after a JSON round trip: %v", name, err)
		}
	}
}

func TestCheckRefusesEachBrokenInvariant(t *testing.T) {
	type mutation = func(r *Record)
	plain, drained := validRecord, drainedRecord
	holder := func(r *Record, name string) *Holder {
		for i := range r.Value.Holders {
			if r.Value.Holders[i].Name == name {
				return &r.Value.Holders[i]
			}
		}
		panic("no holder " + name)
	}
	rename := func(cockpit, stack string) mutation {
		return func(r *Record) {
			r.Cockpit, r.Stack, r.CockpitID, r.SubjectID = cockpit, stack, cockpitID(cockpit), StackID(cockpit, stack)
		}
	}
	attempt := func(f func(a *Attempt)) mutation { return func(r *Record) { f(r.Value.Drain.Attempt) } }
	drain := func(f func(d *Drain)) mutation { return func(r *Record) { f(r.Value.Drain) } }
	// moveCommitted sets the attempt's committedRevision and keeps the record at its boundary.
	moveCommitted := func(rev int64) mutation {
		return func(r *Record) { r.Value.Drain.Attempt.CommittedRevision, r.Revision = rev, rev }
	}
	stamp := func(d time.Duration) string { return stamp(invariantsNow.Add(d)) }
	str := func(s string) *string { return &s }
	i64 := func(n int64) *int64 { return &n }

	cases := []struct {
		name   string
		base   func() Record
		mutate mutation
		want   []string // one fragment per error checkRecord must report
	}{
		// Record.
		{"format", plain, func(r *Record) { r.Format = "cockpit-state/v2" }, []string{"format/kind"}},
		{"kind", plain, func(r *Record) { r.Kind = "drain" }, []string{"format/kind"}},
		{"cockpit named README", plain, rename("README", "main"), []string{"names"}},
		{"cockpit named ports", plain, rename("ports", "main"), []string{"names"}},
		{"stack name", plain, rename("app", ".main"), []string{"names"}},
		{"cockpitId", plain, func(r *Record) { r.CockpitID = cockpitID("other") }, []string{"identities"}},
		{"subjectId", plain, func(r *Record) { r.SubjectID = StackID("app", "other") }, []string{"identities"}},
		{"negative revision", plain, func(r *Record) { r.Revision = -1 }, []string{"negative"}},
		{"updatedAt", plain, func(r *Record) { r.UpdatedAt = "2026-11-29T19:00:00Z" }, []string{"updatedAt"}},
		// Holders.
		{"too many holders", plain, func(r *Record) {
			for i := range maxHolders - 1 {
				r.Value.Holders = append(r.Value.Holders, invariantHolder(fmt.Sprintf("h%04d", i), 0))
			}
			sortHolders(r.Value.Holders)
		}, []string{"exceed"}},
		{"holder name", plain, func(r *Record) {
			h := holder(r, "bob")
			h.Name, h.HolderID = ".bob", holderID(".bob")
		}, []string{"identity does not match its name"}},
		{"holderId", plain, func(r *Record) { holder(r, "bob").HolderID = holderID("robert") }, []string{"identity does not match its name"}},
		{"relative checkout", plain, func(r *Record) {
			h := holder(r, "bob")
			h.CheckoutPath, h.CheckoutID = "src/bob", checkoutID("src/bob")
		}, []string{"not absolute"}},
		{"checkoutId", plain, func(r *Record) { holder(r, "bob").CheckoutID = checkoutID("/elsewhere") }, []string{"identity differs"}},
		{"claimedAt", plain, func(r *Record) { holder(r, "bob").ClaimedAt = "yesterday" }, []string{"claimedAt"}},
		{"negative pid", plain, func(r *Record) { holder(r, "bob").PID = -1 }, []string{"out of range"}},
		{"process start without pid", plain, func(r *Record) { holder(r, "bob").ProcessStart = validStart }, []string{"process start"}},
		{"malformed process start", plain, func(r *Record) { holder(r, "alice").ProcessStart = "proc:boot:12" }, []string{"process start"}},
		{"unsorted holders", plain, func(r *Record) {
			r.Value.Holders[0], r.Value.Holders[1] = r.Value.Holders[1], r.Value.Holders[0]
		}, []string{"not unique and sorted"}},
		{"duplicate holder", plain, func(r *Record) {
			r.Value.Holders = append(r.Value.Holders, *holder(r, "bob"))
			sortHolders(r.Value.Holders)
		}, []string{"not unique and sorted"}},
		// Lease.
		{"lease declaration", plain, func(r *Record) { r.Value.Lease.Declaration.Step = 0 }, []string{"lease: declaration"}},
		{"lease offset", plain, func(r *Record) {
			r.Value.Lease.Offset = 15
			r.Value.Lease.Ports = map[string]int{"HTTP": 18095, "DB": 15447}
		}, []string{"offset 15"}},
		{"lease port missing", plain, func(r *Record) { delete(r.Value.Lease.Ports, "DB") }, []string{"its ports do not match"}},
		{"lease port extra", plain, func(r *Record) { r.Value.Lease.Ports["REDIS"] = 16389 }, []string{"its ports do not match"}},
		{"lease port moved", plain, func(r *Record) { r.Value.Lease.Ports["DB"] = 15433 }, []string{"DB=15433"}},
		{"lease port key swapped", plain, func(r *Record) {
			r.Value.Lease.Ports = map[string]int{"HTTP": 18090, "WEB": 15442}
		}, []string{"WEB=15442"}},
		// lastReleasedHolder and the holders' lease.
		{"lastReleasedHolder malformed", plain, func(r *Record) { r.Value.LastReleasedHolder = str("carol") }, []string{"lastReleasedHolder"}},
		{"lastReleasedHolder still holds", plain, func(r *Record) { r.Value.LastReleasedHolder = str(holderID("bob")) }, []string{"still a holder"}},
		{"holders without a lease", plain, func(r *Record) { r.Value.Lease = nil }, []string{"no active lease"}},
		{"holders with a released lease", plain, func(r *Record) { r.Value.Lease.Released = true }, []string{"no active lease"}},
		{"orphan lease names nobody", plain, func(r *Record) {
			r.Value.Holders, r.Value.LastReleasedHolder = []Holder{}, nil
		}, []string{"names no lastReleasedHolder"}},
		// Drain in the record.
		{"drain with a co-tenant", drained, func(r *Record) {
			r.Value.Holders = append(r.Value.Holders, invariantHolder("bob", 0))
			sortHolders(r.Value.Holders)
		}, []string{"exactly its own holder"}},
		{"drain without holders", drained, func(r *Record) {
			r.Value.Holders, r.Value.LastReleasedHolder = []Holder{}, str(holderID("alice"))
		}, []string{"exactly its own holder"}},
		{"drain of a released lease", drained, func(r *Record) { r.Value.Lease.Released = true },
			[]string{"no active lease", "exactly its own holder"}},
		{"drain requested by another", drained, drain(func(d *Drain) { d.RequesterID = holderID("bob") }), []string{"exactly its own holder"}},
		{"drain of another holder", drained, func(r *Record) {
			r.Value.Holders = []Holder{invariantHolder("bob", 0)}
		}, []string{"exactly its own holder"}},
		{"drain of another stack", drained, drain(func(d *Drain) {
			other := StackID("app", "other")
			d.StackID, d.TargetIDs[0], d.Actions[0].TargetID = other, other, other
			d.Attempt.TargetIDs[0], d.Attempt.CurrentTarget = other, other
		}), []string{"drain stackId"}},
		{"drain revision", drained, func(r *Record) { r.Revision++ }, []string{"not the drain's last step"}},
		{"drain revision without attempt", drained, func(r *Record) { r.Value.Drain.Attempt = nil }, []string{"not the drain's last step 6"}},
		// checkDrain.
		{"purpose", drained, drain(func(d *Drain) { d.Purpose = "nap" }), []string{"purpose"}},
		{"malformed stackId", drained, drain(func(d *Drain) { d.StackID = "stack:xyz" }), []string{"drain stackId", "identities are malformed"}},
		{"malformed holderId", drained, drain(func(d *Drain) { d.HolderID, d.RequesterID = "alice", "alice" }),
			[]string{"exactly its own holder", "identities are malformed"}},
		{"configSha256", drained, drain(func(d *Drain) { d.ConfigSha256 = "abc" }), []string{"digests"}},
		{"planDigest", drained, drain(func(d *Drain) { d.PlanDigest = strings.ToUpper(d.PlanDigest) }), []string{"digests"}},
		{"operationBasis", drained, drain(func(d *Drain) { d.OperationBasis = "" }), []string{"digests"}},
		{"generation", drained, drain(func(d *Drain) { d.Generation += "0" }), []string{"digests"}},
		{"reservationId", drained, drain(func(d *Drain) { d.ReservationID = d.ReservationID[1:] }), []string{"digests"}},
		{"generation equals reservationId", drained, drain(func(d *Drain) { d.Generation = d.ReservationID }), []string{"generation equals"}},
		{"coordinationRevision", drained, drain(func(d *Drain) { d.CoordinationRevision = 5 }), []string{"coordinationRevision is not"}},
		{"negative expected revision", drained, drain(func(d *Drain) {
			d.ExpectedCoordinationRevision, d.CoordinationRevision = -1, 0
		}), []string{"coordinationRevision is not"}},
		{"progress before coordination", drained, drain(func(d *Drain) { d.ProgressRevision = 5 }), []string{"progressRevision precedes"}},
		{"completedActionCount past the actions", drained, drain(func(d *Drain) { d.CompletedActionCount = 2 }), []string{"completedActionCount 2"}},
		{"negative completedActionCount", drained, drain(func(d *Drain) { d.CompletedActionCount = -1 }), []string{"completedActionCount -1"}},
		{"reservedAt", drained, drain(func(d *Drain) { d.ReservedAt = "soon" }), []string{"reservedAt"}},
		// checkTargets.
		{"no targets", drained, drain(func(d *Drain) { d.TargetIDs = nil }), []string{"0 targets"}},
		{"too many targets", drained, drain(func(d *Drain) {
			d.TargetIDs = nil
			for i := range maxHolders + 1 {
				d.TargetIDs = append(d.TargetIDs, fmt.Sprintf("t%05d", i))
			}
		}), []string{"1025 targets"}},
		{"empty target", drained, drain(func(d *Drain) { d.TargetIDs = append([]string{""}, d.TargetIDs...) }), []string{"targets are not distinct"}},
		{"long target", drained, drain(func(d *Drain) { d.TargetIDs[1] = "volume:" + strings.Repeat("x", maxTargetBytes) }), []string{"targets are not distinct"}},
		{"NUL in target", drained, drain(func(d *Drain) { d.TargetIDs[1] = "volume:d\x00b" }), []string{"targets are not distinct"}},
		{"unsorted targets", drained, drain(func(d *Drain) { d.TargetIDs[0], d.TargetIDs[1] = d.TargetIDs[1], d.TargetIDs[0] }), []string{"targets are not distinct"}},
		{"duplicate targets", drained, drain(func(d *Drain) { d.TargetIDs = append(d.TargetIDs, reclaimID) }), []string{"targets are not distinct"}},
		// checkActions.
		{"fewer actions than targets", drained, drain(func(d *Drain) { d.Actions = d.Actions[:1] }), []string{"actions must be runtime-stop"}},
		{"first action reclaims", drained, drain(func(d *Drain) { d.Actions[0].Stage = stageReclaim }), []string{"actions must be runtime-stop"}},
		{"first action stops another", drained, drain(func(d *Drain) { d.Actions[0].TargetID = reclaimID }), []string{"actions must be runtime-stop"}},
		{"runtime-stop with a commitment", drained, drain(func(d *Drain) { d.Actions[0].TargetCommitment = commitment(`{}`) }), []string{"actions must be runtime-stop"}},
		{"targets without the stack", drained, drain(func(d *Drain) {
			d.TargetIDs = []string{"a:x", reclaimID}
			d.Actions[1].TargetID = "a:x"
		}), []string{"include the stack once"}},
		{"validForMs zero", drained, drain(func(d *Drain) { d.Actions[1].ValidForMs = 0 }), []string{"action 1: validForMs 0"}},
		{"validForMs too long", drained, drain(func(d *Drain) { d.Actions[0].ValidForMs = maxValidForMs + 1 }), []string{"action 0: validForMs"}},
		{"second action stops", drained, drain(func(d *Drain) { d.Actions[1].Stage = stageRuntimeStop }), []string{"not the reclaim"}},
		{"reclaim of another target", drained, drain(func(d *Drain) { d.Actions[1].TargetID = "volume:cache" }), []string{"not the reclaim"}},
		{"missing commitment", drained, drain(func(d *Drain) { d.Actions[1].TargetCommitment = nil }), []string{"commitment is missing"}},
		{"commitment format", drained, drain(func(d *Drain) { d.Actions[1].TargetCommitment.Format = "v2" }), []string{"commitment is missing"}},
		{"commitment too short", drained, drain(func(d *Drain) { d.Actions[1].TargetCommitment = commitment("1") }), []string{"commitment is missing"}},
		{"commitment digest", drained, drain(func(d *Drain) { d.Actions[1].TargetCommitment.Sha256 = hexOf("other") }), []string{"sha256 does not match"}},
		{"commitment not JSON", drained, drain(func(d *Drain) { d.Actions[1].TargetCommitment = commitment(`{target}`) }), []string{"not JSON"}},
		{"commitment not canonical", drained, drain(func(d *Drain) {
			d.Actions[1].TargetCommitment = commitment(`{ "target": "volume:db" }`)
		}), []string{"not canonical"}},
		{"sleep with a reclaim", drained, drain(func(d *Drain) { d.Purpose = "sleep" }), []string{"sleep has exactly one action"}},
		// checkAttempt.
		{"attemptId", drained, attempt(func(a *Attempt) { a.AttemptID = "1" }), []string{"attemptId"}},
		{"attempt of another reservation", drained, attempt(func(a *Attempt) { a.ReservationID = hexOf("x") }), []string{"does not belong"}},
		{"attempt purpose", drained, attempt(func(a *Attempt) { a.Purpose = "reset" }), []string{"does not belong"}},
		{"attempt generation", drained, attempt(func(a *Attempt) { a.Generation = hexOf("x") }), []string{"does not belong"}},
		{"attempt targets", drained, attempt(func(a *Attempt) { a.TargetIDs = a.TargetIDs[:1] }), []string{"does not belong"}},
		{"attempt action index", drained, attempt(func(a *Attempt) { a.ActionIndex = 1 }), []string{"not for the current action"}},
		{"attempt stage", drained, attempt(func(a *Attempt) { a.CurrentStage = stageReclaim }), []string{"not for the current action"}},
		{"attempt target", drained, attempt(func(a *Attempt) { a.CurrentTarget = reclaimID }), []string{"not for the current action"}},
		{"validThrough", drained, attempt(func(a *Attempt) { a.ValidThrough = stamp(time.Hour) }), []string{"validThrough"}},
		{"validThrough malformed", drained, attempt(func(a *Attempt) { a.ValidThrough = "later" }), []string{"validThrough"}},
		{"committedAt malformed", drained, attempt(func(a *Attempt) { a.CommittedAt = "now" }), []string{"validThrough"}},
		{"committed before reserved", drained, attempt(func(a *Attempt) {
			a.CommittedAt, a.ValidThrough = stamp(0), stamp(time.Minute)
		}), []string{"committed before the reservation"}},
		{"committedRevision at progress", drained, moveCommitted(6), []string{"odd distance"}},
		{"committedRevision at even distance", drained, moveCommitted(8), []string{"odd distance"}},
		{"executor start without pid", drained, attempt(func(a *Attempt) { a.ExecutorPID = 0 }), []string{"executor start"}},
		{"executor start malformed", drained, attempt(func(a *Attempt) { a.ExecutorStart = "lstart:2026-02-30T00:00:00.000Z" }), []string{"executor start"}},
		{"planning on a runtime-stop", drained, attempt(func(a *Attempt) { a.Planning = &attemptPlanning{UpdatedAt: a.CommittedAt} }),
			[]string{"planning on an attempt that is not an active reclaim"}},
		{"active with failedRevision", drained, attempt(func(a *Attempt) { a.FailedRevision = i64(8) }), []string{"failure fields"}},
		{"active with failedAt", drained, attempt(func(a *Attempt) { a.FailedAt = str(stamp(2 * time.Hour)) }), []string{"failure fields"}},
		{"failed without failedRevision", drained, func(r *Record) {
			markAttemptFailed(r)
			r.Value.Drain.Attempt.FailedRevision = nil
			r.Revision = r.Value.Drain.Attempt.CommittedRevision
		}, []string{"failedRevision is not"}},
		{"failedRevision skips", drained, func(r *Record) {
			markAttemptFailed(r)
			r.Value.Drain.Attempt.FailedRevision = i64(9)
			r.Revision = 9
		}, []string{"failedRevision is not"}},
		{"failed without failedAt", drained, func(r *Record) {
			markAttemptFailed(r)
			r.Value.Drain.Attempt.FailedAt = nil
		}, []string{"failedRevision is not"}},
		{"failedAt before committedAt", drained, func(r *Record) {
			markAttemptFailed(r)
			r.Value.Drain.Attempt.FailedAt = str(stamp(0))
		}, []string{"failedAt precedes"}},
		{"failedAt malformed", drained, func(r *Record) {
			markAttemptFailed(r)
			r.Value.Drain.Attempt.FailedAt = str("never")
		}, []string{"failedAt precedes"}},
		{"status", drained, attempt(func(a *Attempt) { a.Status = "succeeded" }), []string{`status "succeeded"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.base()
			if err := checkRecord(r); err != nil {
				t.Fatalf("the base record is invalid: %v", err)
			}
			tc.mutate(&r)
			errs := joinedErrors(checkRecord(r))
			if len(errs) != len(tc.want) {
				t.Fatalf("checkRecord reported %d errors %v, want %d naming %q", len(errs), errs, len(tc.want), tc.want)
			}
			for i, want := range tc.want {
				if !strings.Contains(errs[i].Error(), want) {
					t.Errorf("error %d %q does not name %q", i, errs[i], want)
				}
			}
		})
	}
}

// saveRecord is where the invariants guard the store: a transition that breaks one commits
// nothing, and the refusal says it is a bug.
func TestCheckGuardsSaveRecord(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	claim(t, e, "app", "main", "alice")
	before := recordSnapshot(t, e, "app", "main")
	r := stackRecord(t, e, "app", "main")
	r.Value.Lease = nil
	err := e.db.Update(t.Context(), func(tx storage.Txn) error { _, err := saveRecord(tx, cachedRecord{}, r); return err })
	requireCode(t, err, StateRecordMalformed)
	if after := recordSnapshot(t, e, "app", "main"); after != before {
		t.Fatalf("a record breaking its invariants was saved:\n%s", after)
	}
}

// The identity checks accept exactly what their patterns do, on identities and on every one-byte
// deletion and change of them.
func TestIdentityShapesAgreeWithTheirPatterns(t *testing.T) {
	for _, c := range []struct {
		pattern *regexp.Regexp
		check   func(string) bool
		seed    string
	}{
		{sha256Hex, isSHA256Hex, strings.Repeat("0a", 32)},
		{regexp.MustCompile(`^holder:[a-f0-9]{64}:session$`), isHolderID, holderID("w")},
		{regexp.MustCompile(`^stack:[a-f0-9]{64}$`), isStackID, StackID("app", "s")},
	} {
		if !c.check(c.seed) {
			t.Fatalf("%q refused", c.seed)
		}
		for i := range len(c.seed) {
			for _, s := range []string{c.seed[:i] + c.seed[i+1:], c.seed[:i] + "g" + c.seed[i+1:], c.seed[:i] + "A" + c.seed[i+1:],
				c.seed[:i] + ":" + c.seed[i+1:], c.seed[:i] + "5" + c.seed[i+1:], c.seed[:i] + "ab" + c.seed[i:]} {
				if got, want := c.check(s), c.pattern.MatchString(s); got != want {
					t.Errorf("%q: %v, the pattern says %v", s, got, want)
				}
			}
		}
	}
}
