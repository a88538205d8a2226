package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
)

// The one place a goroutine holds two stacks' locks (engine.go, LOCK ORDERING): a claim refused
// behind another stack's newer holds waits for that stack's lock while holding its own. These
// tests drive that wait in both directions between two stacks, and both claims at once.

// crossingStore is a real store that tells the test about the transactions of stacks it gates:
// the first run of each gated stack's next Commit stops once it has its snapshot (at its first
// read of the stack's record) and, with hold, again once its step is done, before its commit
// (its holds taken, its stack's lock held). It counts each stack's Commit calls: a claim that
// waited for another stack's lock calls Commit again.
type crossingStore struct {
	*kv.DB
	mu      sync.Mutex
	commits map[string]int             // stack key → Commit calls
	gates   map[string]*crossingGate   // stack key → its gate, for its next Commit
	returns map[string]chan<- struct{} // stack key → told when its next Commit returns
}

type crossingGate struct {
	hold               bool
	snapshot, stepDone chan struct{} // the run tells the test
	proceed, commit    chan struct{} // the test tells the run
}

func newCrossingStore(t *testing.T) *crossingStore {
	db, err := kv.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &crossingStore{DB: db, commits: map[string]int{}, gates: map[string]*crossingGate{}, returns: map[string]chan<- struct{}{}}
}

// gate stops the stack's next Commit as crossingStore says.
func (s *crossingStore) gate(key string, hold bool) *crossingGate {
	g := &crossingGate{hold: hold, snapshot: make(chan struct{}), stepDone: make(chan struct{}), proceed: make(chan struct{}), commit: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gates[key] = g
	return g
}

// returned is closed once the stack's next Commit returns.
func (s *crossingStore) returned(key string) <-chan struct{} {
	ch := make(chan struct{})
	s.mu.Lock()
	defer s.mu.Unlock()
	s.returns[key] = ch
	return ch
}

func (s *crossingStore) Commit(ctx context.Context, fn func(storage.Txn) error) (func() error, error) {
	var key string // the stack this Commit is for, known at its first read of a record
	first := true
	durable, err := s.DB.Commit(ctx, func(tx storage.Txn) error {
		run := &crossingTxn{Txn: tx, s: s, key: &key, first: first}
		first = false
		err := fn(run)
		if run.gate != nil && run.gate.hold {
			close(run.gate.stepDone)
			<-run.gate.commit
		}
		return err
	})
	s.mu.Lock()
	ch := s.returns[key]
	delete(s.returns, key)
	s.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	return durable, err
}

type crossingTxn struct {
	storage.Txn
	s     *crossingStore
	key   *string
	first bool
	gate  *crossingGate
}

func (t *crossingTxn) Get(key string) ([]byte, error) {
	if *t.key == "" && strings.HasPrefix(key, allStacksPrefix) {
		*t.key = key
		t.s.mu.Lock()
		t.s.commits[key]++
		var g *crossingGate
		if t.first {
			g = t.s.gates[key]
			delete(t.s.gates, key)
		}
		t.s.mu.Unlock()
		if g != nil {
			t.gate = g
			close(g.snapshot)
			<-g.proceed
		}
	}
	return t.Txn.Get(key)
}

func (s *crossingStore) commitsOf(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commits[key]
}

// oneFamily is a config whose ports fit one lease.
var oneFamily = strings.Replace(holdConfig, "count = 3", "count = 1", 1)

// Two claims on two stacks take their snapshots together, the one family free in both. The first
// takes the family's holds and stops before its commit, its stack locked; the second meets those
// holds, is refused behind them and waits, its own stack locked, for the first's lock. Then the
// first commits, and the second runs again on a fresh snapshot: PORT_LEASE_EXHAUSTED, the family
// leased by the first — never STATE_LOCKED, which a wait that could not end would give within
// the budget. Both directions, y behind w and w behind y.
func TestCrossStackWaitInBothDirections(t *testing.T) {
	store := newCrossingStore(t)
	e := New(store)
	if _, err := e.HoldPorts(holdSpace(t), DaemonIdentity{PID: os.Getpid(), UID: uint32(os.Getuid()), Data: "/d"}); err != nil {
		t.Fatal(err)
	}
	newCockpit(t, e, "app", oneFamily, "y", "w")
	for _, order := range [][2]string{{"w", "y"}, {"y", "w"}} {
		firstStack, second := order[0], order[1]
		t.Run(second+" behind "+firstStack, func(t *testing.T) {
			firstKey, secondKey := stackKey("app", firstStack), stackKey("app", second)
			firstGate, secondGate := store.gate(firstKey, true), store.gate(secondKey, false)
			before := store.commitsOf(secondKey)
			firstDone, secondDone := make(chan error, 1), make(chan error, 1)
			go func() { firstDone <- claimErr(e, "app", firstStack, "a") }()
			go func() { secondDone <- claimErr(e, "app", second, "b") }()
			<-firstGate.snapshot
			<-secondGate.snapshot
			secondRefused := store.returned(secondKey)
			close(firstGate.proceed)
			<-firstGate.stepDone // the family held for the first, its commit to come
			close(secondGate.proceed)
			<-secondRefused // refused behind the first's holds: it waits for the first's lock
			close(firstGate.commit)
			if err := <-firstDone; err != nil {
				t.Fatalf("%s's claim: %v", firstStack, err)
			}
			err := <-secondDone
			requireCode(t, err, PortLeaseExhausted)
			if runs := store.commitsOf(secondKey) - before; runs != 2 {
				t.Fatalf("%s's claim ran %d transactions, want 2: one refused behind %s's holds, one after waiting for its lock", second, runs, firstStack)
			}
			requirePorts(t, stackRecord(t, e, "app", firstStack), map[string]int{"HTTP": 41080, "DB": 41432})
			if r := stackRecord(t, e, "app", second); r.Value.Lease.Active() {
				t.Fatalf("%s leased %v as well", second, r.Value.Lease.Ports)
			}
			sleepDrain(t, e, "app", firstStack, "a")
		})
	}
}

// The same two claims, many times, with nothing to order them: whichever reaches the holds second
// waits for the other's lock, from either side, while the other may be waiting for nothing but
// its store. Every round ends with one lease and one refusal for want of a family, never a wait
// that ran out (STATE_LOCKED).
func TestCrossStackWaitRacedFromBothSides(t *testing.T) {
	e := holdingEngine(t, holdSpace(t), "/d")
	newCockpit(t, e, "app", oneFamily, "y", "w")
	won := map[string]int{}
	for round := range 30 {
		var wg sync.WaitGroup
		errs := map[string]error{}
		var mu sync.Mutex
		start := make(chan struct{})
		for _, stack := range []string{"y", "w"} {
			wg.Go(func() {
				<-start
				err := claimErr(e, "app", stack, "h")
				mu.Lock()
				errs[stack] = err
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		var winner string
		for stack, err := range errs {
			var rf *Refusal
			switch {
			case err == nil:
				winner = stack
			case errors.As(err, &rf) && rf.Code == PortLeaseExhausted:
			default:
				t.Fatalf("round %d: %s's claim: %v", round, stack, err)
			}
		}
		if winner == "" || errs["y"] == nil && errs["w"] == nil {
			t.Fatalf("round %d: want one lease and one refusal, got %v", round, fmt.Sprint(errs))
		}
		won[winner]++
		sleepDrain(t, e, "app", winner, "h")
	}
	t.Logf("leases won: %v", won)
}
