package bench

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine/listeners"
	"github.com/cockpitfs/cockpitfs/engine/portlock"
)

// busySockets is how many TCP sockets the new-lease benchmark keeps open: a busy laptop's worth.
const busySockets = 10000

// 7. new lease: a claim that leases a family (its stack was idle) against a co-tenant's claim (the
// stack keeps its lease), both through the mount, and against the peer's new lease (the seeds'
// commit with a connect probe of each candidate port, peerStore.newLease), while the machine has
// 10,000 more open TCP sockets. A new lease differs by its listener check, which asks the kernel
// about the candidate ports only; reading the socket tables, as the check did before, is timed
// beside it. Each claim is undone untimed: the co-tenant's by its release, the new lease by a
// sleep drain, the peer's by the record its drain leaves.
//
// Beside them, what a new lease adds to a co-tenant's claim, each alone and both followed by a
// co-tenant's claim as one operation: the listener check, and the two machine-wide holds (the
// same portlock calls, in a space of this run's own). And what it no longer sends: a LOOKUP of a
// holder name that does not exist, which a co-tenant's claim of a name it unlinked sends before
// its CREATE, and a new lease of the name the drain released does not (the daemon's helper looked
// it up after the drain, fs/forget.go).
func BenchmarkNewLease(b *testing.B) {
	l := newLeaseSetup(b)
	defer l.close()
	d := l.d
	cotenant := d.path("app", "stacks", "s", "holders", "t")
	buf := make([]byte, 1<<20)
	checks := l.checks()
	var st unix.Stat_t
	claimCotenant := func() error { return writeFile(cotenant, unix.O_CREAT, "") }
	releaseCotenant := func() error { return retry(func() error { return unix.Unlink(cotenant) }) }
	lookupMissing := func() error {
		missingLookups++ // a name the kernel has not seen, in no run before either: one LOOKUP
		name := d.path("app", "stacks", "s", "holders", "missing-"+strconv.Itoa(missingLookups))
		if err := retry(func() error { return unix.Stat(name, &st) }); err != unix.ENOENT {
			return fmt.Errorf("stat of a missing holder: %v", err)
		}
		return nil
	}
	paired(b, map[string]op{
		"co-tenant":      {run: claimCotenant, undo: releaseCotenant},
		"new-lease":      l.newLease(),
		"peer":           l.peerNewLease(b),
		"synced":         l.syncedFloor(b),
		"listener-check": {run: checks.listeners},
		"holds":          {run: checks.take, undo: checks.release},
		"lookup":         {run: lookupMissing},
		// The check and the holds together with the co-tenant's claim, timed as one: what they
		// cost each other in caches counts too.
		"co-tenant-plus": {
			run: func() error {
				for _, f := range []func() error{checks.listeners, checks.take, claimCotenant} {
					if err := f(); err != nil {
						return err
					}
				}
				return nil
			},
			undo: func() error { checks.release(); return releaseCotenant() },
		},
		"socket-tables": {run: func() error {
			for _, table := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
				if _, err := readAll(table, buf); err != nil {
					return err
				}
			}
			return nil
		}},
	})
	b.ReportMetric(float64(tableRows(b)), "sockets")
}

// 7a. the new lease after idle: BenchmarkNewLease's new lease through the mount, the peer's, and a
// co-tenant's claim, each after claimIdle with nothing running (see BenchmarkClaimAfterIdle), with
// the same 10,000 sockets open. Beside them, the synced floor's create and what a new lease must
// check before it commits (the listener check and the two holds, in this process): the two together
// are a new lease that checks before its commit and does nothing else of its own.
func BenchmarkNewLeaseAfterIdle(b *testing.B) {
	l := newLeaseSetup(b)
	defer l.close()
	cotenant := l.d.path("app", "stacks", "s", "holders", "t")
	checks := l.checks()
	pairedAfterIdle(b, claimIdle, map[string]op{
		"new-lease": l.newLease(),
		"peer":      l.peerNewLease(b),
		"co-tenant": create(cotenant),
		"synced":    l.syncedFloor(b),
		"checks":    {run: checks.both, undo: checks.release},
	})
}

// newLeaseBench is what both new-lease benchmarks time in: the shared daemon's idle stack n, the
// benchmark's thread in the daemon's network namespace with busySockets open there.
type newLeaseBench struct {
	d     *daemon
	stack string // stack n's directory
	// family is the family a new lease of stack n takes: the first one s does not hold.
	family []int
	close  func()
}

