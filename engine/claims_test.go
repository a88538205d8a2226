package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/kv"
)

var claimNow = time.Date(2026, 11, 29, 19, 0, 0, 0, time.UTC)

// requireCode fails unless err is a refusal with code.
func requireCode(t *testing.T, err error, code Code) {
	t.Helper()
	var r *Refusal
	if !errors.As(err, &r) {
		t.Fatalf("got %v, want refusal %s", err, code)
	}
	if r.Code != code {
		t.Fatalf("got refusal %s (%s), want %s", r.Code, r.Message, code)
	}
}

// recordSnapshot is the record and events of a stack as JSON, to compare before and after a refusal.
func recordSnapshot(t *testing.T, e *Engine, cockpit, stack string) string {
	t.Helper()
	r, err := e.Stack(cockpit, stack)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	events, err := e.events(cockpit, stack)
	if err != nil {
		t.Fatal(err)
	}
	return string(data) + "\n" + string(events)
}

// refusedUnchanged runs op, requires the refusal code, and requires the stack's record and events
// to be exactly as before.
func refusedUnchanged(t *testing.T, e *Engine, cockpit, stack string, code Code, op func() error) {
	t.Helper()
	before := recordSnapshot(t, e, cockpit, stack)
	requireCode(t, op(), code)
	if after := recordSnapshot(t, e, cockpit, stack); after != before {
		t.Fatalf("a %s refusal changed the stack:\nbefore %s\nafter  %s", code, before, after)
	}
}

func claim(t *testing.T, e *Engine, cockpit, stack, holder string) {
	t.Helper()
	path := cockpit + "/stacks/" + stack + "/holders/" + holder
	if err := e.Claim(context.Background(), me("create", path), cockpit, stack, holder, untracked(holder)); err != nil {
		t.Fatalf("claim %s: %v", path, err)
	}
}

func claimErr(e *Engine, cockpit, stack, holder string) error {
	path := cockpit + "/stacks/" + stack + "/holders/" + holder
	return e.Claim(context.Background(), me("create", path), cockpit, stack, holder, untracked(holder))
}

func stackRecord(t *testing.T, e *Engine, cockpit, stack string) Record {
	t.Helper()
	r, err := e.Stack(cockpit, stack)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkRecord(r); err != nil {
		t.Fatalf("record of %s/%s breaks its invariants: %v", cockpit, stack, err)
	}
	return r
}

func requirePorts(t *testing.T, r Record, want map[string]int) {
	t.Helper()
	if !r.Value.Lease.Active() {
		t.Fatalf("%s/%s has no active lease", r.Cockpit, r.Stack)
	}
	if !reflect.DeepEqual(r.Value.Lease.Ports, want) {
		t.Fatalf("%s/%s leased %v, want %v", r.Cockpit, r.Stack, r.Value.Lease.Ports, want)
	}
}

// holderNames lists the holders' names in name order.
func holderNames(v Value) []string {
	names := []string{}
	for _, h := range v.Holders {
		names = append(names, h.Name)
	}
	sort.Strings(names)
	return names
}

// --- pure transitions ---

var pureDecl = portdecl.Declaration{Step: 10, Count: 3, Bases: map[string]int{"HTTP": 20000, "DB": 21000}}

func leaseAt(t *testing.T, d portdecl.Declaration, offset int) *Lease {
	t.Helper()
	f, ok := d.FamilyAt(offset)
	if !ok {
		t.Fatalf("offset %d is not a candidate", offset)
	}
	return &Lease{Offset: offset, Ports: f.Ports, Declaration: d}
}

func newHolder(name string) Holder {
	return Holder{Name: name, CheckoutPath: "/src/" + name, UID: 1000}
}

func strPtr(s string) *string { return &s }

func TestAddHolder(t *testing.T) {
	alice := newHolder("alice").claimed(claimNow)
	many := Value{}
	for i := range maxHolders {
		many.Holders = append(many.Holders, newHolder(fmt.Sprintf("h%04d", i)).claimed(claimNow))
	}
	sortHolders(many.Holders)
	cases := []struct {
		name        string
		v           Value
		add         Holder
		wantChanged bool
		wantCode    Code
		wantHolders int
		wantLast    *string
	}{
		{name: "new", v: Value{}, add: newHolder("alice"), wantChanged: true, wantHolders: 1},
		{name: "existing same checkout", v: Value{Holders: []Holder{alice}}, add: newHolder("alice"), wantHolders: 1},
		{name: "existing other checkout", v: Value{Holders: []Holder{alice}},
			add: Holder{Name: "alice", CheckoutPath: "/elsewhere"}, wantCode: StateRecordMalformed, wantHolders: 1},
		{name: "limit", v: many, add: newHolder("late"), wantCode: ClaimHolderLimit, wantHolders: maxHolders},
		{name: "existing at the limit", v: many, add: newHolder("h0007"), wantHolders: maxHolders},
		{name: "re-claim clears lastReleasedHolder", v: Value{LastReleasedHolder: strPtr(holderID("alice"))},
			add: newHolder("alice"), wantChanged: true, wantHolders: 1},
		{name: "another keeps lastReleasedHolder", v: Value{LastReleasedHolder: strPtr(holderID("bob"))},
			add: newHolder("alice"), wantChanged: true, wantHolders: 1, wantLast: strPtr(holderID("bob"))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, changed, err := addHolder(tc.v, tc.add, claimNow.Add(time.Minute))
			if tc.wantCode != "" {
				requireCode(t, err, tc.wantCode)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if changed != tc.wantChanged || len(got.Holders) != tc.wantHolders {
				t.Fatalf("changed=%v holders=%d, want %v %d", changed, len(got.Holders), tc.wantChanged, tc.wantHolders)
			}
			if !reflect.DeepEqual(got.LastReleasedHolder, tc.wantLast) {
				t.Fatalf("lastReleasedHolder %v, want %v", got.LastReleasedHolder, tc.wantLast)
			}
			h, ok := got.Holder(tc.add.Name)
			if !ok || h.CheckoutID != checkoutID(tc.add.CheckoutPath) {
				t.Fatalf("holder %s missing or on another checkout: %+v", tc.add.Name, h)
			}
			if !changed && !reflect.DeepEqual(got, tc.v) {
				t.Fatalf("an unchanged add altered the value")
			}
		})
	}
}

