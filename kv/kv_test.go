package kv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"

	"github.com/dgraph-io/badger/v4"
)

func openTemp(t *testing.T) (*DB, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	db, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return db, dir
}

func set(t *testing.T, db *DB, key, value string) {
	t.Helper()
	err := db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(key, []byte(value)) })
	if err != nil {
		t.Fatalf("Update set %q: %v", key, err)
	}
}

// get returns the value of key, or ok=false if it is missing.
func get(t *testing.T, db *DB, key string) (value string, ok bool) {
	t.Helper()
	err := db.View(func(tx storage.Txn) error {
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

func scan(t *testing.T, tx storage.Txn, prefix string) []string {
	t.Helper()
	var got []string
	err := tx.Scan(prefix, func(key string, value []byte) error {
		got = append(got, key+"="+string(value))
		return nil
	})
	if err != nil {
		t.Fatalf("Scan %q: %v", prefix, err)
	}
	return got
}

func TestGetSetDeleteScan(t *testing.T) {
	db, _ := openTemp(t)
	ctx := context.Background()

	err := db.Update(ctx, func(tx storage.Txn) error {
		// Inserted out of order; Scan must sort them.
		for _, kv := range [][2]string{
			{"stack/b", "2"}, {"stack/a", "1"}, {"stack/c", "3"},
			{"stacks", "other"}, {"stac", "shorter"}, {"port/1", "p"}, {"empty", ""},
		} {
			if err := tx.Set(kv[0], []byte(kv[1])); err != nil {
				return err
			}
		}
		// A transaction reads its own writes.
		if got := scan(t, tx, "stack/"); len(got) != 3 {
			t.Errorf("Scan inside Update = %v, want the 3 pending stack/ keys", got)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}

	err = db.View(func(tx storage.Txn) error {
		got := fmt.Sprint(scan(t, tx, "stack/"))
		if want := "[stack/a=1 stack/b=2 stack/c=3]"; got != want {
			t.Errorf("Scan(stack/) = %s, want %s", got, want)
		}
		if got := scan(t, tx, "nothing/"); len(got) != 0 {
			t.Errorf("Scan(nothing/) = %v, want none", got)
		}
		if got := len(scan(t, tx, "")); got != 7 {
			t.Errorf("Scan(\"\") saw %d keys, want 7", got)
		}
		v, err := tx.Get("empty")
		if err != nil || len(v) != 0 {
			t.Errorf("Get(empty) = %q, %v; want empty value, nil", v, err)
		}
		if _, err := tx.Get("missing"); err != storage.ErrNotFound {
			t.Errorf("Get(missing) error = %v, want storage.ErrNotFound itself", err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("View: %v", err)
	}

	// Get returns a copy: changing it must not change the store.
	err = db.View(func(tx storage.Txn) error {
		v, err := tx.Get("stack/a")
		if err != nil {
			return err
		}
		v[0] = 'X'
		return nil
	})
	if err != nil {
		t.Fatalf("View: %v", err)
	}
	if v, _ := get(t, db, "stack/a"); v != "1" {
		t.Errorf("stack/a = %q after mutating a returned slice, want 1", v)
	}

	if err := db.Update(ctx, func(tx storage.Txn) error { return tx.Delete("stack/b") }); err != nil {
		t.Fatalf("Update delete: %v", err)
	}
	if _, ok := get(t, db, "stack/b"); ok {
		t.Errorf("stack/b still present after Delete")
	}

	// An error from the Scan callback stops the scan and comes back unchanged.
	stop := errors.New("stop")
	visited := 0
	err = db.View(func(tx storage.Txn) error {
		return tx.Scan("stack/", func(string, []byte) error { visited++; return stop })
	})
	if !errors.Is(err, stop) || visited != 1 {
		t.Errorf("Scan with failing callback: err %v after %d keys, want %v after 1", err, visited, stop)
	}
}

func TestViewSeesOneSnapshot(t *testing.T) {
	db, _ := openTemp(t)
	set(t, db, "a", "old")
	set(t, db, "b", "old")

	err := db.View(func(tx storage.Txn) error {
		a, err := tx.Get("a")
		if err != nil {
			return err
		}
		// Commit a change to both keys between the two reads.
		err = db.Update(context.Background(), func(w storage.Txn) error {
			if err := w.Set("a", []byte("new")); err != nil {
				return err
			}
			return w.Set("b", []byte("new"))
		})
		if err != nil {
			return err
		}
		b, err := tx.Get("b")
		if err != nil {
			return err
		}
		if string(a) != "old" || string(b) != "old" {
			t.Errorf("View read a=%s b=%s, want both old", a, b)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("View: %v", err)
	}
	if b, _ := get(t, db, "b"); b != "new" {
		t.Errorf("b = %s after the View, want new", b)
	}
}

// increment adds one to the decimal counter at key, reading it with Get so that a
// concurrent increment conflicts.
func increment(db *DB, key string) error {
	return db.Update(context.Background(), func(tx storage.Txn) error {
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
	})
}

func TestUpdateRetriesConflicts(t *testing.T) {
	db, _ := openTemp(t)
	const workers, perWorker = 2, 200
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range perWorker {
				if err := increment(db, "counter"); err != nil {
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
	if got, _ := get(t, db, "counter"); got != strconv.Itoa(workers*perWorker) {
		t.Errorf("counter = %s, want %d (a lost update means a conflict was not retried)", got, workers*perWorker)
	}
	// Two goroutines can in principle take strict turns, so zero is legal.
	t.Logf("conflicts retried: %d", db.Conflicts())
}

func TestUpdateReturnsFnErrorAndWritesNothing(t *testing.T) {
	db, _ := openTemp(t)
	refused := errors.New("refused")
	runs := 0
	err := db.Update(context.Background(), func(tx storage.Txn) error {
		runs++
		if err := tx.Set("k", []byte("v")); err != nil {
			return err
		}
		return fmt.Errorf("rule: %w", refused)
	})
	if !errors.Is(err, refused) {
		t.Fatalf("Update error = %v, want one wrapping %v", err, refused)
	}
	if runs != 1 {
		t.Errorf("fn ran %d times, want 1 (errors must not be retried)", runs)
	}
	if _, ok := get(t, db, "k"); ok {
		t.Errorf("k was written although fn failed")
	}
}

// conflictForever reads key, then commits a blind write to key from another
// transaction before returning, so every commit attempt conflicts.
func conflictForever(db *DB, key string) func(storage.Txn) error {
	return func(tx storage.Txn) error {
		if _, err := tx.Get(key); err != nil && !errors.Is(err, storage.ErrNotFound) {
			return err
		}
		if err := db.Update(context.Background(), func(w storage.Txn) error { return w.Set(key, []byte("theirs")) }); err != nil {
			return err
		}
		return tx.Set(key, []byte("ours"))
	}
}

func TestUpdateGivesUpWithErrLocked(t *testing.T) {
	db, _ := openTemp(t)
	err := db.Update(context.Background(), conflictForever(db, "hot"))
	if !errors.Is(err, storage.ErrLocked) {
		t.Fatalf("Update error = %v, want storage.ErrLocked", err)
	}
	if db.Conflicts() == 0 {
		t.Errorf("Conflicts() = 0 after retrying a conflict")
	}
	if v, _ := get(t, db, "hot"); v != "theirs" {
		t.Errorf("hot = %q, want theirs: the losing write must not land", v)
	}
}

func TestUpdateGivesUpWhenContextEnds(t *testing.T) {
	db, _ := openTemp(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := db.Update(ctx, conflictForever(db, "hot"))
	if !errors.Is(err, storage.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Update error = %v, want storage.ErrLocked and context.DeadlineExceeded", err)
	}
}

func TestUpdateSurfacesTxnTooBig(t *testing.T) {
	db, _ := openTemp(t)
	runs := 0
	big := make([]byte, 255<<10) // just under the value threshold, so it is counted in full
	err := db.Update(context.Background(), func(tx storage.Txn) error {
		runs++
		for i := range 3 {
			if err := tx.Set(fmt.Sprint("big/", i), big); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, badger.ErrTxnTooBig) {
		t.Fatalf("Update error = %v, want badger.ErrTxnTooBig", err)
	}
	if runs != 1 {
		t.Errorf("fn ran %d times, want 1", runs)
	}
}

func TestDataSurvivesReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	db, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	set(t, db, "stack/a", "1")
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if info, err := os.Stat(dir); err != nil || info.Mode().Perm() != 0o700 {
		t.Errorf("data directory: %v, %v; want mode 0700", info.Mode(), err)
	}

	db, err = Open(dir)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer db.Close()
	if v, _ := get(t, db, "stack/a"); v != "1" {
		t.Errorf("stack/a = %q after reopen, want 1", v)
	}
}

// opens lists both ways to open a store, in the order tests try them.
var opens = []struct {
	name string
	open func(string) (*DB, error)
}{{"OpenReadOnly", OpenReadOnly}, {"Open", Open}}

func TestSecondOpenInProcessIsHeld(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	db, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	for _, o := range opens {
		name := o.name
		second, err := o.open(dir)
		if err == nil {
			second.Close()
			t.Fatalf("second %s succeeded while the first holds %s", name, dir)
		}
		var held *HeldError
		if !errors.As(err, &held) || held.PID != os.Getpid() || held.Dir != dir {
			t.Fatalf("second %s error = %#v, want *HeldError{Dir: %s, PID: %d}", name, err, dir, os.Getpid())
		}
		want := fmt.Sprintf("data directory %s is in use by cockpitfs process %d", dir, os.Getpid())
		if err.Error() != want {
			t.Errorf("Error() = %q, want %q", err, want)
		}
	}
	// A holder that has locked but not yet written its pid.
	if err := os.Truncate(filepath.Join(dir, lockFileName), 0); err != nil {
		t.Fatal(err)
	}
	_, err = Open(dir)
	if want := "data directory " + dir + " is in use by another cockpitfs process"; err == nil || err.Error() != want {
		t.Errorf("Open with an empty lock file: %v, want %q", err, want)
	}

	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	again, err := Open(dir)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	again.Close()
}

// A store closed while a child this process started still holds a copy of its lock's descriptor
// (forked, not yet exec'd: here a child given the descriptor, which ends 300 ms later) opens
// again once the child lets go, rather than naming this process as the one in the way.
func TestOpenAfterCloseWhileAChildHoldsTheLock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	db, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "0.3")
	child.ExtraFiles = []*os.File{db.lock}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Wait()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := Open(dir)
	if err != nil {
		t.Fatalf("Open after Close, the child holding the lock's copy: %v", err)
	}
	again.Close()
}

func TestOpenRemovesEmptyLogFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	db, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	set(t, db, "k", "v")
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// What a kill between badger creating and sizing its next files leaves.
	for _, name := range []string{"00009.mem", "000009.vlog"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	db, err = Open(dir)
	if err != nil {
		t.Fatalf("Open with empty log files present: %v", err)
	}
	defer db.Close()
	if v, _ := get(t, db, "k"); v != "v" {
		t.Errorf("k = %q, want v", v)
	}
}

func TestOpenReadOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	db, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	set(t, db, "k", "v")
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	ro, err := OpenReadOnly(dir)
	if err != nil {
		t.Fatalf("OpenReadOnly: %v", err)
	}
	defer ro.Close()
	if v, _ := get(t, ro, "k"); v != "v" {
		t.Errorf("k = %q, want v", v)
	}
	err = ro.Update(context.Background(), func(tx storage.Txn) error { return tx.Set("k", []byte("w")) })
	if err == nil {
		t.Errorf("Update on a read-only store succeeded")
	}
	if v, _ := get(t, ro, "k"); v != "v" {
		t.Errorf("k = %q after a refused Update, want v", v)
	}
}

// holdEnv names the directory TestHelperHoldDir opens when the test binary runs
// as a child process.
const holdEnv = "COCKPITFS_KV_HOLD_DIR"

// TestHelperHoldDir is not a test: started by startHolder in a child process, it
// opens the store, writes one key, says "ready" and holds the store until its
// stdin closes.
func TestHelperHoldDir(t *testing.T) {
	db := helperStore(t, holdEnv)
	set(t, db, "written-by", "child")
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	db.Close()
}

// helperStore opens the store in the directory env names when the test binary runs as a helper
// process, and skips the test otherwise.
func helperStore(t *testing.T, env string) *DB {
	dir := os.Getenv(env)
	if dir == "" {
		t.Skip("helper process only")
	}
	db, err := Open(dir)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	return db
}

// startHelper starts the test binary as a child process running the helper test named, with env
// added to its environment, its stderr ours, and pipes to its stdin and from its stdout.
func startHelper(t *testing.T, test string, env ...string) (*exec.Cmd, io.WriteCloser, io.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, stdin, stdout
}

// startHolder runs TestHelperHoldDir in a child process and waits until it holds dir.
func startHolder(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	// Closing its stdin, or our death, ends the child.
	cmd, stdin, stdout := startHelper(t, "TestHelperHoldDir", holdEnv+"="+dir)
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("holder said %q, %v; want ready", line, err)
	}
	return cmd
}

func TestOpenHeldByAnotherProcess(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	holder := startHolder(t, dir)

	db, err := Open(dir)
	if err == nil {
		db.Close()
		t.Fatalf("Open succeeded while process %d holds %s", holder.Process.Pid, dir)
	}
	var held *HeldError
	if !errors.As(err, &held) || held.PID != holder.Process.Pid {
		t.Fatalf("Open error = %v, want *HeldError naming pid %d", err, holder.Process.Pid)
	}

	// kill -9 frees the lock, and both kinds of Open recover the child's write.
	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	holder.Wait()
	for _, o := range opens {
		name := o.name
		db, err := o.open(dir)
		if err != nil {
			t.Fatalf("%s after the holder was killed: %v", name, err)
		}
		v, _ := get(t, db, "written-by")
		if err := db.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if v != "child" {
			t.Errorf("%s: written-by = %q, want child", name, v)
		}
	}
}

// BenchmarkUpdate measures one compare-and-swap commit (Get and Set of one key)
// and its fdatasync, which is what every engine operation pays.
func BenchmarkUpdate(b *testing.B) {
	db, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	for b.Loop() {
		if err := increment(db, "counter"); err != nil {
			b.Fatal(err)
		}
	}
}
