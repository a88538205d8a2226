package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine/listeners"
)

// crowdedStacks is how many stacks the crowded daemon holds besides app/s.
const crowdedStacks = 1000

// 8. health: `cat health` (as cat does it: catOnce) of one stack on a daemon with 1,000 other stacks and on the shared one
// (a few stacks), against `cat ports/HTTP` on the crowded daemon and the listener check health
// makes of the stack's two ports, the same cat of a direct-I/O file on the FUSE floor, and the
// observation in-process, side by side.
func BenchmarkHealth(b *testing.B) {
	d := crowdedDaemon(b)
	buf := make([]byte, 64<<10)
	cat := func(path string) op {
		return op{run: func() error {
			n, err := catOnce(path, buf)
			if err == nil && n == 0 {
				err = fmt.Errorf("%s read empty", path)
			}
			return err
		}}
	}
	eng := observationEngine(b)
	var rendered []byte
	paired(b, map[string]op{
		"observation": {run: func() error {
			obs, err := eng.eng.Health("app", "s")
			rendered = rendered[:0]
			for _, o := range obs {
				rendered = append(o.AppendJSON(rendered), '\n')
			}
			return err
		}},
		"health-crowded": cat(d.path("app", "stacks", "s", "health")),
		"health-alone":   cat(sharedDaemon(b).path("app", "stacks", "s", "health")),
		"ports":          cat(d.path("app", "stacks", "s", "ports", "HTTP")),
		"listener-check": {run: func() error { _, err := listeners.Listening([]int{20000, 20700}); return err }},
		// The same requests as a health read (OPEN, GETATTR, two READs, RELEASE) on a direct-I/O
		// file of the FUSE floor: what a health read costs with nothing observed.
		"floor-direct": cat(filepath.Join(floorDirFor(b), "app", "stacks", "s", "control")),
		// The same cat of the floor's kept file, as ports/HTTP is served: with floor-direct, what a
		// file rendered at each open costs against one the kernel keeps, with no daemon work at all.
		"floor-cached": cat(filepath.Join(floorDirFor(b), "app", "stacks", "s", "ports", "HTTP")),
	})
}

// catOnce does what cat does to path: open, fstat (for its buffer size, and to refuse copying a
// file onto itself), read to the end, close. FUSE sends the fstat as a stat by path.
// Its calls stay on one thread, as cat's do.
func catOnce(path string, buf []byte) (total int, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var fd int
	if err := retry(func() (err error) { fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); return err }); err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := retry(func() error { return unix.Fstat(fd, &st) }); err != nil {
		return 0, err
	}
	for {
		var n int
		if err := retry(func() (err error) { n, err = unix.Read(fd, buf); return err }); err != nil || n == 0 {
			return total, err
		}
		total += n
	}
}

var observed *engineFixture

// observationEngine is an engine of its own holding app/s as the daemons hold it, for the
// observation alone, in-process.
func observationEngine(b *testing.B) *engineFixture {
	if observed == nil {
		observed = newEngine(b, "health-engine")
		observed.cockpit(b, "app", 20000, 10, 20)
		observed.heldStack(b, "app", "s")
	}
	return observed
}

var crowded *daemon

// crowdedDaemon is a daemon with app/s held as in the shared daemon and cockpit crowd's 1,000
// stacks, a third of them holding leases.
func crowdedDaemon(b *testing.B) *daemon {
	if crowded != nil {
		return crowded
	}
	d := newDaemon("crowded")
	if _, err := d.start(); err != nil {
		b.Fatal(err)
	}
	cleanups = append(cleanups, d.stop)
	if err := d.setupStack(); err != nil {
		b.Fatalf("%v\n%s", err, d.log.String())
	}
	if err := os.Mkdir(d.path("crowd"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := writeFile(d.path("crowd", "config"), unix.O_TRUNC, config(30000, 2, 400)); err != nil {
		b.Fatal(err)
	}
	for i := range crowdedStacks {
		stack := d.path("crowd", "stacks", fmt.Sprintf("s%d", i))
		if err := os.Mkdir(stack, 0o755); err != nil {
			b.Fatalf("%v\n%s", err, d.log.String())
		}
		if i%3 == 0 {
			if err := writeFile(filepath.Join(stack, "holders", "base"), unix.O_CREAT, "pid=none checkout=/src/base"); err != nil {
				b.Fatalf("%v\n%s", err, d.log.String())
			}
		}
	}
	crowded = d
	return d
}