func TestAddHolderKeepsHoldersSortedAndInputIntact(t *testing.T) {
	v := Value{}
	for _, name := range []string{"zed", "alice", "mike", "bob"} {
		before := append([]Holder(nil), v.Holders...)
		next, _, err := addHolder(v, newHolder(name), claimNow)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(v.Holders, before) {
			t.Fatalf("addHolder modified its input's holders")
		}
		v = next
	}
	if errs := checkHolders(v.Holders, nil); len(errs) != 0 {
		t.Fatalf("holders not valid after adds: %v", errs)
	}
}

func TestReleaseHolder(t *testing.T) {
	alice, bob := newHolder("alice").claimed(claimNow), newHolder("bob").claimed(claimNow)
	two := Value{Holders: []Holder{alice, bob}, Lease: leaseAt(t, pureDecl, 0)}
	sortHolders(two.Holders)
	drained := two
	drained.Drain = &Drain{}
	cases := []struct {
		name     string
		v        Value
		release  string
		wantCode Code
	}{
		{"drain reserved", drained, "bob", ClaimCoTenant},
		{"unknown holder", two, "carol", NotFound},
		{"last holder", Value{Holders: []Holder{alice}, Lease: leaseAt(t, pureDecl, 0)}, "alice", ClaimCoTenant},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := releaseHolder(tc.v, tc.release)
			requireCode(t, err, tc.wantCode)
		})
	}
	t.Run("normal", func(t *testing.T) {
		got, err := releaseHolder(two, "bob")
		if err != nil {
			t.Fatal(err)
		}
		if names := holderNames(got); !reflect.DeepEqual(names, []string{"alice"}) {
			t.Fatalf("holders %v, want [alice]", names)
		}
		if got.LastReleasedHolder == nil || *got.LastReleasedHolder != holderID("bob") {
			t.Fatalf("lastReleasedHolder %v, want bob's id", got.LastReleasedHolder)
		}
		if len(two.Holders) != 2 {
			t.Fatalf("releaseHolder modified its input")
		}
	})
}

func TestReleaseDead(t *testing.T) {
	tracked := func(name string, pid int) Holder {
		h := newHolder(name).claimed(claimNow)
		h.PID, h.ProcessStart = pid, fmt.Sprintf("proc:00000000-0000-0000-0000-000000000000:%d", pid)
		return h
	}
	alice, bob, carol := tracked("alice", 100), tracked("bob", 200), newHolder("carol").claimed(claimNow)
	holders := []Holder{alice, bob, carol}
	sortHolders(holders)
	lease := leaseAt(t, pureDecl, 0)
	v := Value{Holders: holders, Lease: lease}
	successor := newHolder("dave")

	changed := func(h Holder, f func(*Holder)) Holder { f(&h); return h }
	cases := []struct {
		name         string
		v            Value
		dead         []Holder
		successor    *Holder
		wantHolders  []string
		wantReleased int
		wantLast     string
	}{
		{name: "exact match released", v: v, dead: []Holder{alice}, successor: &successor,
			wantHolders: holderNames(Value{Holders: []Holder{bob, carol}}), wantReleased: 1, wantLast: "alice"},
		{name: "pid changed since observed", v: v, dead: []Holder{changed(alice, func(h *Holder) { h.PID = 101 })},
			wantHolders: holderNames(v)},
		{name: "claimedAt changed since observed", v: v,
			dead:        []Holder{changed(alice, func(h *Holder) { h.ClaimedAt = stamp(claimNow.Add(time.Second)) })},
			wantHolders: holderNames(v)},
		{name: "process start changed since observed", v: v,
			dead:        []Holder{changed(alice, func(h *Holder) { h.ProcessStart = "proc:00000000-0000-0000-0000-000000000000:1" })},
			wantHolders: holderNames(v)},
		{name: "one of two observations current", v: v,
			dead:        []Holder{changed(alice, func(h *Holder) { h.PID = 5 }), bob},
			wantHolders: holderNames(Value{Holders: []Holder{alice, carol}}), wantReleased: 1, wantLast: "bob"},
		{name: "all dead with successor takes over", v: Value{Holders: []Holder{alice}, Lease: lease},
			dead: []Holder{alice}, successor: &successor, wantHolders: []string{"dave"}, wantReleased: 1, wantLast: "alice"},
		{name: "all dead without successor", v: Value{Holders: []Holder{alice}, Lease: lease},
			dead: []Holder{alice}, wantHolders: []string{}, wantReleased: 1, wantLast: "alice"},
		{name: "drain reserved", v: Value{Holders: []Holder{alice}, Lease: lease, Drain: &Drain{}},
			dead: []Holder{alice}, successor: &successor, wantHolders: []string{"alice"}},
		{name: "no lease", v: Value{Holders: []Holder{alice}},
			dead: []Holder{alice}, successor: &successor, wantHolders: []string{"alice"}},
		{name: "released lease", v: Value{Holders: []Holder{alice}, Lease: &Lease{Offset: 0, Ports: lease.Ports, Released: true, Declaration: pureDecl}},
			dead: []Holder{alice}, successor: &successor, wantHolders: []string{"alice"}},
		{name: "nothing observed dead", v: v, successor: &successor, wantHolders: holderNames(v)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, released := releaseDead(tc.v, tc.dead, tc.successor, claimNow.Add(time.Hour))
			if names := holderNames(got); !reflect.DeepEqual(names, tc.wantHolders) {
				t.Fatalf("holders %v, want %v", names, tc.wantHolders)
			}
			if len(released) != tc.wantReleased {
				t.Fatalf("released %d, want %d", len(released), tc.wantReleased)
			}
			if tc.wantReleased == 0 {
				if !reflect.DeepEqual(got, tc.v) {
					t.Fatalf("nothing released but the value changed")
				}
				return
			}
			if got.LastReleasedHolder == nil || *got.LastReleasedHolder != holderID(tc.wantLast) {
				t.Fatalf("lastReleasedHolder %v, want %s's id", got.LastReleasedHolder, tc.wantLast)
			}
			if !reflect.DeepEqual(got.Lease, tc.v.Lease) {
				t.Fatalf("the lease changed: %+v", got.Lease)
			}
		})
	}
}

