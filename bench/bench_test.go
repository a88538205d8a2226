package bench

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine/listeners"
	"github.com/cockpitfs/cockpitfs/engine/liveness"
	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
)

// 1. read: open+read+close of the same path through cockpitfs, the FUSE floor and tmpfs, taken in
// turn within each iteration (see paired).
func BenchmarkRead(b *testing.B) {
	path := filepath.Join("app", "stacks", "s", "ports", "HTTP")
	buf := make([]byte, 64)
	targets := map[string]string{
		"cockpitfs": sharedDaemon(b).path(path),
		"floor":     filepath.Join(floorDirFor(b), path),
		"tmpfs":     filepath.Join(tmpfsDirFor(b), path),
	}
	ops := map[string]op{}
	for name, target := range targets {
		if n, err := readOnce(target, buf); err != nil || n != len(floorContent) {
			b.Fatalf("read %s: %d bytes, %v (want %d bytes)", target, n, err, len(floorContent))
		}
		ops[name] = op{run: func() error { _, err := readOnce(target, buf); return err }}
	}
	paired(b, ops)
}

// op is one operation timed by paired; undo, when set, runs after it untimed.
type op struct{ run, undo func() error }

// paired times each op once per iteration, in turn, and reports each op's median as
// "ns/<name>": the VM's wake-up latencies drift by 2× over seconds, and ops timed side by side
// see the same drift, so their ratio holds where sequential sub-benchmarks' did not.
func paired(b *testing.B, ops map[string]op) { pairedAfterIdle(b, 0, ops) }

// pairedAfterIdle is paired with the machine left idle for idle before each op, untimed: where a
// user's claim comes, seconds after anything else ran, not right behind another operation.
func pairedAfterIdle(b *testing.B, idle time.Duration, ops map[string]op) {
	names := make([]string, 0, len(ops))
	for name := range ops {
		names = append(names, name)
	}
	sort.Strings(names)
	samples := make(map[string][]time.Duration, len(ops))
	// Each round in its own order: an op's time depends on what ran just before it (what is left
	// in the caches), and a rotation keeps every op behind the same one. The seed is fixed, so
	// every run sees the same orders.
	order := rand.New(rand.NewPCG(1, 2))
	defer reportInterrupted(b)()
	b.ResetTimer()
	for range b.N {
		order.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
		for _, name := range names {
			time.Sleep(idle)
			start := time.Now()
			if err := ops[name].run(); err != nil {
				b.Fatalf("%s: %v", name, err)
			}
			samples[name] = append(samples[name], time.Since(start))
			if undo := ops[name].undo; undo != nil {
				if err := undo(); err != nil {
					b.Fatalf("%s, undoing: %v", name, err)
				}
			}
		}
	}
	for name, ds := range samples {
		slices.Sort(ds)
		b.ReportMetric(float64(ds[len(ds)/2].Nanoseconds()), "ns/"+name)
	}
}

// reportInterrupted reports, when the returned func runs, the EINTR retries per op since now.
func reportInterrupted(b *testing.B) func() {
	before := interrupted.Load()
	return func() { b.ReportMetric(float64(interrupted.Load()-before)/float64(b.N), "eintr/op") }
}

func readOnce(path string, buf []byte) (n int, err error) {
	var fd int
	if err := retry(func() (err error) { fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); return err }); err != nil {
		return 0, err
	}
	err = retry(func() (err error) { n, err = unix.Read(fd, buf); return err })
	unix.Close(fd)
	return n, err
}

// Stat is the path walk alone (a LOOKUP per component, then GETATTR): the part of a read's cost
// that is not open, read and release.
func BenchmarkStat(b *testing.B) {
	path := filepath.Join("app", "stacks", "s", "ports", "HTTP")
	var st unix.Stat_t
	stat := func(target string) op {
		return op{run: func() error { return retry(func() error { return unix.Stat(target, &st) }) }}
	}
	paired(b, map[string]op{
		"cockpitfs": stat(sharedDaemon(b).path(path)),
		"floor":     stat(filepath.Join(floorDirFor(b), path)),
	})
}

