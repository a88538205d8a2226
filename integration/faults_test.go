package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// Offline commands killed at each system call that changes the disk (docs/integrity.md#what-a-kill-leaves):
// strace delivers SIGKILL as the command enters its n-th call of one system call, for n = 1, 2, …
// until a run ends unkilled; after each, mount and verify must find what was acknowledged, or
// refuse naming the command that finishes. strace counts calls per thread: a Go command's
// goroutines move between threads, so the n-th call is the n-th of whichever thread gets there
// first. COCKPITFS_FAULTS=all (scripts/faults) tries every position of every system call below.

// faultSyscalls are the calls that change the disk, as Go makes them on Linux (openat for O_CREAT
// and O_TRUNC among its other uses).
var faultSyscalls = []string{"renameat", "renameat2", "linkat", "unlinkat", "mkdirat", "openat", "write", "pwrite64", "ftruncate", "fallocate", "fsync", "fdatasync"}

// faultLimit is how many positions of syscall a run tries: every position of the calls in every
// (each step of a restore or a backup that moves a file is a rename; each commit of a migration's
// batches a pwrite64 of the write-ahead log) and the first of the rest; COCKPITFS_FAULTS=all
// every position of every call.
func faultLimit(syscall string, every []string) int {
	if os.Getenv("COCKPITFS_FAULTS") == "all" || slices.Contains(every, syscall) {
		return 1 << 16
	}
	return 1
}

// killedAt runs cockpitfs args killed at the n-th call of syscall (of those naming path, when
// given); it reports whether the kill came, and the command's output.
func killedAt(t *testing.T, tmp, syscall string, n int, path string, args ...string) (bool, string) {
	t.Helper()
	testtool.Need(t, "strace")
	strace := []string{"-f", "-qq", "-o", "/dev/null", "-e", "trace=" + syscall,
		"-e", fmt.Sprintf("inject=%s:signal=KILL:when=%d", syscall, n)}
	if path != "" {
		strace = append(strace, "-P", path)
	}
	cmd := exec.Command("strace", append(append(strace, plainBinary), args...)...)
	// The race detector's second at exit, in every one of hundreds of runs, goes; one P keeps
	// the calls on few threads, so the per-thread counts reach the command's later calls.
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0", "GOMAXPROCS=1", "TMPDIR="+tmp)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return false, string(out)
	case errors.As(err, &exit):
		// strace ends as its tracee did: by the same signal, or 128+9 from a shell.
		if ws, ok := exit.Sys().(interface{ Signaled() bool }); ok && ws.Signaled() || exit.ExitCode() == 128+9 {
			return true, string(out)
		}
		return false, string(out)
	}
	t.Fatalf("strace: %v", err)
	return false, ""
}

// faultLoop kills cockpitfs args (after prepare) at each position faultLimit allows, and hands
// each outcome to check, with where the kill came ("renameat#3") or "" for the run that ended
// unkilled. It returns how many runs were killed, and the TMPDIR they ran with.
func faultLoop(t *testing.T, every []string, prepare func(), check func(at string, killed bool, out string), args ...string) (int, string) {
	t.Helper()
	tmp := t.TempDir()
	kills := 0
	for _, sc := range faultSyscalls {
		for n := 1; n <= faultLimit(sc, every); n++ {
			prepare()
			killed, out := killedAt(t, tmp, sc, n, "", args...)
			at := fmt.Sprintf("%s#%d", sc, n)
			if !killed {
				check("", false, out)
				break
			}
			kills++
			check(at, true, out)
		}
	}
	return kills, tmp
}

// storeRecords is every record of the stopped store in data, read through `cockpitfs backup`.
func storeRecords(t *testing.T, data string) map[string][]byte {
	t.Helper()
	file := filepath.Join(t.TempDir(), "records.backup")
	if r := plain(t, "backup", "--data", data, file); r.code != 0 {
		t.Fatalf("backup of %s: %s", data, r.out)
	}
	b, err := kv.ReadBackup(file)
	if err != nil {
		t.Fatal(err)
	}
	return b.Records
}

func sameRecords(a, b map[string][]byte) bool { return reflect.DeepEqual(a, b) }

