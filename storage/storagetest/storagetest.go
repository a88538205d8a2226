// Package storagetest is the conformance suite of the storage contract: every backend runs Run
// from its own tests against a real store, so the engine can rely on the same behaviour from each.
package storagetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
)

// Backend is what the suite needs of a backend.
type Backend struct {
	// Open returns an empty store, closed when the test ends, and a function that closes it and
	// opens the same data again (what a restarted daemon sees).
	Open func(t *testing.T) (store storage.Store, reopen func() storage.Store)
	// Budget is how long Update retries conflicts before it gives up with ErrLocked.
	Budget time.Duration
}

// Run runs every conformance test against b. Each test opens its own store and runs in parallel.
func Run(t *testing.T, b Backend) {
	tests := []struct {
		name string
		fn   func(*testing.T, Backend)
	}{
		{"GetSetDeleteScan", testGetSetDeleteScan},
		{"ReadYourWrites", testReadYourWrites},
		{"ConflictRetries", testConflictRetries},
		{"ScannedKeyConflictRetries", testScannedKeyConflictRetries},
		{"ConcurrentIncrementsLoseNothing", testConcurrentIncrements},
		{"FnErrorUnchangedNothingApplied", testFnError},
		{"ErrLockedWithinBudget", testErrLocked},
		{"ContextEndsRetrying", testContextEnds},
		{"CancelledContextAllOrNothing", testCancelledContext},
		{"ViewIsOneSnapshot", testViewSnapshot},
		{"TransfersKeepTheirSum", testTransfers},
		{"DurableAcrossReopen", testReopen},
		{"CommitSeenByNextWriterBeforeDurable", testCommit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, b)
		})
	}
}

func open(t *testing.T, b Backend) storage.Store {
	s, _ := b.Open(t)
	return s
}

func set(t *testing.T, s storage.Store, key, value string) {
	t.Helper()
	if err := s.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(key, []byte(value)) }); err != nil {
		t.Fatalf("Update set %q: %v", key, err)
	}
}

// get returns key's value in a View, or ok=false if it is missing.
func get(t *testing.T, s storage.Store, key string) (value string, ok bool) {
	t.Helper()
	err := s.View(func(tx storage.Txn) error {
		b, err := tx.Get(key)
		if err != nil {
			return err
		}
		value, ok = string(b), true
		return nil
	})
	if err != nil && !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("View get %q: %v", key, err)
	}
	return value, ok
}

// scan lists prefix as key=value in the order Scan visits it.
func scan(tx storage.Txn, prefix string) ([]string, error) {
	var got []string
	err := tx.Scan(prefix, func(key string, value []byte) error {
		got = append(got, key+"="+string(value))
		return nil
	})
	return got, err
}

func viewScan(t *testing.T, s storage.Store, prefix string) string {
	t.Helper()
	var got []string
	err := s.View(func(tx storage.Txn) (err error) {
		got, err = scan(tx, prefix)
		return err
	})
	if err != nil {
		t.Fatalf("View scan %q: %v", prefix, err)
	}
	return fmt.Sprint(got)
}