// probes records the listener probes leaseFamily makes.
type probes struct {
	calls [][]int
	busy  map[int]bool
	err   error
}

func (p *probes) listening(ports []int) ([]int, error) {
	p.calls = append(p.calls, append([]int(nil), ports...))
	if p.err != nil {
		return nil, p.err
	}
	var busy []int
	for _, port := range ports {
		if p.busy[port] {
			busy = append(busy, port)
		}
	}
	return busy, nil
}

func ownedBy(ports ...int) func(int) (string, error) {
	return func(port int) (string, error) {
		for _, p := range ports {
			if p == port {
				return "other/stack", nil
			}
		}
		return "", nil
	}
}

func TestLeaseFamily(t *testing.T) {
	t.Parallel()
	cfg := portdecl.Config{Declaration: pureDecl, Entrypoints: []portdecl.Entrypoint{{Name: "web", Port: "HTTP", Path: "/"}}}
	changedDecl := portdecl.Declaration{Step: 10, Count: 3, Bases: map[string]int{"HTTP": 30000, "DB": 31000}}
	cases := []struct {
		name       string
		current    *Lease
		retained   bool
		active     int
		occupied   []int
		busy       []int
		probeErr   error
		wantOffset int
		wantCode   Code
		wantProbes [][]int // nil: not checked
		wantPassed string  // in why the previous family was passed ("": none was)
	}{
		{name: "first family", wantOffset: 0, wantProbes: [][]int{{20000, 21000}}},
		{name: "occupied skipped", occupied: []int{21000}, wantOffset: 10, wantProbes: [][]int{{20010, 21010}}},
		{name: "occupied twice skipped", occupied: []int{20000, 21010}, wantOffset: 20},
		{name: "listener skipped", busy: []int{20000}, wantOffset: 10, wantProbes: [][]int{{20000, 21000}, {20010, 21010}}},
		{name: "listeners everywhere", busy: []int{20000, 21010, 20020}, wantCode: PortFamilyCollision},
		{name: "one listener among leases", occupied: []int{20000, 20020}, busy: []int{21010}, wantCode: PortFamilyCollision},
		{name: "index-only exhaustion", occupied: []int{20000, 20010, 21020}, wantCode: PortLeaseExhausted, wantProbes: [][]int{}},
		{name: "count reached", active: 3, wantCode: PortLeaseExhausted, wantProbes: [][]int{}},
		{name: "retained lease not probed", current: leaseAt(t, pureDecl, 10), retained: true, active: 3,
			busy: []int{20010, 21010}, wantOffset: 10, wantProbes: [][]int{}},
		{name: "retained lease occupied by another", current: leaseAt(t, pureDecl, 10), retained: true,
			occupied: []int{20010}, wantCode: PortLeaseExhausted},
		{name: "unretained lease probes its own offset", current: leaseAt(t, pureDecl, 20), active: 3,
			wantOffset: 20, wantProbes: [][]int{{20020, 21020}}},
		{name: "unretained lease with a listener", current: leaseAt(t, pureDecl, 20),
			busy: []int{21020}, wantCode: PortFamilyCollision, wantProbes: [][]int{{20020, 21020}}},
		{name: "declaration changed", current: leaseAt(t, changedDecl, 0), retained: true, wantCode: ConfigChangedDuringExecution},
		{name: "offset not a candidate", current: &Lease{Offset: 5, Ports: map[string]int{"HTTP": 20005, "DB": 21005}, Declaration: pureDecl},
			retained: true, wantCode: ConfigChangedDuringExecution},
		{name: "released lease takes its family again", current: &Lease{Offset: 10, Ports: map[string]int{"HTTP": 20010, "DB": 21010}, Released: true, Declaration: pureDecl},
			wantOffset: 10, wantProbes: [][]int{{20010, 21010}}},
		{name: "released lease whose family is leased", current: &Lease{Offset: 10, Ports: map[string]int{"HTTP": 20010, "DB": 21010}, Released: true, Declaration: pureDecl},
			occupied: []int{21010}, wantOffset: 0, wantPassed: "previous family 20010,21010 is taken (leased by other/stack)"},
		{name: "released lease whose family has a listener", current: &Lease{Offset: 20, Ports: map[string]int{"HTTP": 20020, "DB": 21020}, Released: true, Declaration: pureDecl},
			busy: []int{20020}, wantOffset: 0, wantPassed: "previous family 20020,21020 is taken (host listener on 20020)"},
		{name: "released lease off the declaration", current: &Lease{Offset: 40, Ports: map[string]int{"HTTP": 20040, "DB": 21040}, Released: true, Declaration: changedDecl},
			wantOffset: 0, wantPassed: "previous family (offset 40) is not a candidate"},
		{name: "undecidable listener", probeErr: errors.New("no /proc"), wantCode: PortListenerEvidenceInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &probes{busy: map[int]bool{}, err: tc.probeErr}
			for _, port := range tc.busy {
				p.busy[port] = true
			}
			listening := p.listening
			if tc.retained && tc.current.Active() {
				listening = func(ports []int) ([]int, error) {
					t.Errorf("a retained lease was probed for listeners: %v", ports)
					return nil, nil
				}
			}
			var passed string
			got, err := leaseFamily(tc.current, tc.retained, leaseInputs{
				config: cfg, activeLeases: tc.active, occupiedBy: ownedBy(tc.occupied...), effects: stepEffects{probe: listening},
				passedPrevious: func(why string) { passed = why },
			})
			if tc.wantPassed == "" && passed != "" || !strings.Contains(passed, tc.wantPassed) {
				t.Errorf("passed previous family: %q, want %q", passed, tc.wantPassed)
			}
			if tc.wantProbes != nil && !(len(tc.wantProbes) == 0 && len(p.calls) == 0) && !reflect.DeepEqual(p.calls, tc.wantProbes) {
				t.Errorf("probes %v, want %v", p.calls, tc.wantProbes)
			}
			if tc.wantCode != "" {
				requireCode(t, err, tc.wantCode)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := leaseAt(t, pureDecl, tc.wantOffset)
			if got.Offset != want.Offset || !reflect.DeepEqual(got.Ports, want.Ports) || got.Released {
				t.Fatalf("leased %+v, want offset %d %v", got, want.Offset, want.Ports)
			}
			if !got.Declaration.Equal(pureDecl) {
				t.Fatalf("lease does not carry the config: %+v", got)
			}
			if err := checkLease(got); err != nil {
				t.Fatalf("lease breaks its invariants: %v", err)
			}
		})
	}
}