// keysOf describes records for a failure message.
func keysOf(records map[string][]byte) string {
	keys := make([]string, 0, len(records))
	for k := range records {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return fmt.Sprintf("%d keys %v", len(keys), keys)
}

// replaceDir makes dst a copy of src (cp -a: modes, times and holes kept).
func replaceDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.RemoveAll(dst); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s %s: %v %s", src, dst, err, out)
	}
}

// faultStores leaves a stopped store of forty stacks (more keys than one of migrate's batches)
// and a backup of it, then the store changed since (five stacks removed, three made): the
// restore's two possible truths differ.
func faultStores(t *testing.T) (m *mount, backup string) {
	t.Helper()
	m = newMount(t)
	stacks := make([]string, 40)
	for i := range stacks {
		stacks[i] = fmt.Sprintf("s%02d", i)
	}
	m.setupApp(40, map[string]int{"HTTP": 39600}, stacks...)
	m.Stop()
	backup = filepath.Join(t.TempDir(), "forty.backup")
	if r := plain(t, "backup", "--data", m.Data, backup); r.code != 0 {
		t.Fatal(r.out)
	}
	m.start()
	m.ok("rmdir $M/app/stacks/s0[0-4] && mkdir $M/app/stacks/new1 $M/app/stacks/new2 $M/app/stacks/new3")
	m.Stop()
	return m, backup
}

// restoreStores is faultStores for a restore's kill loop: the mount (stopped, its verify left to
// the test), the backup, the records of the store a restore replaces and those of the backup.
func restoreStores(t *testing.T) (m *mount, backup string, original, restored map[string][]byte) {
	t.Helper()
	m, backup = faultStores(t)
	m.corrupted = true // the harness's verify would meet whatever the last run left
	b, err := kv.ReadBackup(backup)
	if err != nil {
		t.Fatal(err)
	}
	return m, backup, storeRecords(t, m.Data), b.Records
}

// restore killed at each call: verify and mount find the replaced store or the restored one, or
// refuse naming the unfinished restore and `cockpitfs restore --data DIR`, which finishes it.
// Never an empty store.
func TestRestoreKilledAtEachDiskCall(t *testing.T) {
	t.Parallel()
	m, backup, original, restored := restoreStores(t)
	if sameRecords(original, restored) {
		t.Fatal("the store and the backup hold the same records: the test could not tell them apart")
	}
	pristine := filepath.Join(t.TempDir(), "pristine")
	replaceDir(t, m.Data, pristine)
	seen := map[string]int{}
	kills, _ := faultLoop(t, []string{"renameat"}, func() { replaceDir(t, pristine, m.Data) }, func(at string, killed bool, out string) {
		if !killed {
			if !strings.Contains(out, fmt.Sprintf("restored %d records", len(restored))) {
				t.Fatalf("the restore run to its end: %s", out)
			}
			if got := storeRecords(t, m.Data); !sameRecords(got, restored) {
				t.Fatalf("an acknowledged restore left %s", keysOf(got))
			}
			return
		}
		v := plain(t, "verify", "--data", m.Data)
		if v.code != 0 {
			want := "finish the restore with `cockpitfs restore --data " + m.Data + "`"
			if !strings.Contains(v.out, "unfinished restore of "+backup) || !strings.Contains(v.out, want) {
				t.Fatalf("killed at %s: verify refused without naming the restore and %s:\n%s", at, want, v.out)
			}
			if seen["refused"] == 0 { // mount opens the store as verify does: once is enough
				mnt := filepath.Join(t.TempDir(), "mnt")
				if r := plain(t, "mount", "--data", m.Data, mnt); r.code == 0 || !strings.Contains(r.out, want) {
					t.Fatalf("killed at %s: mount (exit %d) did not refuse naming %s:\n%s", at, r.code, want, r.out)
				}
			}
			seen["refused"]++
			if r := plain(t, "restore", "--data", m.Data); r.code != 0 || !strings.Contains(r.out, "finished the restore of "+backup) {
				t.Fatalf("killed at %s: finishing the restore: %s", at, r.out)
			}
			if got := storeRecords(t, m.Data); !sameRecords(got, restored) {
				t.Fatalf("killed at %s, then finished: %s", at, keysOf(got))
			}
			return
		}
		if !strings.Contains(v.out, "records clean") {
			t.Fatalf("killed at %s: verify: %s", at, v.out)
		}
		switch got := storeRecords(t, m.Data); {
		case sameRecords(got, original):
			seen["original"]++
		case sameRecords(got, restored):
			seen["restored"]++
		default:
			t.Fatalf("killed at %s: the store holds neither the original nor the restored records: %s", at, keysOf(got))
		}
	}, "restore", "--data", m.Data, backup)
	t.Logf("restore killed %d times: %v", kills, seen)
	if seen["refused"] == 0 || seen["original"] == 0 {
		t.Fatalf("the kills never met the restore between its two stores: %v", seen)
	}
}

