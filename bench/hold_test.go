package bench

import (
	"fmt"
	"os"
	"testing"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/portlock"
	"golang.org/x/sys/unix"
)

// 8. machine-wide holds: what holding a new lease's ports (one abstract unix socket each, issue 11)
// adds to the lease. Side by side: a new lease (claim on an idle stack, 2 ports) by an engine that
// holds its ports and by one that does not, in-process on the data disk; and the holds alone —
// taking a 2-port family's two holds, which is all a claim adds — beside the same socket, bind and
// listen calls alone, the least a hold can cost on this kernel and load. Each lease is undone untimed by a
// sleep drain, each hold by its release. The holds are taken in a space of this run's own, so other
// daemons on the machine do not meet them (the syscalls are those of portlock.Machine).
func BenchmarkHold(b *testing.B) {
	held, unheld := holdEngines(b)
	lease := func(f *engineFixture) op {
		return op{
			run:  func() error { return f.eng.Claim(ctx, caller("create"), "c", "m", "h", untracked("h")) },
			undo: func() error { return f.drainSleep("c", "m", "h") },
		}
	}
	space := holdSpace()
	var holds []*portlock.Hold
	var fds []int
	paired(b, map[string]op{
		// The least a hold can cost: the same socket, bind and listen, nothing else.
		"syscall-floor": {
			run: func() error {
				for _, port := range []int{29100, 29600} {
					fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
					if err != nil {
						return err
					}
					fds = append(fds, fd)
					if err := unix.Bind(fd, &unix.SockaddrUnix{Name: fmt.Sprintf("@%s%d", space, port)}); err != nil {
						return err
					}
					if err := unix.Listen(fd, 16); err != nil {
						return err
					}
				}
				return nil
			},
			undo: func() error {
				for _, fd := range fds {
					unix.Close(fd)
				}
				fds = fds[:0]
				return nil
			},
		},
		"lease-held":   lease(held),
		"lease-unheld": lease(unheld),
		"hold": {
			run: func() error {
				for _, port := range []int{29000, 29500} {
					h, err := space.Take(port, portlock.Identity{PID: os.Getpid(), Cockpit: "c", Stack: "m", Key: "HTTP"})
					if err != nil {
						return err
					}
					holds = append(holds, h)
				}
				return nil
			},
			undo: func() error {
				for _, h := range holds {
					h.Release()
				}
				holds = holds[:0]
				return nil
			},
		},
	})
}

// holdSpace is this run's own space of hold names.
func holdSpace() portlock.Space {
	return portlock.Space(fmt.Sprintf("cockpitfs-bench/%d/port/", os.Getpid()))
}

var holdFixtures []*engineFixture

// holdEngines returns, made once per run, an engine that holds its ports and one that does not,
// each with a cockpit c and an idle stack m.
func holdEngines(b *testing.B) (held, unheld *engineFixture) {
	if holdFixtures == nil {
		held, unheld := newEngine(b, "hold-held"), newEngine(b, "hold-unheld")
		if _, err := held.eng.HoldPorts(holdSpace(), engine.DaemonIdentity{PID: os.Getpid(), UID: uint32(os.Getuid()), Data: "bench"}); err != nil {
			b.Fatal(err)
		}
		for i, f := range []*engineFixture{held, unheld} {
			f.cockpit(b, "c", 26000+1000*i, 10, 10)
			if err := f.eng.CreateStack(ctx, caller("mkdir"), "c", "m"); err != nil {
				b.Fatal(err)
			}
		}
		holdFixtures = []*engineFixture{held, unheld}
	}
	return holdFixtures[0], holdFixtures[1]
}
