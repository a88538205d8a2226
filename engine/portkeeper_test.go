package engine

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage"
)

// The port index is kept from commits once first read: after each commit that moves a lease (a
// new lease, a drain's release, a family passed on to another stack, a stack removed), Ports and
// PortOwner give what a scan of the store gives. A keeper that missed the ports a stack had, or
// those it has now, would fail here.
func TestPortIndexIsKeptFromCommits(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t) // app/s claimed by "me"; app/t idle
	ctx := context.Background()
	check := func(step string, leased int) {
		t.Helper()
		var scanned []PortOwner
		if err := e.db.View(func(tx storage.Txn) error {
			return tx.Scan(portsPrefix, func(_ string, v []byte) error {
				var o PortOwner
				err := json.Unmarshal(v, &o)
				scanned = append(scanned, o)
				return err
			})
		}); err != nil {
			t.Fatal(err)
		}
		kept, err := e.Ports()
		if err != nil {
			t.Fatal(err)
		}
		if len(scanned) != leased || !reflect.DeepEqual(kept, scanned) {
			t.Fatalf("%s: Ports() = %+v,\nthe store holds %+v (want %d ports)", step, kept, scanned, leased)
		}
		for _, o := range scanned {
			if got, ok, err := e.PortOwner(o.Port); err != nil || !ok || got != o {
				t.Fatalf("%s: PortOwner(%d) = %+v, %v, %v; the store holds %+v", step, o.Port, got, ok, err, o)
			}
		}
		// Nothing is kept of a stack or name no entry has any more.
		ports, uses := 0, 0
		for _, s := range e.ports.stacks {
			ports += len(s.ports)
		}
		for _, n := range e.ports.names {
			uses += n.uses
		}
		if len(e.ports.owners) != leased || ports != leased || uses != leased || len(e.ports.names) > 2 {
			t.Fatalf("%s: the keeper holds %d entries, %d ports of %d stacks, %d uses of %d names; want %d",
				step, len(e.ports.owners), ports, len(e.ports.stacks), uses, len(e.ports.names), leased)
		}
		for _, port := range []int{18080, 18090, 15432, 15442} {
			if _, ok, _ := e.PortOwner(port); ok != slicesContainsPort(scanned, port) {
				t.Fatalf("%s: PortOwner(%d) leased = %v; the store holds %+v", step, port, ok, scanned)
			}
		}
	}
	check("first read", 2)
	claimStack(t, e, "t", "bob", untracked("bob"))
	check("t's new lease", 4)
	mustStep(t, e, reserveText(t, e, "sleep"))
	mustStep(t, e, startExecutor(e, -1))
	mustStep(t, e, publish(e, true, ""))
	check("s drained", 2)
	if err := e.RemoveStack(ctx, me("rmdir", "app/stacks/s"), "app", "s"); err != nil {
		t.Fatal(err)
	}
	if err := e.CreateStack(ctx, me("mkdir", "app/stacks/u"), "app", "u"); err != nil {
		t.Fatal(err)
	}
	claimStack(t, e, "u", "carol", untracked("carol"))
	if r, _ := e.Stack("app", "u"); r.Value.Lease.Offset != 0 {
		t.Fatalf("u did not take the family s let go: %+v", r.Value.Lease)
	}
	check("u takes s's family", 4)
	newCockpit(t, e, "web", exampleConfig, "w")
	if err := claimErr(e, "web", "w", "dan"); err != nil {
		t.Fatal(err)
	}
	check("a second cockpit's lease", 6)
	if err := e.RemoveStack(ctx, me("rmdir", "app/stacks/t"), "app", "t"); err == nil {
		t.Fatal("removed t with its holder and lease")
	}
	check("t's removal refused", 6)
	if len(e.ports.stacks) != 3 {
		t.Fatalf("the keeper holds %d stacks, want t, u and w", len(e.ports.stacks))
	}
}

func slicesContainsPort(owners []PortOwner, port int) bool {
	for _, o := range owners {
		if o.Port == port {
			return true
		}
	}
	return false
}

// A commit the store shows before its committer is back (a sync round another committer leads)
// is in the kept index as soon as the store shows it, as it was when every read read the store.
func TestPortIndexReadsCommitsUnderWay(t *testing.T) {
	t.Parallel()
	store := newPausingStore(t, true)
	e := New(store)
	newCockpit(t, e, "app", exampleConfig, "s", "t")
	claimStack(t, e, "s", "me", untracked("me"))
	if ports, err := e.Ports(); err != nil || len(ports) != 2 { // the index is kept from here on
		t.Fatalf("ports of s's lease: %v, %v", ports, err)
	}
	store.armed.Store(true)
	claimed := make(chan error, 1)
	go func() {
		claimed <- e.Claim(context.Background(), me("create", "app/stacks/t/holders/bob"), "app", "t", "bob", untracked("bob"))
	}()
	<-store.paused
	ports, err := e.Ports()
	store.resume <- struct{}{}
	if err := <-claimed; err != nil {
		t.Fatal(err)
	}
	if err != nil || len(ports) != 4 {
		t.Fatalf("with t's lease readable in the store, Ports() = %+v, %v", ports, err)
	}
}

// An entry given to another stack, or to none, leaves nothing of its old stack or name behind: a
// machine's churn of leases does not grow the keeper.
func TestPortKeeperForgetsWhatNoEntryHas(t *testing.T) {
	k := portKeeper{owners: map[int]keptPort{}, stacks: map[string]*keptStack{}, names: map[string]*keptName{}}
	k.set(80, PortOwner{Port: 80, Cockpit: "a", Stack: "x", Key: "HTTP"}, true)
	k.set(81, PortOwner{Port: 81, Cockpit: "a", Stack: "x", Key: "DB"}, true)
	k.set(80, PortOwner{Port: 80, Cockpit: "b", Stack: "y", Key: "WEB", Offset: 3}, true)
	if got, want := k.owners[80].owner(80), (PortOwner{Port: 80, Cockpit: "b", Stack: "y", Key: "WEB", Offset: 3}); got != want {
		t.Fatalf("port 80: %+v, want %+v", got, want)
	}
	if _, ok := k.names["HTTP"]; ok || len(k.stacks["s/a/x"].ports) != 1 {
		t.Fatalf("after 80 passed to b/y: names %v, a/x's ports %v", k.names, k.stacks["s/a/x"])
	}
	k.set(81, PortOwner{}, false)
	k.set(80, PortOwner{}, false)
	if len(k.owners) != 0 || len(k.stacks) != 0 || len(k.names) != 0 {
		t.Fatalf("no entry left, yet the keeper holds %v, %v, %v", k.owners, k.stacks, k.names)
	}
}
