package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
)

// Health keeps its inventory from commits: two leases sharing a family (written behind the engine
// before it started) collide until one of them ends through a drain, and not after. An inventory
// that missed the drain's commits would still hold s's lease.
func TestHealthInventoryFollowsCommits(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t) // app/s, claimed by "me"; app/t idle
	s := stackOf(t, e)
	err := e.db.Update(context.Background(), func(tx storage.Txn) error {
		r, err := new(Engine).loadRecord(tx, "app", "t")
		if err != nil {
			return err
		}
		lease := *s.Value.Lease
		last := holderID("gone")
		r.Value.Lease, r.Value.LastReleasedHolder = &lease, &last
		return setJSON(tx, stackKey("app", "t"), r)
	})
	if err != nil {
		t.Fatal(err)
	}
	e = New(e.db)
	e.now = func() time.Time { return time.Date(2030, 1, 2, 3, 5, 0, 0, time.UTC) }
	family := func() Observation {
		t.Helper()
		obs, err := e.Health("app", "t")
		if err != nil {
			t.Fatal(err)
		}
		return observationOf(t, obs, codePortFamily, "")
	}
	if o := family(); !strings.Contains(o.Observed.Reason, "is leased by app/s and app/t") {
		t.Fatalf("port-family of t sharing s's family: %+v", o.Observed)
	}
	mustStep(t, e, reserveText(t, e, "sleep"))
	mustStep(t, e, startExecutor(e, -1))
	mustStep(t, e, publish(e, true, ""))
	if o := family(); strings.Contains(o.Observed.Reason, "leased by") {
		t.Fatalf("port-family of t once s's drain released its lease: %+v", o.Observed)
	}
}

// The inventory's collisions are what one scan of the records in key order reports: each port in
// more than one active lease named by its first holder and each later one, in the later ones'
// order; a removed lease no longer collides.
func TestInventoryCollisionsInScanOrder(t *testing.T) {
	var e Engine
	inv := &e.inventory
	inv.loaded = true
	inv.stacks, inv.cockpits = map[string]inventoryEntry{}, map[string]map[string]bool{}
	inv.owners, inv.unsound, inv.shared = map[int]map[string]string{}, map[string]map[string]string{}, map[int]bool{}
	inv.set("s/b/y", inventoryEntry{cockpit: "b", ports: map[string]int{"HTTP": 80, "DB": 5432}})
	inv.set("s/a/x", inventoryEntry{cockpit: "a", ports: map[string]int{"HTTP": 80}})
	inv.set("s/c/z", inventoryEntry{cockpit: "c", ports: map[string]int{"WEB": 80, "PG": 5432}})
	inv.set("s/a/broken", inventoryEntry{cockpit: "a", problem: "bad"})
	got := inv.of("a")
	want := "port 80 (HTTP) is leased by a/x and b/y; port 5432 (DB) is leased by b/y and c/z; port 80 (HTTP) is leased by a/x and c/z"
	if got.collision != want || got.unsound != "a/broken: bad" {
		t.Fatalf("inventory of a = %+v,\nwant collision %q and unsound a/broken", got, want)
	}
	inv.remove("s/b/y")
	inv.remove("s/a/broken")
	got = inv.of("a")
	if want := "port 80 (HTTP) is leased by a/x and c/z"; got.collision != want || got.unsound != "" {
		t.Fatalf("after removing b/y and a/broken: %+v, want collision %q, sound", got, want)
	}
	inv.remove("s/c/z")
	if got := inv.of("a"); got.collision != "" || len(inv.shared) != 0 {
		t.Fatalf("one lease left, yet %+v (shared %v)", got, inv.shared)
	}
}

// Health reads a stack again while a commit on it is under way: the store may show the commit
// before its committer is back, and the inventory must not answer with the record it replaced.
func TestHealthInventoryReadsCommitsUnderWay(t *testing.T) {
	t.Parallel()
	store := newPausingStore(t, true)
	e := New(store)
	newCockpit(t, e, "app", healthConfig, "a", "b")
	if err := e.Claim(context.Background(), me("create", "app/stacks/a/holders/me"), "app", "a", "me", untracked("me")); err != nil {
		t.Fatal(err)
	}
	wantValue(t, observationOf(t, health(t, e, "a"), codeClaimState, ""), true) // the inventory is kept from here on
	store.armed.Store(true)
	committed := make(chan error, 1)
	go func() {
		// A commit no operation makes (holders without a lease), so that claim-state shows it.
		committed <- e.update(context.Background(), stackKey("app", "b"), func(tx storage.Txn, now time.Time) error {
			r, err := new(Engine).loadRecord(tx, "app", "b")
			if err != nil {
				return err
			}
			r.Value.Holders = []Holder{Holder{Name: "me", CheckoutPath: "/src/me"}.claimed(now)}
			return setJSON(tx, stackKey("app", "b"), r)
		})
	}()
	<-store.paused
	claim := observationOf(t, health(t, e, "a"), codeClaimState, "")
	store.resume <- struct{}{}
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	if claim.Observed.State != observedFailed || !strings.Contains(claim.Observed.Reason, "app/b") {
		t.Fatalf("with b's broken record readable in the store, claim-state of a: %+v", claim.Observed)
	}
	if claim := observationOf(t, health(t, e, "a"), codeClaimState, ""); claim.Observed.State != observedFailed {
		t.Fatalf("once the commit is back, claim-state of a: %+v", claim.Observed)
	}
}
