package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/portlock"
	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
)

// Holds on real sockets, in a space of the test's own so that no other daemon on the machine meets
// them. Two engines over two stores stand for two daemons. Tests that hold ports do not run in
// parallel: a parallel test's fork (exec.Command) copies every descriptor until the child execs,
// so a hold let go meanwhile stays bound, unanswered, and a claim reads it as a stranger's.

// spaces numbers the test spaces: a test run again (-count) holds nothing its last run still holds.
var spaces atomic.Int64

// holdSpace is a space of the test's own. Not named after the test: a hold's name is at most 107
// bytes, and a subtest's name can be most of that.
func holdSpace(t *testing.T) portlock.Space {
	return portlock.Space(fmt.Sprintf("cockpitfs-test/%d/%d/port/", os.Getpid(), spaces.Add(1)))
}

func holdingEngine(t *testing.T, space portlock.Space, data string) *Engine {
	t.Helper()
	e := newEngine(t)
	if _, err := e.HoldPorts(space, DaemonIdentity{PID: os.Getpid(), UID: uint32(os.Getuid()), Data: data}); err != nil {
		t.Fatal(err)
	}
	return e
}

// sleepDrain ends the stack's lease by a sleep drain of its only holder.
func sleepDrain(t *testing.T, e *Engine, cockpit, stack, holder string) {
	t.Helper()
	ctx := context.Background()
	r := stackRecord(t, e, cockpit, stack)
	if err := e.ReserveDrain(ctx, me("write", "drain/request"), cockpit, stack, DrainRequest{Purpose: "sleep", Holder: holder}, r.Revision); err != nil {
		t.Fatal(err)
	}
	if err := e.StartAttempt(ctx, me("write", "drain/attempt"), cockpit, stack, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.PublishOutcome(ctx, me("write", "drain/outcome"), cockpit, stack, Outcome{Success: true}); err != nil {
		t.Fatal(err)
	}
}

const holdConfig = "[ports]\nstep = 10\ncount = 3\n[ports.bases]\nHTTP = 41080\nDB = 41432\n"

// A family another engine holds is skipped, and the claim's events line says whose it is; a drain
// lets the holds go after its commit, and the family is free at once.
func TestHoldsKeepTwoEnginesApart(t *testing.T) {
	space := holdSpace(t)
	a, b := holdingEngine(t, space, "/a"), holdingEngine(t, space, "/b")
	newCockpit(t, a, "app", holdConfig, "s")
	newCockpit(t, b, "app", holdConfig, "s", "t")
	claim(t, a, "app", "s", "alice")
	requirePorts(t, stackRecord(t, a, "app", "s"), map[string]int{"HTTP": 41080, "DB": 41432})
	if held, _ := space.Held(); !slices.Equal(sorted(held), []int{41080, 41432}) {
		t.Fatalf("held after a's claim: %v", held)
	}
	claim(t, b, "app", "s", "bob")
	requirePorts(t, stackRecord(t, b, "app", "s"), map[string]int{"HTTP": 41090, "DB": 41442})
	events, err := b.events("app", "s")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(events), fmt.Sprintf(`"warning":"skipped candidate families: port 41432 is held by the cockpitfs daemon process %d uid %d (data /a, lease app/s)"`, os.Getpid(), os.Getuid())) {
		t.Fatalf("b's claim does not name a's hold:\n%s", events)
	}
	foreign, err := b.ForeignHolds()
	if err != nil || len(foreign) != 2 || foreign[0].Port != 41080 || foreign[0].Holder.Identity == nil || foreign[0].Holder.Identity.Data != "/a" {
		t.Fatalf("b's foreign holds = %+v, %v", foreign, err)
	}

	sleepDrain(t, a, "app", "s", "alice")
	if held, _ := space.Held(); !slices.Equal(sorted(held), []int{41090, 41442}) {
		t.Fatalf("held after a's drain: %v", held)
	}
	claim(t, b, "app", "t", "bob")
	requirePorts(t, stackRecord(t, b, "app", "t"), map[string]int{"HTTP": 41080, "DB": 41432})
}

// Every candidate held by another engine: ENOSPC, naming the holds, and nothing changes — no
// hold taken either.
func TestHoldsAllCandidatesHeldElsewhere(t *testing.T) {
	space := holdSpace(t)
	a, b := holdingEngine(t, space, "/a"), holdingEngine(t, space, "/b")
	one := strings.Replace(holdConfig, "count = 3", "count = 1", 1)
	newCockpit(t, a, "app", one, "s")
	newCockpit(t, b, "app", one, "s")
	claim(t, a, "app", "s", "alice")
	refusedUnchanged(t, b, "app", "s", PortLeaseExhausted, func() error { return claimErr(b, "app", "s", "bob") })
	err := claimErr(b, "app", "s", "bob")
	if !strings.Contains(err.Error(), "port 41432 held by the cockpitfs daemon process") {
		t.Fatalf("refusal does not name the hold: %v", err)
	}
	if held, _ := space.Held(); !slices.Equal(sorted(held), []int{41080, 41432}) {
		t.Fatalf("a refused claim left holds: %v", held)
	}
}

