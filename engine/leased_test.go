package engine

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
)

// A cockpit's leased ports (l/<cockpit>): kept with every lease change, read by a new lease to
// pass its cockpit's families without reading their index entries, written again for a store
// from before them, and checked by Verify.

func leasedPortsOf(t *testing.T, e *Engine, cockpit string) ([]int, bool) {
	t.Helper()
	var ports []int
	var known bool
	if err := e.db.View(func(tx storage.Txn) error {
		var err error
		ports, known, err = leasedPorts(tx, cockpit)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ports, known
}

// portsOfLeases are the sorted ports of the stacks' active leases, as their records say.
func portsOfLeases(t *testing.T, e *Engine, cockpit string, stacks ...string) []int {
	t.Helper()
	var ports []int
	for _, s := range stacks {
		r, err := e.Stack(cockpit, s)
		if err != nil {
			t.Fatal(err)
		}
		if r.Value.Lease.Active() {
			ports = slices.AppendSeq(ports, maps.Values(r.Value.Lease.Ports))
		}
	}
	slices.Sort(ports)
	return ports
}

func requireLeasedPorts(t *testing.T, e *Engine, cockpit string, stacks ...string) {
	t.Helper()
	got, known := leasedPortsOf(t, e, cockpit)
	if want := portsOfLeases(t, e, cockpit, stacks...); !known || !slices.Equal(got, want) {
		t.Fatalf("leased ports %v (known %v), the leases hold %v", got, known, want)
	}
}

func claimOffset(t *testing.T, e *Engine, cockpit, stack string) int {
	t.Helper()
	if err := e.Claim(context.Background(), me("create", stack), cockpit, stack, "h", untracked("h")); err != nil {
		t.Fatal(err)
	}
	r, err := e.Stack(cockpit, stack)
	if err != nil {
		t.Fatal(err)
	}
	return r.Value.Lease.Offset
}

// sleepStack drains the stack with sleep, which releases its lease.
func sleepStack(t *testing.T, e *Engine, cockpit, stack string) {
	t.Helper()
	ctx := context.Background()
	r, err := e.Stack(cockpit, stack)
	if err != nil {
		t.Fatal(err)
	}
	c := me("write", cockpit+"/stacks/"+stack+"/drain")
	if err := e.ReserveDrain(ctx, c, cockpit, stack, DrainRequest{Purpose: "sleep", Holder: "h"}, r.Revision); err != nil {
		t.Fatal(err)
	}
	if err := e.StartAttempt(ctx, c, cockpit, stack, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.PublishOutcome(ctx, c, cockpit, stack, Outcome{Success: true}); err != nil {
		t.Fatal(err)
	}
	if r, err := e.Stack(cockpit, stack); err != nil || r.Value.Lease.Active() {
		t.Fatalf("the sleep left the lease active: %v", err)
	}
}

func TestLeasedPortsFollowLeases(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "a", "b", "c", "d")
	for i, s := range []string{"a", "b", "c"} {
		if offset := claimOffset(t, e, "app", s); offset != 10*i {
			t.Fatalf("stack %s leased offset %d, want %d", s, offset, 10*i)
		}
		requireLeasedPorts(t, e, "app", "a", "b", "c")
	}
	requireVerified(t, e.db)
	sleepStack(t, e, "app", "b")
	requireLeasedPorts(t, e, "app", "a", "c")
	// The family b let go is the first free one again, though its neighbours are passed unread.
	if offset := claimOffset(t, e, "app", "d"); offset != 10 {
		t.Fatalf("stack d leased offset %d, want 10", offset)
	}
	requireLeasedPorts(t, e, "app", "a", "c", "d")
	requireVerified(t, e.db)
	for _, s := range []string{"a", "c", "d"} {
		sleepStack(t, e, "app", s)
	}
	if err := e.db.View(func(tx storage.Txn) error {
		_, err := tx.Get(leasedPortsKey("app"))
		return err
	}); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("a cockpit without leases keeps its leased ports' key: %v", err)
	}
	requireVerified(t, e.db)
}

func TestLeasedPortsOfAnOlderStore(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "a", "b", "c", "d", "e")
	for _, s := range []string{"a", "b", "c"} {
		claimOffset(t, e, "app", s)
	}
	// A store written before the key: leases, and no leased ports.
	if err := e.db.Update(context.Background(), func(tx storage.Txn) error { return tx.Delete(leasedPortsKey("app")) }); err != nil {
		t.Fatal(err)
	}
	if _, known := leasedPortsOf(t, e, "app"); known {
		t.Fatal("leased ports known without their key")
	}
	requireVerified(t, e.db) // not a violation: the next lease change writes them
	if offset := claimOffset(t, e, "app", "d"); offset != 30 {
		t.Fatalf("stack d leased offset %d, want 30", offset)
	}
	requireLeasedPorts(t, e, "app", "a", "b", "c", "d")
	sleepStack(t, e, "app", "b")
	if offset := claimOffset(t, e, "app", "e"); offset != 10 {
		t.Fatalf("stack e leased offset %d, want 10", offset)
	}
	requireLeasedPorts(t, e, "app", "a", "c", "d", "e")
	requireVerified(t, e.db)
}