func TestLeaseFamilyRefusalNamesOccupiedCandidates(t *testing.T) {
	p := &probes{busy: map[int]bool{21010: true}}
	_, err := leaseFamily(nil, false, leaseInputs{
		config: portdecl.Config{Declaration: pureDecl}, occupiedBy: ownedBy(20000, 20020), effects: stepEffects{probe: p.listening},
	})
	requireCode(t, err, PortFamilyCollision)
	r := AsRefusal(err)
	for _, want := range []string{"20000,21000 (leased by other/stack)", "20010,21010 (host listener on 21010)", "stop the named host listener"} {
		if !strings.Contains(r.Message+r.Fix, want) {
			t.Errorf("refusal %q / %q does not name %q", r.Message, r.Fix, want)
		}
	}
}

func TestLeaseFamilyIndexErrorIsReturned(t *testing.T) {
	t.Parallel()
	broken := errors.New("index unreadable")
	_, err := leaseFamily(nil, false, leaseInputs{
		config:     portdecl.Config{Declaration: pureDecl},
		occupiedBy: func(int) (string, error) { return "", broken },
		effects:    stepEffects{probe: (&probes{}).listening},
	})
	if !errors.Is(err, broken) {
		t.Fatalf("got %v, want the index error", err)
	}
}

// --- claims on the store ---

