package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
)

// healthConfig keeps its ports clear of the usual ephemeral range (32768-60999) and of
// exampleConfig's, so tests here and elsewhere do not meet.
const healthConfig = `[ports]
step = 10
count = 5
[ports.bases]
HTTP = 21080
DB = 21432
`

func observationOf(t *testing.T, obs []Observation, code, target string) Observation {
	t.Helper()
	for _, o := range obs {
		if o.Code == code && o.Target == target {
			return o
		}
	}
	t.Fatalf("no %s observation for %q in %+v", code, target, obs)
	return Observation{}
}

func wantValue(t *testing.T, o Observation, want bool) {
	t.Helper()
	if o.Observed.State != observedAvailable || o.Observed.Value == nil || *o.Observed.Value != want {
		t.Fatalf("%s %s observed %+v, want available %t", o.Code, o.Target, o.Observed, want)
	}
	if result := map[bool]string{true: resultPass, false: resultFail}[want]; o.Result != result {
		t.Fatalf("%s %s observed %t reads result %q, want %q", o.Code, o.Target, want, o.Result, result)
	}
}

func health(t *testing.T, e *Engine, stack string) []Observation {
	t.Helper()
	obs, err := e.Health("app", stack)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range obs {
		if o.StackID != StackID("app", stack) || o.Expectation != (expectation{"equal", true}) ||
			o.Applicability != (applicability{"required", "environment"}) || o.Freshness.State != "current" || o.Remedy == "" {
			t.Fatalf("observation out of the seeds' shape: %+v", o)
		}
		if o.Observed.State != observedAvailable && o.Result != resultFail {
			t.Fatalf("an observation that could not be made reads result %q: %+v", o.Result, o)
		}
		if _, ok := ParseStamp(o.Observed.ObservedAt); !ok {
			t.Fatalf("observedAt %q", o.Observed.ObservedAt)
		}
	}
	return obs
}

func TestHealthOfAClaimedStack(t *testing.T) {
	e := newEngine(t)
	newCockpit(t, e, "app", healthConfig, "a")
	if err := e.Claim(context.Background(), me("create", "app/stacks/a/holders/me"), "app", "a", "me", untracked("me")); err != nil {
		t.Fatal(err)
	}
	obs := health(t, e, "a")
	if len(obs) != 6 {
		t.Fatalf("want claim-state, port-family, declaration, two listeners and ephemeral, got %+v", obs)
	}
	wantValue(t, observationOf(t, obs, codeClaimState, ""), true)
	wantValue(t, observationOf(t, obs, codePortFamily, ""), true)
	wantValue(t, observationOf(t, obs, codeEphemeralRange, ""), true)
	http := observationOf(t, obs, codePortListener, "HTTP=21080")
	wantValue(t, http, false)
	if http.Source != "tcp:21080" {
		t.Fatalf("listener source %q", http.Source)
	}
	wantValue(t, observationOf(t, obs, codePortListener, "DB=21432"), false)

	// The stack's service comes up on its HTTP port.
	l, err := net.Listen("tcp", "127.0.0.1:21080")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	obs = health(t, e, "a")
	wantValue(t, observationOf(t, obs, codePortListener, "HTTP=21080"), true)
	wantValue(t, observationOf(t, obs, codePortListener, "DB=21432"), false)
}

func TestHealthOfAStackWithoutALease(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", healthConfig, "a")
	obs := health(t, e, "a")
	if len(obs) != 3 {
		t.Fatalf("want claim-state, port-family and ephemeral (no listeners without a lease), got %+v", obs)
	}
	wantValue(t, observationOf(t, obs, codeClaimState, ""), true)
	family := observationOf(t, obs, codePortFamily, "")
	if family.Observed.State != observedUnavailable || family.Observed.Reason != "the stack has no active port-family lease" {
		t.Fatalf("port-family %+v", family.Observed)
	}
	wantValue(t, observationOf(t, obs, codeEphemeralRange, ""), true)
}

func TestHealthWithoutAConfigCannotJudgeTheEphemeralRange(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", "", "a")
	o := observationOf(t, health(t, e, "a"), codeEphemeralRange, "")
	if o.Observed.State != observedUnavailable || o.Observed.Reason != "the cockpit has no port declaration" {
		t.Fatalf("ephemeral %+v", o.Observed)
	}
}

