package kv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
	"github.com/cockpitfs/cockpitfs/storage"
)

// The settle (checkpoint, the memtable's renewal, the compaction of level 0) killed at each system
// call that changes the disk: strace attaches to a process that has acknowledged commits, kills
// it as it enters the n-th call of one system call once it settles, and the store must then open
// with every acknowledged commit and without the key the renewal writes. The suite tries every
// position of the calls that sync or change a directory, and the first two of the others (the
// data written into files the syncs and renames then settle); COCKPITFS_FAULTS=all
// (scripts/faults) every position of every call.

// settleEnv names the directory TestHelperSettle writes to in a child process.
const settleEnv = "COCKPITFS_KV_SETTLE_DIR"

// settleValue is what TestHelperSettle writes under key.
func settleValue(key string) string { return strings.Repeat(key, 30) }

// TestHelperSettle is not a test: started by TestSettleKilledAtEachDiskCall, it commits 40 keys,
// says "ready" and waits for a line on stdin (strace attached meanwhile), then settles the store,
// commits 10 more and closes it, printing "acked KEY" after each commit returns and "closed" at
// the end.
func TestHelperSettle(t *testing.T) {
	db := helperStore(t, settleEnv)
	commit := func(from, to int) {
		for i := from; i < to; i++ {
			key := fmt.Sprintf("k%03d", i)
			if err := db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(key, []byte(settleValue(key))) }); err != nil {
				fmt.Println(err)
				os.Exit(1)
			}
			fmt.Println("acked", key)
		}
	}
	commit(0, 40)
	db.log.background.Wait() // the spare segment, made after the first commit
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		os.Exit(1)
	}
	for !db.log.settle() {
		db.log.background.Wait()
	}
	commit(40, 50)
	if err := db.Close(); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("closed")
}

// settleKilledAt runs TestHelperSettle on dir, killed at the n-th call of syscall after it is
// ready; it returns whether the kill came and the keys acknowledged.
func settleKilledAt(t *testing.T, dir, syscall string, n int) (killed bool, acked []string) {
	t.Helper()
	// One P keeps the calls on few threads, whose counts strace keeps one by one.
	cmd, stdin, stdout := startHelper(t, "TestHelperSettle", settleEnv+"="+dir, "GOMAXPROCS=1", "GORACE=atexit_sleep_ms=0")
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	closed := false
	read := func(until string) {
		for lines.Scan() {
			line := lines.Text()
			if line == until {
				return
			}
			switch key, ok := strings.CutPrefix(line, "acked "); {
			case ok:
				acked = append(acked, key)
			case line == "closed":
				closed = true
			case line == "PASS": // the test binary's, after closed
			default:
				t.Fatalf("helper: %s", line)
			}
		}
	}
	read("ready")
	strace := exec.Command("strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace="+syscall,
		"-e", fmt.Sprintf("inject=%s:signal=KILL:when=%d", syscall, n), "-p", fmt.Sprint(cmd.Process.Pid))
	if err := strace.Start(); err != nil {
		t.Fatal(err)
	}
	defer strace.Wait()
	waitTraced(t, cmd.Process.Pid)
	io.WriteString(stdin, "go\n")
	read("")
	err := cmd.Wait()
	if err == nil {
		if !closed {
			t.Fatalf("the helper exited 0 without closing the store")
		}
		return false, acked
	}
	if ws, ok := cmd.ProcessState.Sys().(interface{ Signaled() bool }); !ok || !ws.Signaled() {
		t.Fatalf("the helper failed: %v", err)
	}
	return true, acked
}

// waitTraced waits until every thread of pid is traced.
func waitTraced(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
		traced := len(tasks) > 0
		for _, task := range tasks {
			status, err := os.ReadFile(task)
			if err != nil || strings.Contains(string(status), "\nTracerPid:\t0\n") {
				traced = false
			}
		}
		if traced {
			return
		}
	}
	t.Fatalf("strace did not attach to process %d", pid)
}

// settleCalls are the calls that change the disk, as Go and badger make them (openat for O_CREAT
// and O_TRUNC among its other uses; msync for badger's memory-mapped logs).
var settleCalls = []string{"openat", "write", "pwrite64", "ftruncate", "fallocate", "fsync", "fdatasync", "renameat", "unlinkat", "msync"}

// settleLimit is how many positions of syscall the run tries (see above).
func settleLimit(syscall string) int {
	if os.Getenv("COCKPITFS_FAULTS") == "all" || slices.Contains([]string{"fsync", "fdatasync", "renameat", "unlinkat", "msync"}, syscall) {
		return 1 << 16
	}
	return 2
}

func TestSettleKilledAtEachDiskCall(t *testing.T) {
	testtool.Need(t, "strace")
	t.Parallel()
	var kills []string
	for _, sc := range settleCalls {
		for n := 1; ; n++ {
			dir := filepath.Join(t.TempDir(), "data")
			killed, acked := settleKilledAt(t, dir, sc, n)
			db, err := Open(dir)
			if err != nil {
				t.Fatalf("killed at %s#%d, the store does not open: %v", sc, n, err)
			}
			for _, key := range acked {
				if v, ok := get(t, db, key); !ok || v != settleValue(key) {
					t.Errorf("killed at %s#%d, acknowledged %s is missing or wrong", sc, n, key)
				}
			}
			if markHeld(t, db) {
				t.Errorf("killed at %s#%d, the key the renewal writes is still in the store", sc, n)
			}
			set(t, db, "after", "kill")
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			if !killed {
				kills = append(kills, fmt.Sprintf("%s %d", sc, n-1))
				break
			}
			if n == settleLimit(sc) {
				kills = append(kills, fmt.Sprintf("%s %d (of more)", sc, n))
				break
			}
		}
	}
	t.Logf("killed at each call: %s", strings.Join(kills, ", "))
}