func TestClaimWalkthrough(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	if r := stackRecord(t, e, "app", "main"); r.Revision != 0 || len(r.Value.Holders) != 0 || r.Value.Lease != nil {
		t.Fatalf("a new stack is not empty at revision 0: %+v", r)
	}
	claim(t, e, "app", "main", "alice")
	r := stackRecord(t, e, "app", "main")
	if r.Revision != 1 || r.Value.Lease.Offset != 0 {
		t.Fatalf("revision %d offset %d, want 1 and 0", r.Revision, r.Value.Lease.Offset)
	}
	requirePorts(t, r, map[string]int{"HTTP": 18080, "DB": 15432})
	h, ok := r.Value.Holder("alice")
	if !ok || h.CheckoutPath != "/src/alice" || h.PID != 0 || h.UID != me("", "").UID {
		t.Fatalf("holder alice: %+v", h)
	}
	ports, err := e.Ports()
	if err != nil {
		t.Fatal(err)
	}
	want := []PortOwner{
		{Port: 15432, Cockpit: "app", Stack: "main", Key: "DB", Offset: 0},
		{Port: 18080, Cockpit: "app", Stack: "main", Key: "HTTP", Offset: 0},
	}
	if !reflect.DeepEqual(ports, want) {
		t.Fatalf("port index %+v, want %+v", ports, want)
	}

	// The same claim again changes nothing.
	claim(t, e, "app", "main", "alice")
	if r := stackRecord(t, e, "app", "main"); r.Revision != 1 {
		t.Fatalf("a repeated claim moved the revision to %d", r.Revision)
	}

	// A co-tenant joins the same lease.
	claim(t, e, "app", "main", "bob")
	r = stackRecord(t, e, "app", "main")
	if r.Revision != 2 || !reflect.DeepEqual(holderNames(r.Value), []string{"alice", "bob"}) {
		t.Fatalf("revision %d holders %v after bob joined", r.Revision, holderNames(r.Value))
	}
	requirePorts(t, r, map[string]int{"HTTP": 18080, "DB": 15432})

	// A second stack gets the next family.
	if err := e.CreateStack(context.Background(), me("mkdir", "app/stacks/feature"), "app", "feature"); err != nil {
		t.Fatal(err)
	}
	claim(t, e, "app", "feature", "carol")
	requirePorts(t, stackRecord(t, e, "app", "feature"), map[string]int{"HTTP": 18090, "DB": 15442})
}

func TestClaimSkipsFamiliesLeasedByAnotherCockpit(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main", "feature")
	claim(t, e, "app", "main", "alice")
	claim(t, e, "app", "feature", "bob")
	newCockpit(t, e, "other", "[ports]\nstep = 10\ncount = 5\n[ports.bases]\nWEB = 18080\nCACHE = 16379\n", "main")
	claim(t, e, "other", "main", "carol")
	r := stackRecord(t, e, "other", "main")
	if r.Value.Lease.Offset != 20 {
		t.Fatalf("offset %d, want 20 (0 and 10 are leased by app)", r.Value.Lease.Offset)
	}
	requirePorts(t, r, map[string]int{"WEB": 18100, "CACHE": 16399})
}

func TestClaimCountExhaustion(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", "[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 18080\n", "a", "b", "c")
	claim(t, e, "app", "a", "alice")
	claim(t, e, "app", "b", "alice")
	refusedUnchanged(t, e, "app", "c", PortLeaseExhausted, func() error { return claimErr(e, "app", "c", "alice") })
	// A co-tenant of a leased stack is not counted again.
	claim(t, e, "app", "a", "bob")
}

// The count bounds a cockpit's active leases even when free candidates remain, as they do once
// the declaration moved to other bases.
func TestClaimCountCoversLeasesUnderAnOldDeclaration(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", "[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 18080\n", "a", "b", "c")
	claim(t, e, "app", "a", "alice")
	claim(t, e, "app", "b", "alice")
	moved := "[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 28080\n"
	if err := e.SetConfig(context.Background(), me("write", "app/config"), "app", []byte(moved)); err != nil {
		t.Fatal(err)
	}
	refusedUnchanged(t, e, "app", "c", PortLeaseExhausted, func() error { return claimErr(e, "app", "c", "alice") })
	if msg := AsRefusal(claimErr(e, "app", "c", "alice")).Message; !strings.Contains(msg, "maximum 2 concurrent stacks") {
		t.Fatalf("refusal %q does not name the count", msg)
	}
}

// listenAtFamilies returns a port p on which it listens, such that p+20 is listened on too; the
// listeners close when the test ends. With bases HTTP=p and DB=p+5, step 10 and count 3, they
// block the families at offsets 0 and 20.
func listenAtFamilies(t *testing.T) int {
	t.Helper()
	for range 20 {
		first, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := first.Addr().(*net.TCPAddr).Port
		if p+25 > 65535 {
			first.Close()
			continue
		}
		third, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+20))
		if err != nil {
			first.Close()
			continue
		}
		t.Cleanup(func() { first.Close(); third.Close() })
		return p
	}
	t.Fatal("found no free port pair")
	return 0
}

func TestClaimSkipsHostListeners(t *testing.T) {
	p := listenAtFamilies(t)
	e := newEngine(t)
	config := fmt.Sprintf("[ports]\nstep = 10\ncount = 3\n[ports.bases]\nHTTP = %d\nDB = %d\n", p, p+5)
	newCockpit(t, e, "app", config, "a", "b")
	claim(t, e, "app", "a", "alice")
	requirePorts(t, stackRecord(t, e, "app", "a"), map[string]int{"HTTP": p + 10, "DB": p + 15})
	refusedUnchanged(t, e, "app", "b", PortFamilyCollision, func() error { return claimErr(e, "app", "b", "bob") })
	msg := AsRefusal(claimErr(e, "app", "b", "bob")).Message
	for _, want := range []string{fmt.Sprintf("host listener on %d", p), "leased by app/a", fmt.Sprintf("host listener on %d", p+20)} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not name %q", msg, want)
		}
	}
}