// 1b. list: what `ls` of a stack's directory and `ls -l` of its holders ask of the mount (a
// listing; a listing and an lstat of each name), on a stack l of five holders, beside the base
// build's when there is one.
func BenchmarkList(b *testing.B) {
	stack := []string{"app", "stacks", "l"}
	holders := append(stack[:3:3], "holders")
	fill := func(d *daemon) *daemon {
		if _, err := os.Stat(d.path(holders...)); err == nil {
			return d
		}
		if err := os.Mkdir(d.path(stack...), 0o755); err != nil {
			b.Fatal(err)
		}
		for _, h := range []string{"h1", "h2", "h3", "h4", "h5"} {
			if err := writeFile(d.path(append(holders, h)...), unix.O_CREAT, "pid=none checkout=/src/"+h); err != nil {
				b.Fatal(err)
			}
		}
		return d
	}
	list := func(dir string, stat bool) op {
		return op{run: func() error {
			es, err := os.ReadDir(dir)
			for _, e := range es {
				if stat && err == nil {
					_, err = os.Lstat(filepath.Join(dir, e.Name()))
				}
			}
			return err
		}}
	}
	d := fill(sharedDaemon(b))
	ops := map[string]op{
		"stack":   list(d.path(stack...), false),
		"holders": list(d.path(holders...), true),
	}
	if baseBinary != "" {
		d := fill(baseDaemon(b))
		ops["base-stack"] = list(d.path(stack...), false)
		ops["base-holders"] = list(d.path(holders...), true)
	}
	paired(b, ops)
}