// An engine that starts over a store whose lease another process holds (here: the engine that ran
// before, never stopped) reports the lost ports — in what HoldPorts returns, the stack's events and
// its health — and takes them back once they are let go.
func TestHoldsLostWhileDownAreReported(t *testing.T) {
	space := holdSpace(t)
	before := holdingEngine(t, space, "/before")
	newCockpit(t, before, "app", holdConfig, "s")
	claim(t, before, "app", "s", "alice")

	// The same store, opened again as a restarted daemon would: its ports are held by "before".
	restarted := New(before.db)
	lost, err := restarted.HoldPorts(space, DaemonIdentity{PID: os.Getpid(), Data: "/restarted"})
	if err != nil || len(lost) != 2 || lost[0].Key != "DB" || lost[0].Holder.Identity == nil || lost[0].Holder.Identity.Data != "/before" {
		t.Fatalf("HoldPorts lost %+v, %v", lost, err)
	}
	events, _ := restarted.events("app", "s")
	if !strings.Contains(string(events), `"result":"conflict","code":"PORT_FAMILY_COLLISION"`) || !strings.Contains(string(events), "port 41432 (DB) of this stack's lease is held by") {
		t.Fatalf("events:\n%s", events)
	}
	family := func() Observation {
		obs, err := restarted.Health("app", "s")
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range obs {
			if o.Code == codePortFamily {
				return o
			}
		}
		t.Fatal("no port-family observation")
		return Observation{}
	}
	if o := family(); o.Observed.Value == nil || *o.Observed.Value || !strings.Contains(o.Observed.Reason, "port 41080 (HTTP) of this stack's lease is held by") {
		t.Fatalf("port-family = %+v", o.Observed)
	}
	before.holds.releaseAll()
	if o := family(); strings.Contains(o.Observed.Reason, "is held by") {
		t.Fatalf("after the holder let go, port-family still says %q", o.Observed.Reason)
	}
	restarted.holds.mu.Lock()
	_, mine := restarted.holds.byPort[41080]
	restarted.holds.mu.Unlock()
	if !mine {
		t.Fatal("the restarted engine did not take port 41080 back")
	}
}

func sorted(ports []int) []int {
	slices.Sort(ports)
	return ports
}