func TestRetainedLeaseIgnoresItsOwnListeners(t *testing.T) {
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	claim(t, e, "app", "main", "alice")
	// The stack's own services now listen on its ports; a co-tenant still joins.
	l, err := net.Listen("tcp", "127.0.0.1:18080")
	if err != nil {
		t.Skipf("port 18080 is taken on this host: %v", err)
	}
	defer l.Close()
	claim(t, e, "app", "main", "bob")
	requirePorts(t, stackRecord(t, e, "app", "main"), map[string]int{"HTTP": 18080, "DB": 15432})
}

func TestClaimWithoutConfig(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", "", "main")
	refusedUnchanged(t, e, "app", "main", PortFamilyOutOfRange, func() error { return claimErr(e, "app", "main", "alice") })
	if fix := AsRefusal(claimErr(e, "app", "main", "alice")).Fix; fix != "write app/config first" {
		t.Fatalf("fix %q", fix)
	}
}

func TestClaimAfterConfigChange(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "main", "feature")
	claim(t, e, "app", "main", "alice")
	newConfig := "[ports]\nstep = 10\ncount = 20\n[ports.bases]\nHTTP = 19080\nDB = 16432\n"
	if err := e.SetConfig(ctx, me("write", "app/config"), "app", []byte(newConfig)); err != nil {
		t.Fatal(err)
	}
	refusedUnchanged(t, e, "app", "main", ConfigChangedDuringExecution, func() error { return claimErr(e, "app", "main", "bob") })
	// The lease keeps its declaration; its existing holder claiming again is refused too
	// (TestLeasePortFamilyExistingHolderAfterDeclarationChange).
	r := stackRecord(t, e, "app", "main")
	requirePorts(t, r, map[string]int{"HTTP": 18080, "DB": 15432})
	if r.Value.Lease.Declaration.Bases["HTTP"] != 18080 || r.Revision != 1 {
		t.Fatalf("the old lease changed: %+v at revision %d", r.Value.Lease, r.Revision)
	}
	claim(t, e, "app", "feature", "bob")
	f := stackRecord(t, e, "app", "feature")
	requirePorts(t, f, map[string]int{"HTTP": 19080, "DB": 16432})
	if f.Value.Lease.Declaration.Bases["HTTP"] != 19080 {
		t.Fatalf("the new lease was taken under %+v", f.Value.Lease.Declaration)
	}
}

func TestClaimRefusesOtherCheckout(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	claim(t, e, "app", "main", "alice")
	refusedUnchanged(t, e, "app", "main", StateRecordMalformed, func() error {
		return e.Claim(context.Background(), me("create", "x"), "app", "main", "alice", &Holder{CheckoutPath: "/src/elsewhere"})
	})
}

func TestRelease(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "main")
	claim(t, e, "app", "main", "alice")
	c := me("unlink", "app/stacks/main/holders/alice")
	refusedUnchanged(t, e, "app", "main", ClaimCoTenant, func() error { return e.Release(ctx, c, "app", "main", "alice") })
	refusedUnchanged(t, e, "app", "main", NotFound, func() error { return e.Release(ctx, c, "app", "main", "nobody") })
	claim(t, e, "app", "main", "bob")
	if err := e.Release(ctx, me("unlink", "app/stacks/main/holders/bob"), "app", "main", "bob"); err != nil {
		t.Fatal(err)
	}
	r := stackRecord(t, e, "app", "main")
	if r.Revision != 3 || !reflect.DeepEqual(holderNames(r.Value), []string{"alice"}) ||
		r.Value.LastReleasedHolder == nil || *r.Value.LastReleasedHolder != holderID("bob") {
		t.Fatalf("after releasing bob: revision %d holders %v last %v", r.Revision, holderNames(r.Value), r.Value.LastReleasedHolder)
	}
	requirePorts(t, r, map[string]int{"HTTP": 18080, "DB": 15432})
	// bob claiming again clears lastReleasedHolder.
	claim(t, e, "app", "main", "bob")
	if r := stackRecord(t, e, "app", "main"); r.Value.LastReleasedHolder != nil {
		t.Fatalf("lastReleasedHolder %v after bob re-claimed", *r.Value.LastReleasedHolder)
	}
}

func TestClaimUnknownStack(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig)
	requireCode(t, claimErr(e, "app", "missing", "alice"), NotFound)
	requireCode(t, claimErr(e, "nope", "main", "alice"), NotFound)
}