// 2. write: a claim+release cycle through the mount against two FUSE writes and two fdatasyncs,
// with the parts of the cycle measured alone to show where its time goes. The cycle, its floors
// and the disk's parts are timed side by side (see paired); the engine in-process alone.
func BenchmarkWrite(b *testing.B) {
	b.Run("paired", func(b *testing.B) {
		holder := sharedDaemon(b).path("app", "stacks", "s", "holders", "w")
		floorHolder := filepath.Join(floorDirFor(b), "app", "stacks", "s", "holders", "w")
		fuseFd, err := unix.Open(filepath.Join(floorDirFor(b), "app", "stacks", "s", "control"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Close(fuseFd)
		disk := diskFile(b)
		defer disk.close()
		if commitStore == nil {
			commitStore = newStore(b, "store-commit")
		}
		line := []byte("holder=w checkout=/src/w\n")
		value := make([]byte, 1200)
		paired(b, map[string]op{
			"cockpitfs": {run: func() error {
				if err := createUnlink(holder); err != nil {
					return fmt.Errorf("%w\n%s", err, shared.log.String())
				}
				return nil
			}},
			"floor": {run: func() error {
				for range 2 {
					if _, err := unix.Pwrite(fuseFd, line, 0); err != nil {
						return err
					}
					if err := disk.write(line); err != nil {
						return err
					}
				}
				return nil
			}},
			"floor-create-unlink": {run: func() error { return createUnlink(floorHolder) }},
			// One kv.Update writing one record-sized value, no engine: its record in kv's
			// write-ahead log made durable, badger applying it meanwhile (kv/durable.go).
			"store-commit": {run: func() error {
				return commitStore.Update(ctx, func(tx storage.Txn) error { return tx.Set("k", value) })
			}},
			"fdatasync": {run: func() error { return disk.write(line) }},
			// With nothing left to write (every op above syncs what it wrote): the disk's cache
			// flush alone.
			"flush": {run: func() error { return unix.Fdatasync(disk.fd) }},
		})
	})
	b.Run("engine", func(b *testing.B) {
		f := writeEngine(b)
		b.ResetTimer()
		for range b.N {
			if err := f.cycle("app", "s", "w"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("caller-resolution", func(b *testing.B) {
		tid := unix.Gettid()
		for range b.N {
			if err := resolveCaller(tid); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("listener-check", func(b *testing.B) {
		ports := []int{20000, 20700}
		for range b.N {
			if _, err := listeners.Listening(ports); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// createUnlink is `touch holders/w; rm holders/w` without the processes: one claim, one release.
// Without O_EXCL, so an open retried after EINTR finds the holder its first try may have created.
func createUnlink(path string) error {
	if err := writeFile(path, unix.O_CREAT, ""); err != nil {
		return err
	}
	return retry(func() error { return unix.Unlink(path) })
}

// diskFileSize is how much of the fdatasync file is written once, before any sync is timed.
const diskFileSize = 1 << 20

// syncFile is a file on the disk the stores live on, written and fdatasync'd the way kv's log is:
// into blocks written and made durable before (diskFile fills it), so that a sync writes its data
// and nothing else, no size change and no block to allocate. (Appended to instead, each sync also
// writes the inode, as the first run of a benchmark did while the file was new.)
type syncFile struct {
	fd  int
	off int
}

// diskFile opens the fdatasync file, filled and synced once.
func diskFile(b *testing.B) *syncFile {
	fd, err := unix.Open(filepath.Join(workDir, "fdatasync"), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		b.Fatal(err)
	}
	if st.Size < diskFileSize {
		if _, err := unix.Pwrite(fd, make([]byte, diskFileSize), 0); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fsync(fd); err != nil {
			b.Fatal(err)
		}
	}
	return &syncFile{fd: fd}
}

// write writes line after the last one (from the start again at the end) and fdatasyncs, so there
// is something for the sync to write, as a commit.
func (f *syncFile) write(line []byte) error {
	if f.off+len(line) > diskFileSize {
		f.off = 0
	}
	if _, err := unix.Pwrite(f.fd, line, int64(f.off)); err != nil {
		return err
	}
	f.off += len(line)
	return unix.Fdatasync(f.fd)
}

func (f *syncFile) close() { unix.Close(f.fd) }

var (
	writeFixture *engineFixture
	commitStore  *kv.DB
)

func writeEngine(b *testing.B) *engineFixture {
	if writeFixture == nil {
		f := newEngine(b, "engine-write")
		f.cockpit(b, "app", 20000, 10, 20)
		f.heldStack(b, "app", "s")
		writeFixture = f
	}
	return writeFixture
}

// 6. peer: one claim by cockpitfs (through the mount and in-process) and by the seeds' lock-file
// transaction on the same disk, and by the base build's daemon when there is one (baseBinary).
// The release after each claim is not counted.
func BenchmarkClaim(b *testing.B) {
	f, p := writeEngine(b), peer(b)
	disk := diskFile(b)
	defer disk.close()
	if commitStore == nil {
		commitStore = newStore(b, "store-commit")
	}
	value, line := make([]byte, 1200), []byte("holder=c checkout=/src/c\n")
	var engineWork []time.Duration // each engine claim's time outside its store commit
	ops := map[string]op{
		"cockpitfs": create(sharedDaemon(b).path("app", "stacks", "s", "holders", "c")),
		"floor":     create(filepath.Join(floorDirFor(b), "app", "stacks", "s", "holders", "c")),
		"synced":    create(filepath.Join(floorDirFor(b), "app", "stacks", "s", "synced", "c")),
		"engine": {
			run: func() error {
				began, committing := time.Now(), f.commits.spent.Load()
				err := f.eng.Claim(ctx, caller("create"), "app", "s", "c", untracked("c"))
				engineWork = append(engineWork, time.Since(began)-time.Duration(f.commits.spent.Load()-committing))
				return err
			},
			undo: func() error { return f.eng.Release(ctx, caller("unlink"), "app", "s", "c") },
		},
		"peer": peerClaim(p),
		// The parts a claim through the mount cannot skip, in the same run: one store commit,
		// what the commit would cost at its physical limit, and the caller's identity.
		"commit":    {run: func() error { return commitStore.Update(ctx, func(tx storage.Txn) error { return tx.Set("k", value) }) }},
		"fdatasync": {run: func() error { return disk.write(line) }},
		"caller":    {run: func() error { return resolveCaller(unix.Gettid()) }},
	}
	if baseBinary != "" {
		ops["base"] = create(baseDaemon(b).path("app", "stacks", "s", "holders", "c"))
	}
	paired(b, ops)
	slices.Sort(engineWork)
	b.ReportMetric(float64(engineWork[len(engineWork)/2].Nanoseconds()), "ns/engine-work")
}

// create claims holder with open(O_CREAT|O_WRONLY) and close (on the floor, a create alone); the
// release is untimed.
func create(holder string) op {
	return op{
		run:  func() error { return writeFile(holder, unix.O_CREAT, "") },
		undo: func() error { return retry(func() error { return unix.Unlink(holder) }) },
	}
}

// peerClaim is the peer's claim of holder c; its release is untimed.
func peerClaim(p *peerStore) op {
	return op{run: func() error { return p.claim("c") }, undo: func() error { return p.release("c") }}
}

// claimIdle is how long the machine idles before each op of BenchmarkClaimAfterIdle: long enough
// for the CPUs to sleep and the disk's queue to drain (300 ms and 1 s measure alike), short
// enough for a few minutes' run.
const claimIdle = 30 * time.Millisecond

// 6a. the claim after idle: BenchmarkClaim's claim, synced floor, write+fdatasync and peer, each
// after claimIdle with nothing running. Back to back, as BenchmarkClaim times them, every cache
// is warm and the device answers at once; a user claims after idle, where both are cold.
func BenchmarkClaimAfterIdle(b *testing.B) {
	disk := diskFile(b)
	defer disk.close()
	line := []byte("holder=c checkout=/src/c\n")
	ops := map[string]op{
		"cockpitfs": create(sharedDaemon(b).path("app", "stacks", "s", "holders", "c")),
		"synced":    create(filepath.Join(floorDirFor(b), "app", "stacks", "s", "synced", "c")),
		"fdatasync": {run: func() error { return disk.write(line) }},
		"peer":      peerClaim(peer(b)),
	}
	if baseBinary != "" {
		ops["base"] = create(baseDaemon(b).path("app", "stacks", "s", "holders", "c"))
	}
	pairedAfterIdle(b, claimIdle, ops)
}

// 6b. touch: a claim as touch(1) makes it — open(O_CREAT), futimens on that fd, close — and a
// touch of a holder the benchmark's session holds already (utimensat by path: a Makefile's claim
// target run again), beside the same on the FUSE floor, the peer's claim, and the base build's
// when there is one. The release after each claim is not counted.
func BenchmarkTouch(b *testing.B) {
	claim := func(holder string) op {
		return op{
			run:  func() error { return touchFile(holder) },
			undo: func() error { return retry(func() error { return unix.Unlink(holder) }) },
		}
	}
	again := func(holder string) op {
		if err := touchFile(holder); err != nil {
			b.Fatal(err)
		}
		return op{run: func() error { return retry(func() error { return unix.UtimesNano(holder, nil) }) }}
	}
	holders := func(root string) string { return filepath.Join(root, "app", "stacks", "s", "holders") }
	p := peer(b)
	ops := map[string]op{
		"cockpitfs":   claim(filepath.Join(holders(sharedDaemon(b).path()), "t")),
		"again":       again(filepath.Join(holders(sharedDaemon(b).path()), "kept")),
		"floor":       claim(filepath.Join(holders(floorDirFor(b)), "t")),
		"floor-again": again(filepath.Join(holders(floorDirFor(b)), "kept")),
		"peer":        {run: func() error { return p.claim("t") }, undo: func() error { return p.release("t") }},
	}
	if baseBinary != "" {
		ops["base"] = claim(filepath.Join(holders(baseDaemon(b).path()), "t"))
		ops["base-again"] = again(filepath.Join(holders(baseDaemon(b).path()), "kept"))
	}
	paired(b, ops)
}

// touchFile is what touch(1) does to a file: open it, creating it, and set its times to now
// through that fd.
func touchFile(path string) error {
	var fd int
	if err := retry(func() (err error) {
		fd, err = unix.Open(path, unix.O_CREAT|unix.O_WRONLY|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o666)
		return err
	}); err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := retry(func() error { return unix.UtimesNanoAt(fd, "", nil, unix.AT_EMPTY_PATH) }); err != nil {
		return fmt.Errorf("futimens %s: %w", path, err)
	}
	return nil
}

// resolveCaller is what a claim through the mount learns of its caller before its transaction,
// and an engine claim of a holder without a process does not: thread → process, its cwd, and its
// session's holder with that holder's start identity.
func resolveCaller(tid int) error {
	pid, err := liveness.ProcessOf(tid)
	if err != nil {
		return err
	}
	if _, err := liveness.Cwd(pid); err != nil {
		return err
	}
	_, obs, err := liveness.ObserveSessionHolder(pid)
	if err == nil && obs.State != liveness.Present {
		err = fmt.Errorf("session holder of %d: %+v", pid, obs)
	}
	return err
}

var peerFixture *peerStore

// peer starts from the shared daemon's own record of stack s, so both commit the same document.
func peer(b *testing.B) *peerStore {
	if peerFixture == nil {
		record, err := os.ReadFile(sharedDaemon(b).path("app", "stacks", "s", "record"))
		if err != nil {
			b.Fatal(err)
		}
		if peerFixture, err = newPeerStore(filepath.Join(workDir, "peer"), record); err != nil {
			b.Fatal(err)
		}
	}
	return peerFixture
}

// 3. concurrency: claim/release cycles by 1, 4 and 16 writers, each on its own stack or all on one.
func BenchmarkConcurrency(b *testing.B) {
	for _, shape := range []string{"distinct", "one"} {
		for _, writers := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("%s-%d", shape, writers), func(b *testing.B) {
				f := concurrencyEngine(b)
				stack := func(w int) string {
					if shape == "one" {
						return "one"
					}
					return fmt.Sprintf("d%d", w)
				}
				conflicts := f.db.Conflicts()
				var next atomic.Int64
				var failed atomic.Pointer[error]
				var wg sync.WaitGroup
				b.ResetTimer()
				began := time.Now()
				for w := range writers {
					wg.Go(func() {
						for next.Add(1) <= int64(b.N) {
							if err := f.cycle("app", stack(w), fmt.Sprintf("w%d", w)); err != nil {
								failed.Store(&err)
								return
							}
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(began)
				if err := failed.Load(); err != nil {
					b.Fatal(*err)
				}
				commits := float64(2 * b.N)
				b.ReportMetric(commits/elapsed.Seconds(), "commits/s")
				b.ReportMetric(float64(f.db.Conflicts()-conflicts)/commits, "conflicts/commit")
			})
		}
	}
}

var concurrencyFixture *engineFixture

func concurrencyEngine(b *testing.B) *engineFixture {
	if concurrencyFixture == nil {
		f := newEngine(b, "engine-concurrency")
		f.cockpit(b, "app", 20000, 10, 20)
		for w := range 16 {
			f.heldStack(b, "app", fmt.Sprintf("d%d", w))
		}
		f.heldStack(b, "app", "one")
		concurrencyFixture = f
	}
	return concurrencyFixture
}

// 4. scale: leasing a family for a stack of cockpit c0 while 0, 99 or 999 other stacks across 10
// cockpits hold leases (so the new one makes 1, 100, 1000). Each cockpit declares 100 families of
// its own port range; c0's new lease walks past every family c0's other stacks hold. The three
// engines lease side by side (see paired); each lease's sleep drain, which releases it, is untimed.
func BenchmarkAllocation(b *testing.B) {
	ops := map[string]op{}
	for _, active := range []int{1, 100, 1000} {
		f := allocationEngine(b, active)
		ops[fmt.Sprintf("stacks-%d", active)] = op{
			run:  func() error { return f.eng.Claim(ctx, caller("create"), "c0", "m", "h", untracked("h")) },
			undo: func() error { return f.drainSleep("c0", "m", "h") },
		}
	}
	paired(b, ops)
}

var allocationFixtures = map[int]*engineFixture{}

func allocationEngine(b *testing.B, active int) *engineFixture {
	if f, ok := allocationFixtures[active]; ok {
		return f
	}
	f := newEngine(b, fmt.Sprintf("engine-allocation-%d", active))
	for c := range 10 {
		f.cockpit(b, fmt.Sprintf("c%d", c), 2000+3000*c, 10, 100)
	}
	// Stack i goes to cockpit (i+1) mod 10, which leaves c0 one short of its 100 families.
	for i := range active - 1 {
		f.heldStack(b, fmt.Sprintf("c%d", (i+1)%10), fmt.Sprintf("s%d", i))
	}
	if err := f.eng.CreateStack(ctx, caller("mkdir"), "c0", "m"); err != nil {
		b.Fatal(err)
	}
	allocationFixtures[active] = f
	return f
}

// 5. footprint: a fresh daemon's mount-ready time, idle RSS, peak RSS and allocated disk over 10k
// operations (5000 claim+release cycles through the mount), the same once the store settled, then
// after 3,000 cockpits each written a 60 KB config and removed, its peak and settled RSS as it
// makes 10,000 stacks, and its restart time after kill -9 (with them). One measurement per invocation: run it with -benchtime=1x.
func BenchmarkFootprint(b *testing.B) {
	d := newDaemon(fmt.Sprintf("footprint-%d", time.Now().UnixNano()))
	defer os.RemoveAll(filepath.Dir(d.Dir))
	defer d.stop()
	ready := d.startStack(b)
	time.Sleep(time.Second)
	idle := d.mib(b, "VmRSS")
	diskFresh := allocatedMiB(b, d.Data)
	teamIdle := teamFreshRSS(b)
	holder := d.path("app", "stacks", "s", "holders", "w")
	began := time.Now()
	for range 5000 {
		if err := createUnlink(holder); err != nil {
			b.Fatalf("%v\n%s", err, d.log.String())
		}
	}
	opsPerSecond := 10000 / time.Since(began).Seconds()
	peak := d.mib(b, "VmHWM")
	time.Sleep(time.Second)
	idleAfter := d.mib(b, "VmRSS")
	disk := allocatedMiB(b, d.Data)
	time.Sleep(settled)
	idleSettled := d.mib(b, "VmRSS")
	doc := "[ports]\nstep = 10\ncount = 20\n[ports.bases]\nHTTP = 40500\n#" + strings.Repeat("x", 60000) + "\n"
	for i := range 3000 {
		c := d.path(fmt.Sprintf("churn%d", i))
		err := os.Mkdir(c, 0o755)
		if err == nil {
			err = os.WriteFile(filepath.Join(c, "config"), []byte(doc), 0o644)
		}
		if err == nil {
			err = os.Remove(c)
		}
		if err != nil {
			b.Fatalf("churn: %v\n%s", err, d.log.String())
		}
	}
	churnPeak := d.mib(b, "VmHWM")
	time.Sleep(settled)
	churnIdle := d.mib(b, "VmRSS")
	churnDisk := allocatedMiB(b, d.Data)
	// 10,000 stacks in 10 cockpits, the peak counted from here (clear_refs 5 resets VmHWM).
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", d.cmd.Process.Pid), []byte("5"), 0); err != nil {
		b.Fatal(err)
	}
	for c := range 10 {
		cockpit := fmt.Sprintf("many%d", c)
		err := os.Mkdir(d.path(cockpit), 0o755)
		if err == nil {
			err = writeFile(d.path(cockpit, "config"), unix.O_TRUNC, config(30000+1000*c, 10, 20))
		}
		for s := 0; s < 1000 && err == nil; s++ {
			err = os.Mkdir(d.path(cockpit, "stacks", fmt.Sprintf("s%d", s)), 0o755)
		}
		if err != nil {
			b.Fatalf("10,000 stacks: %v\n%s", err, d.log.String())
		}
	}
	stacksPeak := d.mib(b, "VmHWM")
	time.Sleep(settled)
	stacksIdle := d.mib(b, "VmRSS")
	if err := d.kill(); err != nil {
		b.Fatal(err)
	}
	// SPEC §1: the daemon clears the dead mount it finds. If it fails to, that is reported and the
	// restart is timed again after a detach, which still measures reopening the crashed store.
	staleMountRefused := 0.0
	restart, err := d.start()
	if err != nil {
		b.Logf("restart on the dead mount failed: %v", err)
		staleMountRefused = 1
		detach(d.Dir)
		if restart, err = d.start(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(ready.Microseconds())/1000, "ms-ready")
	b.ReportMetric(idle, "MiB-idle")
	b.ReportMetric(teamIdle, "MiB-idle-team")
	b.ReportMetric(peak, "MiB-peak")
	b.ReportMetric(idleAfter, "MiB-idle-after")
	b.ReportMetric(idleSettled, "MiB-idle-settled")
	b.ReportMetric(disk, "MiB-disk")
	b.ReportMetric(diskFresh, "MiB-disk-fresh")
	b.ReportMetric(churnPeak, "MiB-churn-peak")
	b.ReportMetric(churnIdle, "MiB-churn-idle")
	b.ReportMetric(churnDisk, "MiB-churn-disk")
	b.ReportMetric(stacksPeak, "MiB-stacks-peak")
	b.ReportMetric(stacksIdle, "MiB-stacks-idle")
	b.ReportMetric(float64(restart.Microseconds())/1000, "ms-restart")
	b.ReportMetric(staleMountRefused, "stale-mount-refused")
	b.ReportMetric(opsPerSecond, "ops/s")
}

// teamFreshRSS is the idle RSS of a fresh daemon of the build with team mode, on a data directory
// and set up as BenchmarkFootprint's: what linking the etcd client costs a daemon that never uses it.
func teamFreshRSS(b *testing.B) float64 {
	d := newDaemon(fmt.Sprintf("footprint-team-%d", time.Now().UnixNano()))
	d.bin = teamDaemonBinary(b)
	defer os.RemoveAll(filepath.Dir(d.Dir))
	defer d.stop()
	d.startStack(b)
	time.Sleep(time.Second)
	return d.mib(b, "VmRSS")
}

// settled is how long a store written and then left idle takes to settle (kv/settle.go: up to two
// polls of 5 s, a checkpoint and compaction, and 20 s more before its freed memory goes back: 30 s,
// and the settle's own work, which a churned store's compaction makes seconds long).
const settled = 40 * time.Second

func allocatedMiB(b *testing.B, dir string) float64 {
	n, err := allocatedBytes(dir)
	if err != nil {
		b.Fatal(err)
	}
	return float64(n) / (1 << 20)
}

func (d *daemon) mib(b *testing.B, field string) float64 {
	kib, err := d.statusKiB(field)
	if err != nil {
		b.Fatal(err)
	}
	return float64(kib) / 1024
}