// A transaction run that conflicted lets go, before the next run, of the ports it held: that run
// may choose another family (one freed meanwhile), and holding both would refuse another stack's
// claim of the first.
func TestHoldsOfAConflictedRunAreLetGo(t *testing.T) {
	space := holdSpace(t)
	e := holdingEngine(t, space, "/a")
	key := stackKey("app", "s")
	runs := 0
	var heldInRetry []int
	err := e.update(context.Background(), key, func(tx storage.Txn, _ time.Time) error {
		runs++
		if runs > 1 {
			heldInRetry, _ = space.Held()
			return errUnchanged
		}
		if _, err := tx.Get("x"); err != nil && !errors.Is(err, storage.ErrNotFound) {
			return err
		}
		if holder, _, _, err := e.holds.takeFamily(key, "app", "s", map[string]int{"HTTP": 41090, "DB": 41442}); err != nil || holder != nil {
			t.Fatalf("take: %v, held by %v", err, holder)
		}
		// A commit of what this run read: it conflicts and runs again.
		if err := e.db.Update(context.Background(), func(w storage.Txn) error { return w.Set("x", []byte("1")) }); err != nil {
			return err
		}
		return tx.Set("y", []byte("1"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if runs != 2 {
		t.Fatalf("fn ran %d times, want 2 (one conflict)", runs)
	}
	if len(heldInRetry) != 0 {
		t.Fatalf("the retry began with the conflicted run's holds: %v", heldInRetry)
	}
}

// stallingStore is a real store whose armed transaction (one, then it disarms) waits for the
// test: in its first run, once it has its snapshot and before fn reads anything, or, with after,
// once fn is done and before the commit (what the run took still held, its stack still locked).
type stallingStore struct {
	*kv.DB
	armed   atomic.Bool
	after   bool
	stalled chan struct{}
	resume  chan struct{}
}

func (s *stallingStore) Commit(ctx context.Context, fn func(storage.Txn) error) (func() error, error) {
	if !s.armed.CompareAndSwap(true, false) {
		return s.DB.Commit(ctx, fn)
	}
	first, after := true, s.after
	return s.DB.Commit(ctx, func(tx storage.Txn) error {
		stall := first
		first = false
		if stall && !after {
			s.stalled <- struct{}{}
			<-s.resume
		}
		err := fn(tx)
		if stall && after {
			s.stalled <- struct{}{}
			<-s.resume
		}
		return err
	})
}

// stall arms the next transaction and runs op, which must make it, in a goroutine; it returns once
// the transaction waits, and op's result once resumed.
func (s *stallingStore) stall(after bool, op func() error) <-chan error {
	s.after = after
	s.armed.Store(true)
	done := make(chan error, 1)
	go func() { done <- op() }()
	<-s.stalled
	return done
}

// A claim decides on its snapshot and on the holds as they are when it reaches them. A stack that,
// since the snapshot, let its family go and leased the one the claim reaches first, shows twice:
// in the holds and, for the family it let go, in the snapshot. With two families and one other
// stack, one family was free all along: the claim leases it, never PORT_LEASE_EXHAUSTED — whether
// the other stack's claim is committed when the claim meets its hold, or still under way.
func TestClaimDoesNotCountALeaseLetGoSinceItsSnapshot(t *testing.T) {
	for _, underWay := range []bool{false, true} {
		t.Run(fmt.Sprintf("underWay=%v", underWay), func(t *testing.T) {
			db, err := kv.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			store := &stallingStore{DB: db, stalled: make(chan struct{}), resume: make(chan struct{})}
			e := New(store)
			space := holdSpace(t)
			if _, err := e.HoldPorts(space, DaemonIdentity{PID: os.Getpid(), UID: uint32(os.Getuid()), Data: "/d"}); err != nil {
				t.Fatal(err)
			}
			two := strings.Replace(holdConfig, "count = 3", "count = 2", 1)
			newCockpit(t, e, "app", two, "y", "w")
			first, second := map[string]int{"HTTP": 41080, "DB": 41432}, map[string]int{"HTTP": 41090, "DB": 41442}
			claim(t, e, "app", "y", "a")
			claim(t, e, "app", "w", "b")
			requirePorts(t, stackRecord(t, e, "app", "w"), second)
			sleepDrain(t, e, "app", "y", "a")

			// y's claim takes its snapshot (w leases the second family) and waits; w moves to the
			// first family, its claim committed or held before its commit: a host listener on its
			// previous family, the second, sends it there.
			yClaimed := store.stall(false, func() error { return claimErr(e, "app", "y", "a") })
			sleepDrain(t, e, "app", "w", "b")
			listener, err := net.Listen("tcp", "127.0.0.1:41090")
			if err != nil {
				t.Fatal(err)
			}
			var wClaimed <-chan error
			if underWay {
				wClaimed = store.stall(true, func() error { return claimErr(e, "app", "w", "b") })
			} else {
				claim(t, e, "app", "w", "b")
			}
			listener.Close()
			store.resume <- struct{}{}
			if underWay {
				store.resume <- struct{}{}
				if err := <-wClaimed; err != nil {
					t.Fatal(err)
				}
			}
			if err := <-yClaimed; err != nil {
				t.Fatalf("y's claim, with the second family free since w moved: %v", err)
			}
			requirePorts(t, stackRecord(t, e, "app", "w"), first)
			requirePorts(t, stackRecord(t, e, "app", "y"), second)
			if held, _ := space.Held(); !slices.Equal(sorted(held), []int{41080, 41090, 41432, 41442}) {
				t.Fatalf("held with both families leased: %v", held)
			}
		})
	}
}

// A hold this daemon keeps for a stack whose record shows no lease, with nothing under way on it
// (holds and store disagreeing), makes a claim wait for that stack once, not for its whole
// budget: the refusal stands.
func TestClaimWaitsOnceForAHoldNoSnapshotShows(t *testing.T) {
	e := holdingEngine(t, holdSpace(t), "/d")
	newCockpit(t, e, "app", strings.Replace(holdConfig, "count = 3", "count = 1", 1), "y", "w")
	if holder, _, _, err := e.holds.takeFamily(stackKey("app", "w"), "app", "w", map[string]int{"HTTP": 41080, "DB": 41432}); err != nil || holder != nil {
		t.Fatalf("take: %v, held by %v", err, holder)
	}
	requireCode(t, claimErr(e, "app", "y", "a"), PortLeaseExhausted)
}

// ports/<n> asks ForeignHold once per entry of `ls -l ports`: a port this daemon holds is answered
// without reading the kernel's table of bound names, and another daemon's ports share one read of
// it (each read walks every unix socket on the machine: a listing of 1,000 took 7 s).
func TestForeignHoldReadsTheKernelsTableOncePerListing(t *testing.T) {
	defer func(was time.Duration) { boundFor = was }(boundFor)
	boundFor = time.Hour // this test is about the count of reads, not their age
	space := holdSpace(t)
	a, b := holdingEngine(t, space, "/a"), holdingEngine(t, space, "/b")
	newCockpit(t, a, "app", holdConfig, "s", "t", "u")
	for _, s := range []string{"s", "t", "u"} {
		claim(t, a, "app", s, "alice")
	}
	held, err := space.Held()
	if err != nil || len(held) != 6 {
		t.Fatalf("held: %v %v", held, err)
	}
	for _, port := range held {
		if _, foreign := a.ForeignHold(port); foreign {
			t.Fatalf("a's own port %d is foreign to a", port)
		}
		if h, foreign := b.ForeignHold(port); !foreign || h.Identity == nil || h.Identity.Data != "/a" {
			t.Fatalf("b's view of a's port %d: %+v %v", port, h, foreign)
		}
	}
	if a.holds.boundReads != 0 || b.holds.boundReads != 1 {
		t.Fatalf("reads of the kernel's table: a %d (its own ports), b %d (six of a's), want 0 and 1", a.holds.boundReads, b.holds.boundReads)
	}
}