// An unknown checkout (a working directory the daemon may not read: another user's, for a daemon
// that is not root) is no evidence of another checkout: a touch from one re-binds, a claim of the
// name from one claims it already, and a holder created with one may be told its checkout later.
// A known other checkout is still refused.
func TestUnknownCheckoutIsNoOtherCheckout(t *testing.T) {
	c := me("write", "app/stacks/main/holders/alice")
	now := time.Now()
	alice := Holder{Name: "alice", UID: c.UID, CheckoutPath: "/src/alice", PID: 1, ProcessStart: "a"}.claimed(now)
	bob := Holder{Name: "bob", UID: c.UID, PID: 1, ProcessStart: "a"}.claimed(now) // created from an unknown cwd
	holders := []Holder{alice, bob}
	sortHolders(holders)
	r := Record{Value: Value{Holders: holders}}

	v, err := rebindHolder(r, c, Holder{Name: "alice", UID: c.UID, PID: 2, ProcessStart: "b"}, cockpitMeta{})
	if h, _ := v.Holder("alice"); err != nil || h.PID != 2 || h.CheckoutPath != "/src/alice" {
		t.Errorf("touch of alice from an unknown cwd: %v, holder %+v", err, h)
	}
	v, err = rebindHolder(r, c, Holder{Name: "bob", UID: c.UID, CheckoutPath: "/src/anywhere", PID: 2, ProcessStart: "b"}, cockpitMeta{})
	if h, _ := v.Holder("bob"); err != nil || h.PID != 2 || h.CheckoutPath != "" {
		t.Errorf("touch of bob (checkout unknown) from /src/anywhere: %v, holder %+v", err, h)
	}
	_, err = rebindHolder(r, c, Holder{Name: "alice", UID: c.UID, CheckoutPath: "/src/other", PID: 2, ProcessStart: "b"}, cockpitMeta{})
	requireCode(t, err, StateRecordMalformed)

	if _, added, err := addHolder(r.Value, Holder{Name: "alice", UID: c.UID}, now); err != nil || added {
		t.Errorf("a claim of alice from an unknown cwd: added %v, %v; want claimed already", added, err)
	}
	_, _, err = addHolder(r.Value, Holder{Name: "alice", UID: c.UID, CheckoutPath: "/src/other"}, now)
	requireCode(t, err, StateRecordMalformed)

	v, err = setHolder(r, c, holderWrite{Holder: Holder{Name: "bob", CheckoutPath: "/src/bob"}})
	if h, _ := v.Holder("bob"); err != nil || h.CheckoutPath != "/src/bob" || h.CheckoutID != checkoutID("/src/bob") {
		t.Errorf("a later write naming bob's checkout: %v, holder %+v", err, h)
	}
	_, err = setHolder(r, c, holderWrite{Holder: Holder{Name: "alice", CheckoutPath: "/src/other"}})
	requireCode(t, err, StateRecordMalformed)
}

// A touch of a holder already bound to the toucher's session is answered from the current
// record; one that binds it anew commits; a refused one changes nothing.
func TestTouchCommitsOnlyWhatItChanges(t *testing.T) {
	t.Parallel()
	base := newEngine(t)
	store := &deadlines{Store: base.db}
	e := New(store)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "main")
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	touch := func(name string) error {
		return e.Rebind(ctx, me("touch", "app/stacks/main/holders/"+name), "app", "main", name)
	}
	if err := e.Claim(ctx, me("create", "app/stacks/main/holders/me"), "app", "main", "me", nil); err != nil {
		t.Fatal(err)
	}
	before, commits := stackRecord(t, e, "app", "main"), len(store.seen)
	if err := touch("me"); err != nil {
		t.Fatal(err)
	}
	if n, r := len(store.seen)-commits, stackRecord(t, e, "app", "main"); n != 0 || r.Revision != before.Revision {
		t.Fatalf("a touch that changes nothing took %d transactions, revision %d → %d", n, before.Revision, r.Revision)
	}

	sleeper := exec.Command("sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	if err := e.Claim(ctx, me("create", "app/stacks/main/holders/job"), "app", "main", "job", &Holder{PID: sleeper.Process.Pid, CheckoutPath: cwd}); err != nil {
		t.Fatal(err)
	}
	commits = len(store.seen)
	if err := touch("job"); err != nil {
		t.Fatal(err)
	}
	job, _ := stackRecord(t, e, "app", "main").Value.Holder("job")
	if n := len(store.seen) - commits; n != 1 || job.PID == sleeper.Process.Pid {
		t.Fatalf("a touch from another session: %d transactions, holder's pid %d (the sleeper's %d)", n, job.PID, sleeper.Process.Pid)
	}

	refusedUnchanged(t, e, "app", "main", NotFound, func() error { return touch("nobody") })
}

// A lease counts against a uid that holds its stack now: when the uid that took it releases its
// last holder while another uid's stays, the lease passes to that uid, which is then at its
// bound, and the taker leases again; the counts agree with the records (Verify).
func TestLeaseCountsAgainstItsHolderNow(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	e.BoundLeases(1)
	const taker, joiner = 1000, 1001
	newCockpit(t, e, "app", exampleConfig, "main", "other", "third")
	if err := e.ChmodStack(ctx, me("chmod", "app/stacks/main"), "app", "main", 0o777); err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct {
		name string
		uid  uint32
	}{{"a", taker}, {"b", joiner}} {
		if err := e.Claim(ctx, callerAs(h.uid, "create", "h"), "app", "main", h.name, untracked(h.name)); err != nil {
			t.Fatal(err)
		}
	}
	if uid := stackRecord(t, e, "app", "main").Value.Lease.UID; uid == nil || *uid != taker {
		t.Fatalf("the lease counts against %v, want the taker %d", uid, taker)
	}
	if err := e.ChmodStack(ctx, me("chmod", "app/stacks/other"), "app", "other", 0o777); err != nil {
		t.Fatal(err)
	}
	refusedUnchanged(t, e, "app", "other", PortLeaseUIDLimit, func() error {
		return e.Claim(ctx, callerAs(taker, "create", "h"), "app", "other", "a", untracked("a"))
	})
	if err := e.Release(ctx, callerAs(taker, "unlink", "h"), "app", "main", "a"); err != nil {
		t.Fatal(err)
	}
	if uid := stackRecord(t, e, "app", "main").Value.Lease.UID; uid == nil || *uid != joiner {
		t.Fatalf("after the taker's release the lease counts against %v, want %d", uid, joiner)
	}
	if err := e.Claim(ctx, callerAs(taker, "create", "h"), "app", "other", "a", untracked("a")); err != nil {
		t.Fatalf("the taker, holding no lease now: %v", err)
	}
	if err := e.ChmodStack(ctx, me("chmod", "app/stacks/third"), "app", "third", 0o777); err != nil {
		t.Fatal(err)
	}
	refusedUnchanged(t, e, "app", "third", PortLeaseUIDLimit, func() error {
		return e.Claim(ctx, callerAs(joiner, "create", "h"), "app", "third", "b", untracked("b"))
	})
	if problems, _, err := Verify(e.db); err != nil || len(problems) > 0 {
		t.Fatalf("verify: %v %v", problems, err)
	}
}