// restore killed after its moves, while it reads the store it replaced (as long as that store is
// big) or says what is lost: the restored store verified clean and nothing named the store kept
// aside, and the restore run again, as one would, found nothing lost and printed no undo line.
// Until its report is said the restore is unfinished; finishing it says what is lost and how to
// undo it, and that undo brings the replaced store back.
func TestRestoreKilledBeforeItsReportSaysHowToUndoIt(t *testing.T) {
	t.Parallel()
	m, backup, original, restored := restoreStores(t)
	pristine := filepath.Join(t.TempDir(), "pristine")
	replaceDir(t, m.Data, pristine)
	undoLine := regexp.MustCompile(`(?m)^to undo it: (cockpitfs backup --data \S+ FILE && cockpitfs restore --data \S+ FILE)$`)
	undone := 0
	faultLoop(t, []string{"openat", "write"}, func() { replaceDir(t, pristine, m.Data) }, func(at string, killed bool, out string) {
		if !killed {
			return
		}
		v := plain(t, "verify", "--data", m.Data)
		if v.code == 0 {
			if got := storeRecords(t, m.Data); sameRecords(got, restored) && !undoLine.MatchString(out) {
				t.Fatalf("killed at %s: the restored store verifies clean, and nothing said how to undo it:\n%s", at, out)
			}
			return
		}
		r := plain(t, "restore", "--data", m.Data)
		undo := undoLine.FindStringSubmatch(r.out)
		if r.code != 0 || undo == nil {
			t.Fatalf("killed at %s: finishing the restore: exit %d, no undo line:\n%s", at, r.code, r.out)
		}
		if undone++; undone > 3 { // running the undo a few times is enough
			return
		}
		file := filepath.Join(t.TempDir(), "undo.backup")
		sh := exec.Command("bash", "-c", strings.ReplaceAll(undo[1], "FILE", file))
		sh.Env = append(os.Environ(), "PATH="+filepath.Dir(binary)+":"+os.Getenv("PATH"))
		if out, err := sh.CombinedOutput(); err != nil {
			t.Fatalf("killed at %s: %s: %v\n%s", at, undo[1], err, out)
		}
		if got := storeRecords(t, m.Data); !sameRecords(got, original) {
			t.Fatalf("killed at %s, finished, then undone: %s", at, keysOf(got))
		}
	}, "restore", "--data", m.Data, backup)
}

// backup killed at each call: the file named is absent or a whole backup of the store, the store
// is unchanged and verifies clean.
func TestBackupKilledAtEachDiskCall(t *testing.T) {
	t.Parallel()
	m, _ := faultStores(t)
	records, before := storeRecords(t, m.Data), storeFingerprint(t, m.Data)
	dir := t.TempDir()
	file := filepath.Join(dir, "taken.backup")
	kills, _ := faultLoop(t, []string{"renameat", "linkat"}, func() {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}, func(at string, killed bool, out string) {
		b, err := kv.ReadBackup(file)
		switch {
		case !killed && (err != nil || !strings.Contains(out, "backed up to "+file)):
			t.Fatalf("an acknowledged backup: %v\n%s", err, out)
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			t.Fatalf("killed at %s: %s is neither absent nor a backup: %v", at, file, err)
		case !sameRecords(b.Records, records):
			t.Fatalf("killed at %s: the backup holds %s", at, keysOf(b.Records))
		}
		if after := storeFingerprint(t, m.Data); after != before {
			t.Fatalf("killed at %s: the store changed:\n%s\n%s", at, before, after)
		}
		// The backup has no name until it is whole (O_TMPFILE): nothing is left beside the file.
		if left, _ := filepath.Glob(filepath.Join(dir, ".backup-*")); len(left) > 0 {
			t.Errorf("killed at %s: left %v beside %s", at, left, file)
		}
	}, "backup", "--data", m.Data, file)
	if v := plain(t, "verify", "--data", m.Data); v.code != 0 {
		t.Fatalf("verify after the kills: %s", v.out)
	}
	t.Logf("backup killed %d times", kills)
}