func TestLeasedPortsLeftWithoutLeasesAreIgnored(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "a", "b")
	// Ports named for a cockpit that leases nothing (a removed cockpit's, say): those of the
	// second family, which the second lease must still find free.
	if err := e.db.Update(context.Background(), func(tx storage.Txn) error {
		return tx.Set(leasedPortsKey("app"), appendPorts(nil, []int{15442, 18090}))
	}); err != nil {
		t.Fatal(err)
	}
	if offset := claimOffset(t, e, "app", "a"); offset != 0 {
		t.Fatalf("stack a leased offset %d, want 0", offset)
	}
	requireLeasedPorts(t, e, "app", "a")
	if offset := claimOffset(t, e, "app", "b"); offset != 10 {
		t.Fatalf("stack b leased offset %d, want 10", offset)
	}
	requireLeasedPorts(t, e, "app", "a", "b")
}

func TestVerifyFindsWrongLeasedPorts(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "a", "b")
	claimOffset(t, e, "app", "a")
	claimOffset(t, e, "app", "b")
	wrong := portsOfLeases(t, e, "app", "a")
	if err := e.db.Update(context.Background(), func(tx storage.Txn) error {
		return tx.Set(leasedPortsKey("app"), appendPorts(nil, wrong))
	}); err != nil {
		t.Fatal(err)
	}
	violations, _, err := Verify(e.db)
	if err != nil || len(violations) != 1 || !strings.HasPrefix(violations[0], leasedPortsKey("app")+": names ports") {
		t.Fatalf("verify: %v %v, want one violation of %s", violations, err, leasedPortsKey("app"))
	}
}

// Passed families are named by the step as they are read at the refusal: a stack's, or, where
// the index disagrees with the cockpit's leased ports (verify names the key), the cockpit.
func TestRefusalStepNamesFamiliesPassedUnread(t *testing.T) {
	reads := fakeReads{meta: declared(pureDecl), active: 2, leasedKnown: true, leased: []int{20000, 20010, 21000, 21010},
		owners: map[int]string{20000: "app/a"}}
	p := &probes{busy: map[int]bool{20020: true}}
	_, err := claimHolder(stepRecord(Value{}), claimInput{holder: newHolder("alice")}, &reads, stepEffects{probe: p.listening}, claimNow.Add(time.Minute))
	requireCode(t, err, PortFamilyCollision)
	for _, want := range []string{"20000,21000 (leased by app/a)", "20010,21010 (leased in this cockpit)", "20020,21020 (host listener on 20020)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
}

func TestLeasedPortsJSON(t *testing.T) {
	for _, ports := range [][]int{{}, {80}, {80, 8080, 65535}} {
		want, _ := json.Marshal(ports)
		if got := appendPorts(nil, ports); string(got) != string(want) {
			t.Errorf("appendPorts(%v) = %s, encoding/json %s", ports, got, want)
		}
	}
	for _, data := range []string{"[]", "[80]", "[80,8080]", " [80, 8080] ", "null", "[01]", "[8.5]", "[80,]", "{}", "[-1]"} {
		var want []int
		wantErr := json.Unmarshal([]byte(data), &want)
		got, err := decodePorts([]byte(data))
		if (err != nil) != (wantErr != nil) || err == nil && !slices.Equal(got, want) {
			t.Errorf("decodePorts(%s) = %v, %v; encoding/json %v, %v", data, got, err, want, wantErr)
		}
	}
}