// The seeds' leasePortFamily refuses a holder the stack has already with
// CONFIG_CHANGED_DURING_EXECUTION when the lease was taken under another declaration, as it
// refuses a new one: here that holder's claim and its touch (a claim run again), tracked or not.
// The record stays as it was.
func TestLeasePortFamilyExistingHolderAfterDeclarationChange(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "main")
	if err := e.Claim(ctx, me("create", "app/stacks/main/holders/me"), "app", "main", "me", nil); err != nil {
		t.Fatal(err)
	}
	claim(t, e, "app", "main", "alice") // untracked: pid=none
	touch := func(name string) func() error {
		return func() error { return e.Rebind(ctx, me("touch", "app/stacks/main/holders/"+name), "app", "main", name) }
	}
	// Unchanged declaration: a touch and a claim again both change nothing.
	before := recordSnapshot(t, e, "app", "main")
	if err := touch("me")(); err != nil {
		t.Fatal(err)
	}
	if err := claimErr(e, "app", "main", "alice"); err != nil {
		t.Fatal(err)
	}
	if after := recordSnapshot(t, e, "app", "main"); after != before {
		t.Fatalf("a touch and a claim again changed the stack:\nbefore %s\nafter  %s", before, after)
	}
	counted := strings.Replace(exampleConfig, "count = 20", "count = 21", 1)
	if err := e.SetConfig(ctx, me("write", "app/config"), "app", []byte(counted)); err != nil {
		t.Fatal(err)
	}
	refusedUnchanged(t, e, "app", "main", ConfigChangedDuringExecution, touch("me"))
	refusedUnchanged(t, e, "app", "main", ConfigChangedDuringExecution, touch("alice"))
	refusedUnchanged(t, e, "app", "main", ConfigChangedDuringExecution, func() error { return claimErr(e, "app", "main", "alice") })
}

// drainS drains stack s fully (sleep: request, attempt, outcome), releasing its lease.
func drainS(t *testing.T, e *Engine) {
	t.Helper()
	mustStep(t, e, reserveText(t, e, "sleep"))
	mustStep(t, e, startExecutor(e, -1))
	assertReleased(t, e, mustStep(t, e, publish(e, true, "")))
}

// A drained stack claims its previous family again, kept in its record across a reopen of the
// store, although an earlier family is free; when another stack took it meanwhile, it gets the
// first free one and its claim's events line says why.
func TestClaimTakesThePreviousFamilyAgain(t *testing.T) {
	dir := t.TempDir()
	db, err := kv.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	e := New(db)
	newCockpit(t, e, "app", exampleConfig, "s", "t", "u")
	// A host listener on the first family sends s to the second (if another process listens
	// there already, so much the better).
	if l, err := net.Listen("tcp", "127.0.0.1:18080"); err == nil {
		claimStack(t, e, "s", "me", untracked("me"))
		l.Close()
	} else {
		claimStack(t, e, "s", "me", untracked("me"))
	}
	if offset := stackOf(t, e).Value.Lease.Offset; offset != 10 {
		t.Fatalf("stack s leased offset %d, want 10 past the listener", offset)
	}
	drainS(t, e)
	db.Close()
	if db, err = kv.Open(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	e = New(db)
	claimStack(t, e, "s", "me", untracked("me"))
	if offset := stackOf(t, e).Value.Lease.Offset; offset != 10 {
		t.Fatalf("stack s leased offset %d again, want its previous 10 (0 is the first free)", offset)
	}
	events, _ := e.events("app", "s")
	if strings.Contains(string(events), "previous family") {
		t.Fatalf("the claim that took the previous family again says it did not:\n%s", events)
	}

	drainS(t, e)
	claimStack(t, e, "u", "you", untracked("you")) // offset 0
	claimStack(t, e, "t", "you", untracked("you")) // offset 10, the first free: s's previous
	claimStack(t, e, "s", "me", untracked("me"))
	if offset := stackOf(t, e).Value.Lease.Offset; offset != 20 {
		t.Fatalf("stack s leased offset %d, want 20, the first free", offset)
	}
	events, _ = e.events("app", "s")
	lines := strings.Split(strings.TrimSpace(string(events)), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "the stack's previous family 15442,18090 is taken (leased by app/t)") {
		t.Fatalf("the claim's events line does not say why the previous family was passed: %s", last)
	}
}