// verify killed at each call changes nothing of the store: the next verify finds it clean.
func TestVerifyKilledAtEachDiskCall(t *testing.T) {
	t.Parallel()
	m, _ := faultStores(t)
	before := storeFingerprint(t, m.Data)
	kills, tmp := faultLoop(t, []string{"renameat"}, func() {}, func(at string, killed bool, out string) {
		if !killed && !strings.Contains(out, "records clean") {
			t.Fatalf("verify run to its end: %s", out)
		}
		if after := storeFingerprint(t, m.Data); after != before {
			t.Fatalf("killed at %s: the store changed:\n%s\n%s", at, before, after)
		}
	}, "verify", "--data", m.Data)
	// The next verify removes the copies the killed ones left in TMPDIR.
	v := exec.Command(plainBinary, "verify", "--data", m.Data)
	v.Env = append(os.Environ(), "TMPDIR="+tmp)
	if out, err := v.CombinedOutput(); err != nil {
		t.Fatalf("verify after the kills: %v\n%s", err, out)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "cockpitfs-inspect-*")); len(left) != 0 {
		t.Fatalf("verify killed %d times left %d copies of the store after the next verify: %v", kills, len(left), left)
	}
	t.Logf("verify killed %d times", kills)
}

// migrate from a data directory into a new one, killed at each call: the new one holds nothing
// (no store, or an empty one), or every key, or mount and verify refuse it naming the migration
// and the command that copies it anew; never part of the keys served.
func TestMigrateKilledAtEachDiskCall(t *testing.T) {
	t.Parallel()
	m, _ := faultStores(t)
	records := storeRecords(t, m.Data)
	dst := filepath.Join(t.TempDir(), "copy")
	again := fmt.Sprintf("`cockpitfs migrate %s %s` again", m.Data, dst)
	// refused checks what a kill between the first key and the verified end leaves: mount and
	// verify refuse it naming the command, which then copies everything.
	refused := func(at string) {
		mnt := filepath.Join(t.TempDir(), "mnt")
		if r := plain(t, "mount", "--data", dst, mnt); r.code == 0 || !strings.Contains(r.out, again) {
			t.Fatalf("killed at %s: mount (exit %d) did not refuse naming %s:\n%s", at, r.code, again, r.out)
		}
		if r := plain(t, "migrate", m.Data, dst); r.code != 0 {
			t.Fatalf("killed at %s: migrating again: %s", at, r.out)
		}
		if got := storeRecords(t, dst); !sameRecords(got, records) {
			t.Fatalf("killed at %s, migrated again: %s", at, keysOf(got))
		}
	}
	seen := map[string]int{}
	kills, tmp := faultLoop(t, []string{"renameat", "pwrite64"}, func() { os.RemoveAll(dst) }, func(at string, killed bool, out string) {
		if !killed && !strings.Contains(out, "copied ") {
			t.Fatalf("migrate run to its end: %s", out)
		}
		v := plain(t, "verify", "--data", dst)
		switch {
		case strings.Contains(v.out, "unfinished migration from "+m.Data) && strings.Contains(v.out, again):
			refused(at)
			seen["refused"]++
		case v.code != 0 && (strings.Contains(v.out, "does not exist") || strings.Contains(v.out, "holds no cockpitfs store")):
			seen["nothing"]++
		case v.code != 0:
			t.Fatalf("killed at %s: verify: %s", at, v.out)
		default:
			switch got := storeRecords(t, dst); {
			case len(got) == 0:
				seen["empty"]++
			case sameRecords(got, records):
				seen["whole"]++
			default:
				t.Fatalf("killed at %s (acknowledged: %v): the copy holds %s of the %d keys", at, !killed, keysOf(got), len(records))
			}
		}
	}, "migrate", m.Data, dst)
	t.Logf("migrate killed %d times: %v", kills, seen)
	// Which positions fall between the first key and the end depends on the threads the calls
	// run on; the last call of that window, the mark's removal, is killed for certain.
	os.RemoveAll(dst)
	mark := filepath.Join(dst, "MIGRATING")
	if killed, out := killedAt(t, tmp, "unlinkat", 1, mark, "migrate", m.Data, dst); !killed {
		t.Fatalf("migrate was not killed removing %s: %s", mark, out)
	}
	v := plain(t, "verify", "--data", dst)
	if v.code == 0 || !strings.Contains(v.out, "unfinished migration from "+m.Data) || !strings.Contains(v.out, again) {
		t.Fatalf("killed removing its mark: verify (exit %d) did not refuse naming %s:\n%s", v.code, again, v.out)
	}
	refused("unlinkat of the mark")
}

