package kv

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// commitsEnv names the directory TestHelperCommits writes to when the test binary runs as a
// child process.
const commitsEnv = "COCKPITFS_KV_COMMITS_DIR"

const helperCommits = 20

// TestHelperCommits is not a test: run under strace by TestAcknowledgedCommitIsSynced, it
// commits helperCommits times and writes "acked N" to stdout after each Update returns.
func TestHelperCommits(t *testing.T) {
	db := helperStore(t, commitsEnv)
	for i := range helperCommits {
		if err := increment(db, "counter"); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Printf("acked %d\n", i)
	}
	db.Close()
}

// TestAcknowledgedCommitIsSynced watches the system calls of a process committing: between one
// acknowledgement and the next there must be a write to a write-ahead log segment, which is where
// the commit's record is, and after it an fdatasync (of the segment, or of the file a round
// flushes the device with: flush.go).
func TestAcknowledgedCommitIsSynced(t *testing.T) {
	testtool.Need(t, "strace")
	strace, _ := exec.LookPath("strace")
	trace := filepath.Join(t.TempDir(), "trace")
	cmd := exec.Command(strace, "-f", "-y", "-qq", "-e", "trace=fdatasync,fsync,msync,write,pwrite64", "-o", trace,
		os.Args[0], "-test.run=^TestHelperCommits$")
	cmd.Env = append(os.Environ(), commitsEnv+"="+filepath.Join(t.TempDir(), "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper under strace: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "Operation not permitted") {
		t.Skipf("SKIPPED LOUDLY: this machine refuses ptrace: %s", out)
	}
	f, err := os.Open(trace)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		lines = append(lines, scanner.Text())
	}
	acks, unsynced := checkAcksSynced(lines)
	if unsynced >= 0 {
		t.Fatalf("commit acknowledged with no log write synced since the last one: %s\ntrace:\n%s",
			lines[unsynced], strings.Join(lines[max(0, unsynced-19):unsynced+1], "\n"))
	}
	if acks != helperCommits {
		t.Fatalf("saw %d acknowledgements in the trace, want %d:\n%s", acks, helperCommits, strings.Join(lines, "\n"))
	}
}

var (
	walWrite        = regexp.MustCompile(`pwrite64\(\d+<[^>]*\.wal>, .*\) += \d+`)
	walWriteBegun   = regexp.MustCompile(`^(\d+) +pwrite64\(\d+<[^>]*\.wal>, .* <unfinished \.\.\.>`)
	walWriteResumed = regexp.MustCompile(`^(\d+) +<\.\.\. pwrite64 resumed>\) += \d+`)
	syncCall        = regexp.MustCompile(`fdatasync\(\d+<[^>]*>\) += 0`)
	// With -f, a call another thread's line interrupts is split: "PID  fdatasync(15</…>
	// <unfinished ...>", then "PID  <... fdatasync resumed>) = 0"; it counts when it returns.
	syncBegun   = regexp.MustCompile(`^(\d+) +fdatasync\(\d+<[^>]*> <unfinished \.\.\.>`)
	syncResumed = regexp.MustCompile(`^(\d+) +<\.\.\. fdatasync resumed>\) += 0`)
	ack         = regexp.MustCompile(`write\(1<[^>]*>, "acked (\d+)\\n"`)
)

// checkAcksSynced reads an strace -f -y trace: how many acknowledgements it holds, and the index of
// the first one with no log write followed by an fdatasync since the one before (-1 if none).
func checkAcksSynced(lines []string) (acks, unsynced int) {
	written, synced := false, false
	syncsBegun := map[string]bool{}  // by pid: begun after a log write
	writesBegun := map[string]bool{} // by pid
	for i, line := range lines {
		if m := syncBegun.FindStringSubmatch(line); m != nil {
			syncsBegun[m[1]] = written
			continue
		}
		if m := walWriteBegun.FindStringSubmatch(line); m != nil {
			writesBegun[m[1]] = true
			continue
		}
		if m := walWriteResumed.FindStringSubmatch(line); m != nil && writesBegun[m[1]] {
			delete(writesBegun, m[1])
			written = true
			continue
		}
		switch m := syncResumed.FindStringSubmatch(line); {
		case walWrite.MatchString(line):
			written = true
		case m != nil:
			synced = synced || syncsBegun[m[1]]
			delete(syncsBegun, m[1])
		case syncCall.MatchString(line):
			synced = synced || written
		case ack.MatchString(line):
			if !synced {
				return acks, i
			}
			written, synced = false, false
			acks++
		}
	}
	return acks, -1
}

