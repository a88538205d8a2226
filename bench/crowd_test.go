package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine"
)

// 9. a crowded stack (issue 17 target 2, issue 18 item 10): a claim on a stack with 1,000 holders
// beside the same claim on a stack with 1, through the mount and in-process, and the disk a data
// directory takes over claim/release cycles on a stack with 1,024 holders. The crowd is untracked
// (pid=none): the figure is the commit's, not liveness probes of a thousand processes; beside it, in
// process, a stack whose 1,000 holders one live process holds (one probe).

const crowd = 1000

// crowdStack serves app/stacks/one, held by "base", and app/stacks/many, held by base and
// crowd-1 more.
var crowdStack *daemon

func crowdStackDaemon(b *testing.B) *daemon {
	b.Helper()
	if crowdStack != nil {
		return crowdStack
	}
	d := newDaemon("crowd")
	if _, err := d.start(); err != nil {
		b.Fatal(err)
	}
	cleanups = append(cleanups, d.stop)
	if err := d.setupCrowd(crowd); err != nil {
		b.Fatalf("%v\n%s", err, d.log.String())
	}
	crowdStack = d
	return d
}

// setupCrowd makes cockpit app with stack one held by "base" and stack many held by n holders.
func (d *daemon) setupCrowd(n int) error {
	if err := os.Mkdir(d.path("app"), 0o755); err != nil {
		return err
	}
	if err := writeFile(d.path("app", "config"), unix.O_TRUNC, config(21000, 10, 20)); err != nil {
		return err
	}
	for _, stack := range []string{"one", "many"} {
		if err := os.Mkdir(d.path("app", "stacks", stack), 0o755); err != nil {
			return err
		}
		if err := writeFile(d.path("app", "stacks", stack, "holders", "base"), unix.O_CREAT, "pid=none checkout=/src/base"); err != nil {
			return err
		}
	}
	for i := 1; i < n; i++ {
		name := fmt.Sprintf("h%04d", i)
		if err := writeFile(d.path("app", "stacks", "many", "holders", name), unix.O_CREAT, "pid=none checkout=/src/"+name); err != nil {
			return err
		}
	}
	return nil
}

var crowdEngineFixture *engineFixture

func crowdEngine(b *testing.B) *engineFixture {
	if crowdEngineFixture == nil {
		f := newEngine(b, "engine-crowd")
		f.cockpit(b, "app", 21000, 10, 20)
		f.heldStack(b, "app", "one")
		f.heldStack(b, "app", "many")
		f.heldStack(b, "app", "session")
		for i := 1; i < crowd; i++ {
			name := fmt.Sprintf("h%04d", i)
			if err := f.eng.Claim(ctx, caller("create"), "app", "many", name, untracked(name)); err != nil {
				b.Fatal(err)
			}
			// Held by one live process, which each claim probes for the dead holders it releases.
			live := &engine.Holder{CheckoutPath: "/src/" + name, PID: os.Getpid()}
			if err := f.eng.Claim(ctx, caller("create"), "app", "session", name, live); err != nil {
				b.Fatal(err)
			}
		}
		crowdEngineFixture = f
	}
	return crowdEngineFixture
}

// BenchmarkCrowd is one claim (touch holders/c) on a stack with 1 holder and on one with 1,000,
// through the mount and in-process; the release after each is not counted.
func BenchmarkCrowd(b *testing.B) {
	d, f := crowdStackDaemon(b), crowdEngine(b)
	touch := func(stack string) op {
		holder := d.path("app", "stacks", stack, "holders", "c")
		return op{
			run:  func() error { return writeFile(holder, unix.O_CREAT, "") },
			undo: func() error { return retry(func() error { return unix.Unlink(holder) }) },
		}
	}
	claim := func(stack string) op {
		return op{
			run:  func() error { return f.eng.Claim(ctx, caller("create"), "app", stack, "c", untracked("c")) },
			undo: func() error { return f.eng.Release(ctx, caller("unlink"), "app", stack, "c") },
		}
	}
	paired(b, map[string]op{
		"holders-1": touch("one"), "holders-1000": touch("many"),
		"engine-holders-1": claim("one"), "engine-holders-1000": claim("many"), "engine-session-1000": claim("session"),
	})
}

var diskRuns int // each run of BenchmarkCrowdDisk starts a daemon of its own

// BenchmarkCrowdDisk runs b.N claim/release cycles through the mount on a stack with 1,024
// holders and reports the data directory's allocated size before and after, in MiB.
func BenchmarkCrowdDisk(b *testing.B) {
	diskRuns++
	d := newDaemon(fmt.Sprintf("crowd-disk-%d", diskRuns))
	if _, err := d.start(); err != nil {
		b.Fatal(err)
	}
	defer d.stop()
	if err := d.setupCrowd(1023); err != nil {
		b.Fatalf("%v\n%s", err, d.log.String())
	}
	holder := d.path("app", "stacks", "many", "holders", "c")
	before, err := allocatedBytes(d.Data)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if err := writeFile(holder, unix.O_CREAT, ""); err != nil {
			b.Fatal(err)
		}
		if err := retry(func() error { return unix.Unlink(holder) }); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	after, err := allocatedBytes(d.Data)
	if err != nil {
		b.Fatal(err)
	}
	vlogs, _ := filepath.Glob(filepath.Join(d.Data, "*.vlog"))
	var vlog int64
	for _, path := range vlogs {
		if n, err := allocatedBytes(path); err == nil {
			vlog += n
		}
	}
	b.ReportMetric(float64(before)/(1<<20), "MiB-before")
	b.ReportMetric(float64(after)/(1<<20), "MiB-after")
	b.ReportMetric(float64(vlog)/(1<<20), "MiB-vlog")
}