// migrate from a data directory into an etcd prefix, killed at each write (its requests to etcd
// among them): the prefix holds nothing, or every key, or verify refuses it naming the
// migration and the command that copies it anew; never part of the keys unmarked.
func TestMigrateToEtcdKilledAtEachCall(t *testing.T) {
	t.Parallel()
	m, _ := faultStores(t)
	records := storeRecords(t, m.Data)
	cluster := etcdtest.Start(t, 1)
	url := cluster.URL("faults")
	store := cluster.Open(t, "faults")
	held := func() map[string][]byte {
		got := map[string][]byte{}
		if err := store.View(func(tx storage.Txn) error {
			return tx.Scan("", func(k string, v []byte) error { got[k] = v; return nil })
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	empty := func() {
		for k := range held() {
			if err := store.Update(context.Background(), func(tx storage.Txn) error { return tx.Delete(k) }); err != nil {
				t.Fatal(err)
			}
		}
	}
	seen := map[string]int{}
	kills, _ := faultLoop(t, []string{"write"}, empty, func(at string, killed bool, out string) {
		if !killed && !strings.Contains(out, "copied ") {
			t.Fatalf("migrate run to its end: %s", out)
		}
		got := held()
		if _, marked := got["migrating"]; marked {
			again := fmt.Sprintf("`cockpitfs migrate %s %s` again", m.Data, url)
			if v := plain(t, "verify", "--store", url, "--command-timeout", "10s"); v.code == 0 || !strings.Contains(v.out, again) {
				t.Fatalf("killed at %s: verify (exit %d) did not refuse naming %s:\n%s", at, v.code, again, v.out)
			}
			if r := plain(t, "migrate", "--command-timeout", "10s", m.Data, url); r.code != 0 {
				t.Fatalf("killed at %s: migrating again: %s", at, r.out)
			}
			if got := held(); !sameRecords(got, records) {
				t.Fatalf("killed at %s, migrated again: %s", at, keysOf(got))
			}
			seen["refused"]++
			return
		}
		switch {
		case len(got) == 0:
			seen["empty"]++
		case sameRecords(got, records):
			seen["whole"]++
		default:
			t.Fatalf("killed at %s (acknowledged: %v): the prefix holds %s of the %d keys", at, !killed, keysOf(got), len(records))
		}
	}, "migrate", "--command-timeout", "10s", m.Data, url)
	t.Logf("migrate into etcd killed %d times: %v", kills, seen)
	// Which writes fall between the first key and the end depends on the threads they run on: a
	// prefix as such a kill leaves it (marked, part of the keys) is refused for certain.
	empty()
	if r := plain(t, "migrate", "--command-timeout", "10s", m.Data, url); r.code != 0 {
		t.Fatal(r.out)
	}
	if err := store.Update(context.Background(), func(tx storage.Txn) error {
		if err := tx.Set("migrating", []byte(m.Data)); err != nil {
			return err
		}
		return tx.Delete("c/app")
	}); err != nil {
		t.Fatal(err)
	}
	again := fmt.Sprintf("`cockpitfs migrate %s %s` again", m.Data, url)
	if v := plain(t, "verify", "--store", url, "--command-timeout", "10s"); v.code == 0 || !strings.Contains(v.out, again) {
		t.Fatalf("a marked prefix: verify (exit %d) did not refuse naming %s:\n%s", v.code, again, v.out)
	}
	if r := plain(t, "migrate", "--command-timeout", "10s", m.Data, url); r.code != 0 {
		t.Fatalf("migrating into a marked prefix again: %s", r.out)
	}
	if got := held(); !sameRecords(got, records) {
		t.Fatalf("migrated again: %s", keysOf(got))
	}
}

// mount killed at each call that changes the disk as it starts, on a data directory holding a
// store and (COCKPITFS_FAULTS=all, which also tries every call) on a fresh one: the next mount
// serves every record the store had, and verify finds it clean. A start the kill did not reach
// serves, and is unmounted.
func TestMountKilledAtEachDiskCall(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "strace")
	m, _ := faultStores(t)
	pristine := filepath.Join(t.TempDir(), "pristine")
	replaceDir(t, m.Data, pristine)
	// What a start and a clean stop leave of the store: what every killed start must leave too.
	m.start()
	m.Stop()
	records := storeRecords(t, m.Data)
	stores := []string{pristine}
	if os.Getenv("COCKPITFS_FAULTS") == "all" {
		stores = append(stores, "")
	}
	// The suite tries the calls that make a store: its files, its log's writes, their syncs.
	calls := []string{"openat", "pwrite64", "fdatasync", "renameat"}
	if os.Getenv("COCKPITFS_FAULTS") == "all" {
		calls = faultSyscalls
	}
	tmp := t.TempDir()
	for _, from := range stores {
		kills := 0
		for _, sc := range calls {
			for n := 1; n <= faultLimit(sc, nil); n++ {
				os.RemoveAll(m.Data)
				if from != "" {
					replaceDir(t, from, m.Data)
				}
				at := fmt.Sprintf("%s#%d", sc, n)
				if !mountKilledAt(t, m, tmp, sc, n) {
					break
				}
				kills++
				detach(m.Dir)
				m.start()
				m.Stop()
				if v, err := m.verify(); err != nil {
					t.Fatalf("killed at %s: verify: %v\n%s", at, err, v)
				}
				if from == "" {
					continue
				}
				if got := storeRecords(t, m.Data); !sameRecords(got, records) {
					t.Fatalf("killed at %s: the store now holds %s, not the %d records it had", at, keysOf(got), len(records))
				}
			}
		}
		t.Logf("mount on %q killed %d times", from, kills)
	}
}

// mountKilledAt starts the daemon on m's store and mount point killed at the n-th call of syscall;
// it reports whether the kill came before the daemon served. One that serves is unmounted.
func mountKilledAt(t *testing.T, m *mount, tmp, syscall string, n int) bool {
	t.Helper()
	cmd := exec.Command("strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace="+syscall,
		"-e", fmt.Sprintf("inject=%s:signal=KILL:when=%d", syscall, n), plainBinary, "mount", "--data", m.Data, m.Dir)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1", "TMPDIR="+tmp)
	log := newDaemonLog(t, cmd)
	if err := m.ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-done:
			var exit *exec.ExitError
			if ws, ok := cmd.ProcessState.Sys().(interface{ Signaled() bool }); errors.As(err, &exit) && (ok && ws.Signaled() || exit.ExitCode() == 128+9) {
				return true
			}
			t.Fatalf("mount under strace ended unkilled before serving (%v):\n%s", err, log)
		default:
		}
		if strings.Contains(log.String(), "serving "+m.Dir) && serving(m.Dir) {
			if r := plain(t, "unmount", m.Dir); r.code != 0 {
				t.Fatalf("unmounting a start the kill did not reach: %s", r.out)
			}
			<-done
			return false
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("mount under strace neither served nor died in 30 s:\n%s", log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