// A trace as a loaded machine writes it (from a failed run): the last sync is split around
// another thread's line, and still precedes its acknowledgement.
func TestCheckAcksSyncedReadsSplitCalls(t *testing.T) {
	trace := strings.Split(`7201  pwrite64(15</d/000001.wal>, "\1\2"..., 4096, 8192) = 4096
7201  fdatasync(16</d/walflush>) = 0
7201  write(1<pipe:[4091151]>, "acked 13\n", 9) = 9
7201  pwrite64(15</d/000001.wal>, "\1\2"..., 4096, 8192) = 4096
7201  fdatasync(16</d/walflush> <unfinished ...>
7204  --- SIGURG {si_signo=SIGURG, si_code=SI_TKILL, si_pid=7178, si_uid=0} ---
7201  <... fdatasync resumed>)          = 0
7201  write(1<pipe:[4091151]>, "acked 14\n", 9) = 9
7201  write(1<pipe:[4091151]>, "acked 15\n", 9) = 9`, "\n")
	if acks, unsynced := checkAcksSynced(trace); acks != 2 || unsynced != 8 {
		t.Fatalf("checkAcksSynced: %d acknowledgements, first unsynced at %d; want 2 and line 8", acks, unsynced)
	}
}

// TestConcurrentCommitsShareSyncs shows the group commit: writers committing at once are made
// durable by fewer fdatasync rounds than commits, and every commit counts.
func TestConcurrentCommitsShareSyncs(t *testing.T) {
	db, _ := openTemp(t)
	const writers, each = 16, 25
	before := db.Syncs()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for range each {
				if err := increment(db, fmt.Sprint("k", w%4)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for k := range 4 {
		v, _ := get(t, db, fmt.Sprint("k", k))
		var n int
		fmt.Sscan(v, &n)
		total += n
	}
	if total != writers*each {
		t.Errorf("counters add up to %d, want %d", total, writers*each)
	}
	if rounds := db.Syncs() - before; rounds >= writers*each {
		t.Errorf("%d sync rounds for %d concurrent commits: none shared", rounds, writers*each)
	}
}

// TestFailedSyncIsSticky: once a sync fails, what was written since can never be acknowledged,
// so every later commit and read fails too, even once syncing would work again.
func TestFailedSyncIsSticky(t *testing.T) {
	db, _ := openTemp(t)
	set(t, db, "k", "v")
	write := func(tx storage.Txn) error { return tx.Set("k", []byte("w")) }
	l := db.log
	l.mu.Lock()
	good := l.seg.file
	closed, err := os.Open(good.Name())
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	l.seg.file = closed // the next round's write fails (EBADF)
	l.mu.Unlock()
	if err := db.Update(context.Background(), write); err == nil {
		t.Fatal("Update acknowledged a commit it could not sync")
	}
	l.mu.Lock()
	l.seg.file = good
	l.mu.Unlock()
	if err := db.Update(context.Background(), write); err == nil {
		t.Fatal("a commit after a failed sync was acknowledged")
	}
	if err := db.View(func(storage.Txn) error { return nil }); err == nil {
		t.Fatal("View succeeded after a failed sync")
	}
}

// A batch waits applyDelay for badger. A View, which reads badger, hurries it rather than wait,
// and so does Close; with the delay an hour long, either waiting would stall the test. The guard
// is far from both: a few commits take seconds on a disk the whole suite loads (10 s was seen to
// pass), and a stall is the hour.
func TestViewAndCloseHurryTheApplier(t *testing.T) {
	defer func(d time.Duration) { applyDelay = d }(applyDelay)
	applyDelay = time.Hour
	dir := t.TempDir()
	db, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	within(t, 5*time.Minute, func() error {
		for i := range 3 {
			want := fmt.Sprint(i)
			if err := db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set("k", []byte(want)) }); err != nil {
				return err
			}
			var got []byte
			if err := db.View(func(tx storage.Txn) (err error) { got, err = tx.Get("k"); return err }); err != nil {
				return err
			}
			if string(got) != want {
				return fmt.Errorf("View after commit %d read %q", i, got)
			}
		}
		if err := db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set("last", []byte("x")) }); err != nil {
			return err
		}
		return db.Close()
	})
	if db, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.View(func(tx storage.Txn) error { _, err := tx.Get("last"); return err }); err != nil {
		t.Fatalf("the commit before Close: %v", err)
	}
}

// Without a View, a batch reaches badger once its delay is over.
func TestApplierAppliesABatchAfterItsDelay(t *testing.T) {
	db, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for i := range 5 {
		if err := db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(fmt.Sprint(i), []byte("v")) }); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for db.log.applied.load() < db.log.sequenced.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("badger has applied up to %d of %d after 10 s", db.log.applied.load(), db.log.sequenced.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// within fails the test if fn fails or has not returned after d: a guard against a stall, never a
// timing.
func within(t *testing.T, d time.Duration, fn func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(d):
		t.Fatalf("still waiting after %v", d)
	}
}