func newLeaseSetup(b *testing.B) *newLeaseBench {
	d := sharedDaemon(b)
	idle := d.path("app", "stacks", "n")
	if _, err := os.Stat(idle); os.IsNotExist(err) {
		if err := os.Mkdir(idle, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	// The daemon serves in daemonNetns: the sockets and the checks timed here must be there too
	// (and the tables read are this thread's, /proc/thread-self/net).
	leave, err := daemonNetns.Enter()
	if err != nil {
		b.Fatal(err)
	}
	closeSockets := openSockets(b, busySockets)
	return &newLeaseBench{d: d, stack: idle, family: []int{20010, 20710}, close: func() { closeSockets(); leave() }}
}

// leaseChecks is what a new lease adds to a co-tenant's claim, done in this process: the listener
// check of its family, and the family's two machine-wide holds (the same portlock calls, in a space
// of this run's own).
type leaseChecks struct {
	family []int
	space  portlock.Space
	holds  []*portlock.Hold
}

func (l *newLeaseBench) checks() *leaseChecks {
	return &leaseChecks{family: l.family, space: holdSpace()}
}

func (c *leaseChecks) listeners() error {
	_, err := listeners.Listening(c.family)
	return err
}

func (c *leaseChecks) take() error {
	for _, port := range c.family {
		h, err := c.space.Take(port, portlock.Identity{PID: os.Getpid(), Cockpit: "app", Stack: "n", Key: "HTTP"})
		if err != nil {
			return err
		}
		c.holds = append(c.holds, h)
	}
	return nil
}

func (c *leaseChecks) both() error {
	if err := c.listeners(); err != nil {
		return err
	}
	return c.take()
}

func (c *leaseChecks) release() error {
	for _, h := range c.holds {
		h.Release()
	}
	c.holds = c.holds[:0]
	return nil
}

// newLease is the new lease through the mount: a claim of holder h on the idle stack, undone by
// a sleep drain.
func (l *newLeaseBench) newLease() op {
	return op{
		run:  func() error { return writeFile(l.stack+"/holders/h", unix.O_CREAT, "") },
		undo: func() error { return sleepDrain(l.stack) },
	}
}

// peerNewLease is the peer's new lease of the same family (config(20000, 10, 20)'s offset 10),
// undone by what its drain leaves.
func (l *newLeaseBench) peerNewLease(b *testing.B) op {
	p := peerLease(b, l.stack)
	ports := map[string]int{"HTTP": l.family[0], "DB": l.family[1]}
	bases := map[string]int{"HTTP": 20000, "DB": 20700}
	return op{
		run:  func() error { return p.newLease("h", 10, ports, 10, 20, bases) },
		undo: p.endLease,
	}
}

// syncedFloor is the synced floor's create (BenchmarkClaimAfterIdle's): one FUSE create and one
// durable store commit, no engine. No new lease through the mount can cost less, so the peer's
// new lease over it bounds the ratio any daemon on this store could reach in the same run.
func (l *newLeaseBench) syncedFloor(b *testing.B) op {
	return create(filepath.Join(floorDirFor(b), "app", "stacks", "s", "synced", "n"))
}

// missingLookups numbers the missing holder names BenchmarkNewLease looks up, so that no name
// repeats in a process (the kernel keeps the answer).
var missingLookups int

// sleepDrain ends the stack's lease through its drain files: reserve a sleep, start its one action,
// publish success.
func sleepDrain(stack string) error {
	for _, step := range [][2]string{{"request", "sleep"}, {"attempt", "start"}, {"outcome", "success"}} {
		if err := writeFile(stack+"/drain/"+step[0], unix.O_TRUNC, step[1]+"\n"); err != nil {
			return err
		}
	}
	return nil
}

// openSockets opens n TCP sockets on loopback (n/2 connections, both ends in this process) and
// returns what closes them. They close with a reset, so no TIME_WAIT entries outlive them.
func openSockets(b *testing.B, n int) func() {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	var conns []*net.TCPConn
	closeAll := func() {
		for _, c := range conns {
			c.SetLinger(0)
			c.Close()
		}
	}
	for range n / 2 {
		client, err := net.Dial("tcp4", l.Addr().String())
		if err != nil {
			closeAll()
			b.Fatalf("opening %d sockets: %v", n, err)
		}
		server, err := l.Accept()
		if err != nil {
			client.Close()
			closeAll()
			b.Fatal(err)
		}
		conns = append(conns, client.(*net.TCPConn), server.(*net.TCPConn))
	}
	return closeAll
}

// readAll reads path to its end into buf, as a table reader does.
func readAll(path string, buf []byte) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	total := 0
	for {
		n, err := f.Read(buf)
		total += n
		if err == io.EOF || err == nil && n == 0 {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// tableRows counts the sockets the kernel's TCP tables list: what a table reader parses.
func tableRows(b *testing.B) int {
	rows := 0
	for _, table := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			b.Fatal(err)
		}
		rows += bytes.Count(data, []byte("\n")) - 1
	}
	return rows
}