// Candidates in the kernel's range show in health before any lease: the warning outlives the
// config's events line.
func TestHealthWarnsOfEphemeralCandidates(t *testing.T) {
	t.Parallel()
	r := hostEphemeralRange(t)
	e := newEngine(t)
	newCockpit(t, e, "app", fmt.Sprintf("[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = %d\n", r.High), "a")
	o := observationOf(t, health(t, e, "a"), codeEphemeralRange, "")
	wantValue(t, o, false)
	if !strings.Contains(o.Observed.Reason, fmt.Sprintf("candidate ports %d lie in the kernel's ephemeral port range (%s)", r.High, r)) {
		t.Fatalf("reason %q", o.Observed.Reason)
	}
}

// Two active leases holding one port can only come from a corrupt store; health names the other
// stack from both sides.
func TestHealthSeesACollidingLease(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", healthConfig, "a", "b")
	if err := e.Claim(context.Background(), me("create", "app/stacks/a/holders/me"), "app", "a", "me", untracked("me")); err != nil {
		t.Fatal(err)
	}
	a, _ := e.Stack("app", "a")
	writeRecord(t, e.db, "b", func(r *Record) {
		lease := *a.Value.Lease
		last := holderID("gone")
		r.Value.Lease, r.Value.LastReleasedHolder = &lease, &last
	})
	fromA := observationOf(t, health(t, e, "a"), codePortFamily, "")
	wantValue(t, fromA, false)
	if !strings.Contains(fromA.Observed.Reason, "port 21080 (HTTP) is leased by app/a and app/b") {
		t.Fatalf("reason from a: %q", fromA.Observed.Reason)
	}
	fromB := observationOf(t, health(t, e, "b"), codePortFamily, "")
	wantValue(t, fromB, false)
	if !strings.Contains(fromB.Observed.Reason, "port 21432 (DB) is indexed to app/a DB") || !strings.Contains(fromB.Observed.Reason, "port 21080 (HTTP) is leased by app/a and app/b") {
		t.Fatalf("reason from b: %q", fromB.Observed.Reason)
	}
}

func TestHealthOfABrokenRecordFails(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", healthConfig, "a", "b")
	// Holders without a lease break an invariant; "b" is not even JSON.
	writeRecord(t, e.db, "a", func(r *Record) {
		r.Value.Holders = []Holder{Holder{Name: "me", CheckoutPath: "/src/me"}.claimed(e.now())}
	})
	if err := e.db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(stackKey("app", "b"), []byte("{")) }); err != nil {
		t.Fatal(err)
	}
	for stack, reason := range map[string]string{"a": "the stack has holders but no active lease", "b": "decode record"} {
		obs := health(t, e, stack)
		claim := observationOf(t, obs, codeClaimState, "")
		if claim.Observed.State != observedFailed || !strings.Contains(claim.Observed.Reason, reason) || claim.Observed.Value != nil {
			t.Fatalf("%s: claim-state %+v, want failed naming %q", stack, claim.Observed, reason)
		}
		if family := observationOf(t, obs, codePortFamily, ""); family.Observed.State != observedFailed {
			t.Fatalf("%s: port-family %+v, want failed", stack, family.Observed)
		}
	}
}

func TestHealthOfAMissingStackIsNotFound(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", healthConfig)
	_, err := e.Health("app", "nope")
	var r *Refusal
	if !errors.As(err, &r) || r.Code != NotFound {
		t.Fatalf("err = %v, want NotFound", err)
	}
}