func testGetSetDeleteScan(t *testing.T, b Backend) {
	s := open(t, b)
	err := s.Update(context.Background(), func(tx storage.Txn) error {
		// Out of order, and keys that share a prefix without being under it.
		for _, kv := range [][2]string{
			{"s/b", "2"}, {"s/a", "1"}, {"s/c", "3"}, {"s/a/x", "nested"},
			{"s", "bare"}, {"sa", "after"}, {"r/", "before"}, {"empty", ""},
			{"s/\xff", "high"},
		} {
			if err := tx.Set(kv[0], []byte(kv[1])); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if got, want := viewScan(t, s, "s/"), "[s/a=1 s/a/x=nested s/b=2 s/c=3 s/\xff=high]"; got != want {
		t.Errorf("Scan(s/) = %q, want %q (ascending byte order, only the prefix)", got, want)
	}
	if got := viewScan(t, s, "nothing/"); got != "[]" {
		t.Errorf("Scan(nothing/) = %s, want none", got)
	}
	if got, want := viewScan(t, s, ""), "[empty= r/=before s=bare s/a=1 s/a/x=nested s/b=2 s/c=3 s/\xff=high sa=after]"; got != want {
		t.Errorf("Scan(\"\") = %q, want %q", got, want)
	}

	err = s.View(func(tx storage.Txn) error {
		if v, err := tx.Get("empty"); err != nil || len(v) != 0 {
			t.Errorf("Get(empty) = %q, %v; want an empty value, nil", v, err)
		}
		if _, err := tx.Get("missing"); err != storage.ErrNotFound {
			t.Errorf("Get(missing) error = %v, want storage.ErrNotFound itself", err)
		}
		// What Get and Scan return is the caller's: changing it changes nothing stored.
		v, err := tx.Get("s/a")
		if err != nil {
			return err
		}
		v[0] = 'X'
		return tx.Scan("s/b", func(_ string, v []byte) error { v[0] = 'X'; return nil })
	})
	if err != nil {
		t.Fatalf("View: %v", err)
	}
	if got, want := viewScan(t, s, "s/"), "[s/a=1 s/a/x=nested s/b=2 s/c=3 s/\xff=high]"; got != want {
		t.Errorf("after mutating returned values Scan(s/) = %q, want %q", got, want)
	}

	if err := s.Update(context.Background(), func(tx storage.Txn) error { return tx.Delete("s/b") }); err != nil {
		t.Fatalf("Update delete: %v", err)
	}
	if err := s.Update(context.Background(), func(tx storage.Txn) error { return tx.Delete("never-written") }); err != nil {
		t.Errorf("deleting a missing key: %v, want nil", err)
	}
	if _, ok := get(t, s, "s/b"); ok {
		t.Errorf("s/b still present after Delete")
	}

	stop := errors.New("stop")
	visited := 0
	err = s.View(func(tx storage.Txn) error {
		return tx.Scan("s/", func(string, []byte) error { visited++; return stop })
	})
	if err != stop || visited != 1 {
		t.Errorf("Scan with a failing callback: err %v after %d keys, want %v itself after 1", err, visited, stop)
	}
	viewErr := errors.New("view")
	if err := s.View(func(storage.Txn) error { return viewErr }); err != viewErr {
		t.Errorf("View returned %v, want fn's error itself", err)
	}
}

func testReadYourWrites(t *testing.T, b Backend) {
	s := open(t, b)
	set(t, s, "k/gone", "old")
	set(t, s, "k/kept", "old")
	err := s.Update(context.Background(), func(tx storage.Txn) error {
		if err := tx.Set("k/new", []byte("mine")); err != nil {
			return err
		}
		if err := tx.Set("k/kept", []byte("changed")); err != nil {
			return err
		}
		if err := tx.Delete("k/gone"); err != nil {
			return err
		}
		if v, err := tx.Get("k/new"); err != nil || string(v) != "mine" {
			t.Errorf("Get of a pending Set = %q, %v; want mine", v, err)
		}
		if _, err := tx.Get("k/gone"); err != storage.ErrNotFound {
			t.Errorf("Get of a pending Delete: %v, want storage.ErrNotFound", err)
		}
		got, err := scan(tx, "k/")
		if want := "[k/kept=changed k/new=mine]"; fmt.Sprint(got) != want || err != nil {
			t.Errorf("Scan inside Update = %v, %v; want %s", got, err, want)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if got, want := viewScan(t, s, "k/"), "[k/kept=changed k/new=mine]"; got != want {
		t.Errorf("after commit Scan(k/) = %s, want %s", got, want)
	}
}

// bump commits an increment of key's counter from outside the transaction under test.
func bump(s storage.Store, key string) error {
	return s.Update(context.Background(), func(tx storage.Txn) error { return increment(tx, key) })
}

func increment(tx storage.Txn, key string) error {
	n := 0
	v, err := tx.Get(key)
	switch {
	case errors.Is(err, storage.ErrNotFound):
	case err != nil:
		return err
	default:
		if n, err = strconv.Atoi(string(v)); err != nil {
			return err
		}
	}
	return tx.Set(key, []byte(strconv.Itoa(n+1)))
}

func testConflictRetries(t *testing.T, b Backend) {
	s := open(t, b)
	set(t, s, "n", "0")
	runs := 0
	err := s.Update(context.Background(), func(tx storage.Txn) error {
		runs++
		if err := increment(tx, "n"); err != nil {
			return err
		}
		if runs == 1 {
			// Another writer changes the key this transaction read before it commits.
			return bump(s, "n")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if runs != 2 {
		t.Errorf("fn ran %d times, want 2 (one conflict, one retry)", runs)
	}
	if v, _ := get(t, s, "n"); v != "2" {
		t.Errorf("n = %s, want 2: the conflicting commit was lost or overwritten", v)
	}
}

func testScannedKeyConflictRetries(t *testing.T, b Backend) {
	s := open(t, b)
	set(t, s, "c/a", "1")
	set(t, s, "c/b", "1")
	runs := 0
	err := s.Update(context.Background(), func(tx storage.Txn) error {
		runs++
		sum := 0
		err := tx.Scan("c/", func(_ string, v []byte) error {
			n, err := strconv.Atoi(string(v))
			sum += n
			return err
		})
		if err != nil {
			return err
		}
		if runs == 1 {
			if err := bump(s, "c/b"); err != nil {
				return err
			}
		}
		return tx.Set("total", []byte(strconv.Itoa(sum)))
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if v, _ := get(t, s, "total"); v != "3" || runs != 2 {
		t.Errorf("total = %s after %d runs, want 3 after 2: a scanned key's change must conflict", v, runs)
	}
}

func testConcurrentIncrements(t *testing.T, b Backend) {
	s := open(t, b)
	const workers, each = 3, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range each {
				if err := bump(s, "counter"); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("increment: %v", err)
	}
	if v, _ := get(t, s, "counter"); v != strconv.Itoa(workers*each) {
		t.Errorf("counter = %s, want %d (a lost update means a conflict was not retried)", v, workers*each)
	}
}

func testFnError(t *testing.T, b Backend) {
	s := open(t, b)
	set(t, s, "kept", "old")
	refused := errors.New("refused")
	runs := 0
	err := s.Update(context.Background(), func(tx storage.Txn) error {
		runs++
		if err := tx.Set("new", []byte("v")); err != nil {
			return err
		}
		if err := tx.Set("kept", []byte("changed")); err != nil {
			return err
		}
		return refused
	})
	if err != refused {
		t.Fatalf("Update error = %v, want fn's error itself", err)
	}
	if runs != 1 {
		t.Errorf("fn ran %d times, want 1 (an error of fn is not retried)", runs)
	}
	if got := viewScan(t, s, ""); got != "[kept=old]" {
		t.Errorf("store = %s after fn failed, want [kept=old]", got)
	}
}

// conflictForever is an fn whose every run reads key and then lets another writer change it.
func conflictForever(s storage.Store, key string, runs *atomic.Int64) func(storage.Txn) error {
	return func(tx storage.Txn) error {
		runs.Add(1)
		if _, err := tx.Get(key); err != nil && !errors.Is(err, storage.ErrNotFound) {
			return err
		}
		if err := s.Update(context.Background(), func(w storage.Txn) error { return w.Set(key, []byte("theirs")) }); err != nil {
			return err
		}
		return tx.Set(key, []byte("ours"))
	}
}

func testErrLocked(t *testing.T, b Backend) {
	s := open(t, b)
	var runs atomic.Int64
	start := time.Now()
	err := s.Update(context.Background(), conflictForever(s, "hot", &runs))
	took := time.Since(start)
	if !errors.Is(err, storage.ErrLocked) {
		t.Fatalf("Update error = %v, want storage.ErrLocked", err)
	}
	if runs.Load() < 2 {
		t.Errorf("fn ran %d times before ErrLocked, want retries", runs.Load())
	}
	// Not a performance figure: the budget is the contract (STATE_LOCKED within it); the slack
	// covers the last attempt and a loaded machine.
	if slack := 5 * time.Second; took > b.Budget+slack {
		t.Errorf("ErrLocked after %v, want within the %v budget (+%v slack)", took, b.Budget, slack)
	}
	if v, _ := get(t, s, "hot"); v != "theirs" {
		t.Errorf("hot = %q, want theirs: the losing write must not land", v)
	}
}

func testContextEnds(t *testing.T, b Backend) {
	s := open(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	var runs atomic.Int64
	fn := conflictForever(s, "hot", &runs)
	err := s.Update(ctx, func(tx storage.Txn) error {
		if runs.Load() == 2 {
			cancel()
		}
		return fn(tx)
	})
	if !errors.Is(err, storage.ErrLocked) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Update error = %v, want storage.ErrLocked and context.Canceled", err)
	}
	if v, _ := get(t, s, "hot"); v != "theirs" {
		t.Errorf("hot = %q, want theirs", v)
	}
}

// A cancelled context may or may not stop an Update, but it never half-applies one.
func testCancelledContext(t *testing.T, b Backend) {
	s := open(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Update(ctx, func(tx storage.Txn) error {
		if err := tx.Set("a", []byte("1")); err != nil {
			return err
		}
		return tx.Set("b", []byte("1"))
	})
	got := viewScan(t, s, "")
	switch {
	case err == nil && got != "[a=1 b=1]":
		t.Errorf("Update acknowledged, store = %s, want [a=1 b=1]", got)
	case err != nil && got != "[]":
		t.Errorf("Update failed (%v), store = %s, want nothing applied", err, got)
	}
}

func testViewSnapshot(t *testing.T, b Backend) {
	s := open(t, b)
	set(t, s, "a", "old")
	set(t, s, "b", "old")
	set(t, s, "l/1", "old")
	err := s.View(func(tx storage.Txn) error {
		a, err := tx.Get("a")
		if err != nil {
			return err
		}
		err = s.Update(context.Background(), func(w storage.Txn) error {
			for _, k := range []string{"a", "b", "l/1", "l/2"} {
				if err := w.Set(k, []byte("new")); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		b, err := tx.Get("b")
		if err != nil {
			return err
		}
		if string(a) != "old" || string(b) != "old" {
			t.Errorf("View read a=%s b=%s around a commit, want both old", a, b)
		}
		if got, err := scan(tx, "l/"); fmt.Sprint(got) != "[l/1=old]" || err != nil {
			t.Errorf("View's Scan(l/) after a commit = %v, %v; want [l/1=old]", got, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("View: %v", err)
	}
	if got := viewScan(t, s, "l/"); got != "[l/1=new l/2=new]" {
		t.Errorf("after the View Scan(l/) = %s, want [l/1=new l/2=new]", got)
	}
}

// testTransfers moves units between accounts while a reader checks that every snapshot balances:
// a read that mixed two commits, or a write that lost one, shows as a wrong sum.
func testTransfers(t *testing.T, b Backend) {
	s := open(t, b)
	const accounts, total = 4, 400
	err := s.Update(context.Background(), func(tx storage.Txn) error {
		for i := range accounts {
			if err := tx.Set(fmt.Sprint("acct/", i), []byte(strconv.Itoa(total/accounts))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	var writers, reader sync.WaitGroup
	for w := range 2 {
		writers.Go(func() {
			for i := range 12 {
				from, to := fmt.Sprint("acct/", (w+i)%accounts), fmt.Sprint("acct/", (w+i+1)%accounts)
				if err := s.Update(context.Background(), func(tx storage.Txn) error { return transfer(tx, from, to) }); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var stop atomic.Bool
	reader.Go(func() {
		for !stop.Load() {
			sum := 0
			err := s.View(func(tx storage.Txn) error {
				return tx.Scan("acct/", func(_ string, v []byte) error {
					n, err := strconv.Atoi(string(v))
					sum += n
					return err
				})
			})
			if err == nil && sum != total {
				err = fmt.Errorf("a View summed %d, want %d", sum, total)
			}
			if err != nil {
				errs <- err
				return
			}
			time.Sleep(time.Millisecond) // leave the writers room to commit
		}
	})
	writers.Wait()
	stop.Store(true)
	reader.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := viewScan(t, s, "acct/"); got != "[acct/0=100 acct/1=100 acct/2=100 acct/3=100]" {
		t.Errorf("after 24 transfers around the ring the accounts are %s, want 100 each", got)
	}
}

func transfer(tx storage.Txn, from, to string) error {
	f, err := readInt(tx, from)
	if err != nil {
		return err
	}
	g, err := readInt(tx, to)
	if err != nil {
		return err
	}
	if err := tx.Set(from, []byte(strconv.Itoa(f-1))); err != nil {
		return err
	}
	return tx.Set(to, []byte(strconv.Itoa(g+1)))
}

func readInt(tx storage.Txn, key string) (int, error) {
	v, err := tx.Get(key)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(string(v))
}

func testReopen(t *testing.T, b Backend) {
	s, reopen := b.Open(t)
	set(t, s, "d/a", "1")
	set(t, s, "d/b", "2")
	if err := s.Update(context.Background(), func(tx storage.Txn) error { return tx.Delete("d/b") }); err != nil {
		t.Fatal(err)
	}
	s = reopen()
	if got := viewScan(t, s, ""); got != "[d/a=1]" {
		t.Errorf("after reopen the store holds %s, want [d/a=1]", got)
	}
	set(t, s, "d/c", "3")
	if got := viewScan(t, s, ""); got != "[d/a=1 d/c=3]" {
		t.Errorf("the reopened store holds %s after a write, want [d/a=1 d/c=3]", got)
	}
}

// A commit not yet waited durable is what the next writer reads: a writer that releases its lock
// at the commit keeps its successors in order. Once durable returns it survives a reopen.
func testCommit(t *testing.T, b Backend) {
	s, reopen := b.Open(t)
	ctx := context.Background()
	durable, err := s.Commit(ctx, func(tx storage.Txn) error { return tx.Set("c/a", []byte("1")) })
	if err != nil {
		t.Fatalf("Commit: %v", err)
	}
	err = s.Update(ctx, func(tx storage.Txn) error {
		a, err := tx.Get("c/a")
		if err != nil {
			return fmt.Errorf("the next writer does not see the commit: %w", err)
		}
		return tx.Set("c/b", a)
	})
	if err != nil {
		t.Fatalf("Update after Commit: %v", err)
	}
	if err := durable(); err != nil {
		t.Fatalf("durable: %v", err)
	}
	if got := viewScan(t, s, ""); got != "[c/a=1 c/b=1]" {
		t.Errorf("store = %s, want [c/a=1 c/b=1]", got)
	}
	refused := errors.New("refused")
	durable, err = s.Commit(ctx, func(tx storage.Txn) error {
		if err := tx.Set("c/a", []byte("2")); err != nil {
			return err
		}
		return refused
	})
	if err != refused || durable != nil {
		t.Fatalf("Commit with fn failing = (durable set: %v, %v), want (false, fn's error itself)", durable != nil, err)
	}
	s = reopen()
	if got := viewScan(t, s, ""); got != "[c/a=1 c/b=1]" {
		t.Errorf("after reopen the store holds %s, want [c/a=1 c/b=1]", got)
	}
}