// writeRecord changes a stack's stored record behind the engine's back, skipping every check: the
// corruption verify and health exist to find.
func writeRecord(t *testing.T, db storage.Store, stack string, change func(*Record)) {
	t.Helper()
	err := db.Update(context.Background(), func(tx storage.Txn) error {
		r, err := new(Engine).loadRecord(tx, "app", stack) // no cache: always decoded
		if err != nil {
			return err
		}
		change(&r)
		return setJSON(tx, stackKey("app", stack), r)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// claim-state observes the cockpit's whole inventory, as the seeds' observeClaimState reads
// every coordination record of the namespace: one broken record makes every stack's claim-state
// fail, naming it; another cockpit's record does not.
func TestHealthClaimStateObservesTheCockpit(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", healthConfig, "a", "b")
	newCockpit(t, e, "other", healthConfig, "c")
	if err := e.Claim(context.Background(), me("create", "app/stacks/a/holders/me"), "app", "a", "me", untracked("me")); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(stackKey("other", "c"), []byte("{")) }); err != nil {
		t.Fatal(err)
	}
	wantValue(t, observationOf(t, health(t, e, "a"), codeClaimState, ""), true)

	writeRecord(t, e.db, "b", func(r *Record) {
		r.Value.Holders = []Holder{Holder{Name: "me", CheckoutPath: "/src/me"}.claimed(e.now())}
	})
	e = New(e.db) // the store changed behind the engine: only a daemon restart can find it so
	obs := health(t, e, "a")
	claim := observationOf(t, obs, codeClaimState, "")
	if claim.Observed.State != observedFailed || !strings.Contains(claim.Observed.Reason, "app/b") ||
		!strings.Contains(claim.Observed.Reason, "the stack has holders but no active lease") {
		t.Fatalf("claim-state of a beside a broken b: %+v", claim.Observed)
	}
	if family := observationOf(t, obs, codePortFamily, ""); family.Observed.State != observedFailed {
		t.Fatalf("port-family of a beside a broken b: %+v, want failed as the seeds' inventory refusal", family.Observed)
	}
}

// port-family is false while any two active leases on the machine share a port, as the seeds'
// observePortFamily judges the whole root inventory, not only this stack's ports.
func TestHealthPortFamilySeesCollisionsBetweenOthers(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", healthConfig, "a", "b")
	newCockpit(t, e, "other", healthConfig, "c")
	for _, s := range []struct{ cockpit, stack string }{{"app", "a"}, {"app", "b"}} {
		if err := e.Claim(context.Background(), me("create", s.cockpit+"/stacks/"+s.stack+"/holders/me"), s.cockpit, s.stack, "me", untracked("me")); err != nil {
			t.Fatal(err)
		}
	}
	wantValue(t, observationOf(t, health(t, e, "a"), codePortFamily, ""), true)
	b, _ := e.Stack("app", "b")
	// other/c holds b's family too: a's own ports are clear, the machine's leases are not.
	err := e.db.Update(context.Background(), func(tx storage.Txn) error {
		r, err := new(Engine).loadRecord(tx, "other", "c")
		if err != nil {
			return err
		}
		lease := *b.Value.Lease
		last := holderID("gone")
		r.Value.Lease, r.Value.LastReleasedHolder = &lease, &last
		return setJSON(tx, stackKey("other", "c"), r)
	})
	if err != nil {
		t.Fatal(err)
	}
	e = New(e.db) // as above: changed behind the engine
	family := observationOf(t, health(t, e, "a"), codePortFamily, "")
	wantValue(t, family, false)
	if !strings.Contains(family.Observed.Reason, "port 21090 (HTTP) is leased by app/b and other/c") {
		t.Fatalf("reason %q", family.Observed.Reason)
	}
}

// port-family reads true only with current host-listener evidence (the seeds'
// listenerEvidenceCurrent); without it the observation is unavailable, never true.
func TestHealthPortFamilyNeedsListenerEvidence(t *testing.T) {
	t.Parallel()
	lease := &Lease{Offset: 0, Ports: map[string]int{"HTTP": 21080}}
	base := Observation{StackID: StackID("app", "a"), Expectation: expectation{Kind: "equal", Value: true}}
	at := stamp(time.Now())
	undecided := portFamilyObservation(base, lease, healthInventory{}, listenerEvidence{err: errors.New("no socket table")}, at)
	if o := undecided.Observed; o.State != observedUnavailable || o.Value != nil ||
		!strings.Contains(o.Reason, "current host-listener evidence is unavailable") || !strings.Contains(o.Reason, "no socket table") {
		t.Fatalf("port-family without listener evidence: %+v", o)
	}
	wantValue(t, judged([]Observation{portFamilyObservation(base, lease, healthInventory{}, listenerEvidence{}, at)})[0], true)
	collided := portFamilyObservation(base, lease, healthInventory{collision: "port 1 is leased twice"}, listenerEvidence{err: errors.New("x")}, at)
	wantValue(t, judged([]Observation{collided})[0], false)
	failed := portFamilyObservation(base, lease, healthInventory{unsound: "app/b: decode record"}, listenerEvidence{}, at)
	if failed.Observed.State != observedFailed {
		t.Fatalf("port-family over an unsound inventory: %+v", failed.Observed)
	}
}

// A running stack whose lease was taken under another [ports] declaration than the config's says
// so in health (the seeds' inspectRecordedPortDeclaration), before a co-tenant meets the ESTALE.
func TestHealthSaysTheDeclarationChanged(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", healthConfig, "a")
	if err := e.Claim(context.Background(), me("create", "app/stacks/a/holders/me"), "app", "a", "me", untracked("me")); err != nil {
		t.Fatal(err)
	}
	wantValue(t, observationOf(t, health(t, e, "a"), codeDeclarationChanged, ""), true)
	moved := strings.Replace(healthConfig, "HTTP = 21080", "HTTP = 21180", 1)
	if err := e.SetConfig(context.Background(), me("write", "app/config"), "app", []byte(moved)); err != nil {
		t.Fatal(err)
	}
	o := observationOf(t, health(t, e, "a"), codeDeclarationChanged, "")
	wantValue(t, o, false)
	if !strings.Contains(o.Observed.Reason, "another [ports] declaration") {
		t.Fatalf("reason %q", o.Observed.Reason)
	}
}

// AppendJSON writes what encoding/json writes (HTML escaping off), for every observation health
// makes of a claimed stack, one without a lease, and one whose strings need escaping.
func TestObservationJSONIsEncodingJSONs(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", healthConfig, "a", "idle")
	if err := e.Claim(context.Background(), me("create", "app/stacks/a/holders/me"), "app", "a", "me", untracked("me")); err != nil {
		t.Fatal(err)
	}
	obs := append(health(t, e, "a"), health(t, e, "idle")...)
	odd := obs[len(obs)-1]
	no := false
	odd.Observed.Value = &no
	odd.Target = "x=\"<1>\" & \\ \n\t\b\f\x01 é \u2028 \xff ok"
	odd.Observed.Reason = odd.Target
	odd.Expectation.Value = false
	obs = append(obs, odd, Observation{})
	for _, o := range obs {
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(o); err != nil {
			t.Fatal(err)
		}
		if got := string(o.AppendJSON(nil)) + "\n"; got != want.String() {
			t.Fatalf("AppendJSON:\n%s\nencoding/json:\n%s", got, want.String())
		}
	}
}

// A daemon restarted over an existing store checks a stack's record at its first health read and
// keeps it checked, so later reads of the same bytes do not check every holder again.
func TestHealthKeepsTheRecordItChecked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, err := kv.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	first := New(db)
	newCockpit(t, first, "app", healthConfig, "s")
	if err := first.Claim(context.Background(), me("create", "app/stacks/s/holders/a"), "app", "s", "a", untracked("a")); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = kv.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	e := New(db)
	checked := func() bool {
		var head []byte
		if err := db.View(func(tx storage.Txn) (err error) { head, err = tx.Get(stackKey("app", "s")); return err }); err != nil {
			t.Fatal(err)
		}
		r, ok := e.records.decoded(stackKey("app", "s"), head)
		return ok && r.checked
	}
	if checked() {
		t.Fatal("a fresh engine holds the record as checked before reading it")
	}
	if _, err := e.Health("app", "s"); err != nil {
		t.Fatal(err)
	}
	if !checked() {
		t.Fatal("after a health read the record is not kept as checked: every read checks it again")
	}
}

// A health read reuses what the last one read of the store only while no commit has happened
// since: a config written in between (a commit on the cockpit, not the stack) is seen, and so is
// a claim's new holder count in the record.
func TestHealthSeesEveryCommitSinceTheLastRead(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", healthConfig, "a")
	ctx := context.Background()
	if err := e.Claim(ctx, me("create", "app/stacks/a/holders/me"), "app", "a", "me", untracked("me")); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second read reuses the first's
		wantValue(t, observationOf(t, health(t, e, "a"), codeDeclarationChanged, ""), true)
	}
	if err := e.SetConfig(ctx, me("write", "app/config"), "app", []byte(strings.Replace(healthConfig, "step = 10", "step = 20", 1))); err != nil {
		t.Fatal(err)
	}
	wantValue(t, observationOf(t, health(t, e, "a"), codeDeclarationChanged, ""), false)
	if err := e.SetConfig(ctx, me("write", "app/config"), "app", []byte(healthConfig)); err != nil {
		t.Fatal(err)
	}
	wantValue(t, observationOf(t, health(t, e, "a"), codeDeclarationChanged, ""), true)
}
