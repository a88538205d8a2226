package portlock

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// testSpace is this test process's own: other runs on the machine hold other names.
func testSpace(t *testing.T) Space {
	return Space(fmt.Sprintf("cockpitfs-test/%d/%s/port/", os.Getpid(), t.Name()))
}

// squatter runs python3 holding the (balanced) name of port in space as a process that is not cockpitfs:
// listening (but never answering) or only bound. It returns the process once the name is bound.
func squatter(t *testing.T, space Space, port int, listen bool) *exec.Cmd {
	t.Helper()
	testtool.Need(t, "python3")
	script := `import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(b"\0" + sys.argv[1].encode())
if sys.argv[2] == "listen":
    s.listen(1)
print("bound", flush=True)
time.sleep(600)`
	mode := "bind"
	if listen {
		mode = "listen"
	}
	cmd := exec.Command("python3", "-c", script, strings.TrimPrefix(space.name(port), "@"), mode)
	startBound(t, cmd)
	return cmd
}

// startBound starts cmd and returns once it prints "bound" (its names are bound); it is killed
// when the test ends.
func startBound(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if line := testtool.StartReady(t, cmd); line != "bound\n" {
		t.Fatalf("%s did not bind: %q", cmd.Args[0], line)
	}
}

func TestTakeIsExclusiveUntilRelease(t *testing.T) {
	space := testSpace(t)
	id := Identity{PID: os.Getpid(), UID: uint32(os.Getuid()), Data: "/d", Cockpit: "app", Stack: "s", Key: "HTTP"}
	h, err := space.Take(40100, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := space.Take(40100, id); !errors.Is(err, ErrHeld) {
		t.Fatalf("second Take = %v, want ErrHeld", err)
	}
	holder, ok, err := space.Ask(40100)
	if err != nil || !ok {
		t.Fatalf("Ask = %v %v", ok, err)
	}
	if !holder.Known || holder.PID != os.Getpid() || holder.Identity == nil || holder.Identity.Stack != "s" || holder.Identity.Port != 40100 {
		t.Fatalf("Ask = %+v %+v", holder, holder.Identity)
	}
	if !strings.Contains(holder.String(), "the cockpitfs daemon process") || !strings.Contains(holder.String(), "lease app/s") {
		t.Fatalf("holder reads %q", holder)
	}
	if held, err := space.Held(); err != nil || !slices.Equal(held, []int{40100}) {
		t.Fatalf("Held = %v %v", held, err)
	}
	h.Release()
	if _, ok, err := space.Ask(40100); ok || err != nil {
		t.Fatalf("after Release, Ask = %v %v", ok, err)
	}
	if held, err := space.Held(); err != nil || len(held) != 0 {
		t.Fatalf("after Release, Held = %v %v", held, err)
	}
	h, err = space.Take(40100, id)
	if err != nil {
		t.Fatalf("Take after Release: %v", err)
	}
	h.Release()
}

// A process that holds a name and is not cockpitfs is named by the kernel (listening) or at least
// seen (bound only); it dies, even by SIGKILL, and the name is free at once.
func TestSquatterIsNamedAndDiesWithItsProcess(t *testing.T) {
	space := testSpace(t)
	listening := squatter(t, space, 40200, true)
	if _, err := space.Take(40200, Identity{}); !errors.Is(err, ErrHeld) {
		t.Fatalf("Take of a squatted port = %v", err)
	}
	start := time.Now()
	holder, ok, err := space.Ask(40200)
	if err != nil || !ok || !holder.Known || holder.PID != listening.Process.Pid || holder.Identity != nil {
		t.Fatalf("Ask = %+v %v %v, want pid %d and no identity", holder, ok, err, listening.Process.Pid)
	}
	if waited := time.Since(start); waited > 5*answerTimeout {
		t.Fatalf("Ask waited %s for a holder that never answers", waited)
	}
	if !strings.Contains(holder.String(), "not a cockpitfs daemon") {
		t.Fatalf("holder reads %q", holder)
	}

	bound := squatter(t, space, 40201, false)
	// Bound, not listening: found in the kernel's tables (as root, any process's).
	if holder, ok, err := space.Ask(40201); err != nil || !ok || os.Geteuid() == 0 && (!holder.Known || holder.PID != bound.Process.Pid) || holder.Identity != nil {
		t.Fatalf("Ask of a bound, not listening name = %+v %v %v", holder, ok, err)
	}
	// A listener that never accepts fills its backlog, and is then found the same way.
	for range 3 {
		if holder, ok, err := space.Ask(40200); err != nil || !ok || holder.PID != listening.Process.Pid {
			t.Fatalf("Ask of a full backlog = %+v %v %v", holder, ok, err)
		}
	}
	for _, cmd := range []*exec.Cmd{listening, bound} {
		cmd.Process.Kill()
		cmd.Wait()
	}
	for _, port := range []int{40200, 40201} {
		h, err := space.Take(port, Identity{})
		if err != nil {
			t.Fatalf("Take after the squatter's SIGKILL: %v", err)
		}
		h.Release()
	}
}

// A process of another program that answers as a daemon would, naming its own pid, is not
// believed: the holder is its kernel pid and uid, not a cockpitfs daemon, and none of its words.
func TestForgedAnswerIsNotBelieved(t *testing.T) {
	testtool.Need(t, "python3")
	space := testSpace(t)
	cmd := exec.Command("python3", "-c", `import json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(b"\0" + sys.argv[1].encode())
s.listen(16)
print("bound", flush=True)
while True:
    c, _ = s.accept()
    try:
        c.sendall(json.dumps({"daemon": "cockpitfs", "pid": os.getpid(), "uid": 0, "data": "/forged\x1b[31m",
            "cockpit": "app", "stack": "x", "key": "HTTP", "port": int(sys.argv[2])}).encode() + b"\n")
    except OSError:
        pass  # an asker that did not wait for the answer
    c.close()`, strings.TrimPrefix(space.name(40300), "@"), "40300")
	startBound(t, cmd)
	holder, ok, err := space.Ask(40300)
	if err != nil || !ok || !holder.Known || holder.PID != cmd.Process.Pid || holder.UID != uint32(os.Getuid()) || holder.Identity != nil {
		t.Fatalf("Ask = %+v %+v %v %v, want pid %d, uid %d, no identity", holder, holder.Identity, ok, err, cmd.Process.Pid, os.Getuid())
	}
	if s := holder.String(); s != fmt.Sprintf("process %d uid %d, not a cockpitfs daemon", cmd.Process.Pid, os.Getuid()) {
		t.Fatalf("holder reads %q", s)
	}
}

// A hold of this very program is believed only for what a line shows as it is: an answer with a
// control byte in its data directory names the holder by the kernel alone.
func TestAnswerWithAControlByteIsNotBelieved(t *testing.T) {
	space := testSpace(t)
	h, err := space.Take(40400, Identity{PID: os.Getpid(), UID: uint32(os.Getuid()), Data: "/d\x1b[2J", Cockpit: "app", Stack: "s", Key: "HTTP"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	holder, ok, err := space.Ask(40400)
	if err != nil || !ok || holder.PID != os.Getpid() || holder.Identity != nil {
		t.Fatalf("Ask = %+v %+v %v %v", holder, holder.Identity, ok, err)
	}
}

// A process of this program that holds names and never answers costs one wait: Ask then
// remembers it as silent, and reads only what is already there from it.
func TestSilentHolderIsWaitedForOnce(t *testing.T) {
	space := testSpace(t)
	t.Cleanup(func() { silent.Delete(os.Getpid()) }) // the other tests' holds are this process's
	for _, port := range []int{40500, 40501} {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: space.name(port)}); err != nil {
			t.Fatal(err)
		}
		if err := unix.Listen(fd, 16); err != nil {
			t.Fatal(err)
		}
	}
	for i, port := range []int{40500, 40501} {
		holder, ok, err := space.Ask(port)
		if err != nil || !ok || holder.PID != os.Getpid() || holder.Identity != nil {
			t.Fatalf("Ask(%d) = %+v %v %v", port, holder, ok, err)
		}
		until, remembered := silent.Load(os.Getpid())
		if !remembered || !until.(time.Time).After(time.Now()) {
			t.Fatalf("after ask %d, this process is not remembered as silent", i)
		}
	}
}

// chain is the kernel's chain of an abstract stream socket's address (net/unix/af_unix.c,
// unix_abstract_hash: csum_partial of the family and the name, folded and inverted, its two bytes
// xored, xored with the socket type), written from the kernel's definition, not from name's.
func chain(name string) int {
	addr := append([]byte{byte(unix.AF_UNIX), byte(unix.AF_UNIX >> 8), 0}, name[1:]...)
	var sum uint64
	for i := 0; i < len(addr); i += 2 {
		word := uint64(addr[i])
		if i+1 < len(addr) {
			word |= uint64(addr[i+1]) << 8
		}
		sum += word
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	folded := ^uint16(sum)
	return int((folded^folded>>8)&0xff) ^ unix.SOCK_STREAM
}

// The names of all 65,536 ports fill the kernel's 256 chains evenly, and 256 consecutive ports
// use every chain once, in the daemons' space and in a test's; the legacy names of the scale
// benchmark's 20,000 ports crowd into a few dozen (why the names changed). Every name is printable
// and tells its port.
func TestNamesSpreadOverEveryChain(t *testing.T) {
	for _, space := range []Space{Machine, testSpace(t)} {
		count := map[int]int{}
		seen := map[string]bool{}
		for port := range 65536 {
			name := space.name(port)
			count[chain(name)]++
			// Any 256 consecutive ports use every chain once: the first 256 do, and a port uses
			// the chain of the port 256 below it.
			if port < 256 && count[chain(name)] > 1 || port >= 256 && chain(name) != chain(space.name(port-256)) {
				t.Fatalf("%q: port %d is in chain %d", space, port, chain(name))
			}
			if seen[name] || len(name) > 108 || strings.ContainsFunc(name[1:], func(r rune) bool { return r <= ' ' || r > '~' }) || !strings.HasPrefix(name, "@"+string(space)+fmt.Sprint(port)+"/") {
				t.Fatalf("name of port %d: %q", port, name)
			}
			seen[name] = true
		}
		if len(count) != 256 {
			t.Fatalf("%q: the names fill %d chains", space, len(count))
		}
		for c, n := range count {
			if n != 256 {
				t.Fatalf("%q: chain %d holds %d names", space, c, n)
			}
		}
	}
	legacy := map[int]bool{}
	for _, first := range []int{21000, 50000} {
		for port := first; port < first+10000; port++ {
			legacy[chain(Machine.legacyName(port))] = true
		}
	}
	if len(legacy) > 40 {
		t.Fatalf("the legacy names fill %d chains", len(legacy))
	}
}

// holdNames holds each of the abstract names (listening), as an older daemon holds its legacy
// names; it returns the process once they are bound.
func holdNames(t *testing.T, names ...string) *exec.Cmd {
	t.Helper()
	for i, name := range names {
		names[i] = strings.TrimPrefix(name, "@")
	}
	return testtool.HoldAbstract(t, names...)
}

// probeLegacy does what an older daemon does with a port's legacy name, in python3: bind it (as its
// Take) and, when that fails, connect and read the holder's pid (SO_PEERCRED) and answer (its Ask).
// It returns "free", or "held <pid> <port of the answer>".
func probeLegacy(t *testing.T, space Space, port int) string {
	t.Helper()
	testtool.Need(t, "python3")
	out, err := exec.Command("python3", "-c", `import json, socket, struct, sys
name = b"\0" + sys.argv[1].encode()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.bind(name)
    print("free")
    sys.exit(0)
except OSError:
    pass
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c.connect(name)
pid, uid, gid = struct.unpack("3i", c.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
line = c.makefile().readline()
print("held", pid, json.loads(line)["port"])`, strings.TrimPrefix(space.legacyName(port), "@")).Output()
	if err != nil {
		t.Fatalf("probing the legacy name of %d: %v", port, err)
	}
	return strings.TrimSpace(string(out))
}

// An older daemon's hold (the legacy name only) keeps a port from this process as it keeps it from
// another older daemon, and Ask and Held name it; from then on this process holds the legacy names
// too, so an older daemon's Take and Ask meet its holds as they meet each other's.
func TestLegacyHolderBlocksTakeAndStartsCompat(t *testing.T) {
	space := testSpace(t)
	h, err := space.Take(40600, Identity{PID: os.Getpid(), UID: uint32(os.Getuid()), Data: "/d", Cockpit: "app", Stack: "s", Key: "HTTP"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if got := probeLegacy(t, space, 40600); got != "free" || space.Compat() {
		t.Fatalf("before any legacy holder: the legacy name is %q, compat %v", got, space.Compat())
	}
	older := holdNames(t, space.legacyName(40601))
	if _, err := space.Take(40601, Identity{}); !errors.Is(err, ErrHeld) {
		t.Fatalf("Take of a port an older daemon holds = %v", err)
	}
	holder, ok, err := space.Ask(40601)
	if err != nil || !ok || !holder.Known || holder.PID != older.Process.Pid {
		t.Fatalf("Ask = %+v %v %v, want pid %d", holder, ok, err, older.Process.Pid)
	}
	if held, err := space.Held(); err != nil || !slices.Equal(held, []int{40600, 40601}) {
		t.Fatalf("Held = %v %v", held, err)
	}
	if !space.Compat() {
		t.Fatal("compat is off after meeting an older daemon's hold")
	}
	if got, want := probeLegacy(t, space, 40600), fmt.Sprintf("held %d 40600", os.Getpid()); got != want {
		t.Fatalf("a hold taken before compat: the legacy name is %q, want %q", got, want)
	}
	h2, err := space.Take(40602, Identity{PID: os.Getpid(), UID: uint32(os.Getuid()), Data: "/d"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := probeLegacy(t, space, 40602), fmt.Sprintf("held %d 40602", os.Getpid()); got != want {
		t.Fatalf("a hold taken in compat: the legacy name is %q, want %q", got, want)
	}
	h2.Release()
	if got := probeLegacy(t, space, 40602); got != "free" {
		t.Fatalf("after Release the legacy name is %q", got)
	}
	if holder, ok, err := space.Ask(40602); ok || err != nil {
		t.Fatalf("after Release, Ask = %+v %v %v", holder, ok, err)
	}
}

// An older daemon that started after this process took a port, and found its legacy name free,
// holds it too: when compat begins, the hold is let go and handed back by Shared, once, and Ask
// names the older daemon.
func TestCompatLetsGoAPortAnOlderDaemonHoldsToo(t *testing.T) {
	space := testSpace(t)
	h, err := space.Take(40700, Identity{})
	if err != nil {
		t.Fatal(err)
	}
	older := holdNames(t, space.legacyName(40700), space.legacyName(40701))
	if _, err := space.Take(40701, Identity{}); !errors.Is(err, ErrHeld) {
		t.Fatalf("Take of a port an older daemon holds = %v", err)
	}
	if other := space.Shared(func(*Hold) bool { return false }); len(other) != 0 {
		t.Fatalf("Shared of no hold = %v", other)
	}
	if shared := space.Shared(func(s *Hold) bool { return s == h }); len(shared) != 1 || shared[0].Port() != 40700 {
		t.Fatalf("Shared = %v", shared)
	}
	if shared := space.Shared(func(*Hold) bool { return true }); len(shared) != 0 {
		t.Fatalf("Shared again = %v", shared)
	}
	if holder, ok, err := space.Ask(40700); err != nil || !ok || holder.PID != older.Process.Pid {
		t.Fatalf("Ask = %+v %v %v, want pid %d", holder, ok, err, older.Process.Pid)
	}
	h.Release() // let go already: nothing
	if bound, err := space.Bound(); err != nil || len(bound) != 2 {
		t.Fatalf("Bound = %v %v", bound, err)
	}
}

// A daemon about to take its holds begins compat when a process holds a legacy name alone (an
// older daemon), not when it holds both names of a port (a daemon in compat); what it saw refuses
// the older daemon's ports without a probe.
func TestCheckLegacyTellsOlderDaemonsFromCompatOnes(t *testing.T) {
	space := testSpace(t)
	holdNames(t, space.name(40800), space.legacyName(40800))
	if _, err := space.CheckLegacy(); err != nil || space.Compat() {
		t.Fatalf("CheckLegacy beside a daemon in compat: %v, compat %v", err, space.Compat())
	}
	h, err := space.Take(40802, Identity{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if got := probeLegacy(t, space, 40802); got != "free" {
		t.Fatalf("without compat the legacy name is %q", got)
	}
	older := holdNames(t, space.legacyName(40801))
	seen, err := space.CheckLegacy()
	if err != nil || !space.Compat() {
		t.Fatalf("CheckLegacy beside an older daemon: %v, compat %v", err, space.Compat())
	}
	if got := probeLegacy(t, space, 40802); !strings.HasPrefix(got, "held ") {
		t.Fatalf("in compat the legacy name is %q", got)
	}
	if _, err := seen.Take(40801, Identity{}); !errors.Is(err, ErrHeld) {
		t.Fatalf("Take of the older daemon's port = %v", err)
	}
	if holder, ok, err := space.Ask(40801); err != nil || !ok || holder.PID != older.Process.Pid {
		t.Fatalf("Ask = %+v %v %v, want pid %d", holder, ok, err, older.Process.Pid)
	}
	h3, err := seen.Take(40803, Identity{})
	if err != nil {
		t.Fatal(err)
	}
	defer h3.Release()
	if got, want := probeLegacy(t, space, 40803), fmt.Sprintf("held %d 40803", os.Getpid()); got != want {
		t.Fatalf("a hold taken in compat: the legacy name is %q, want %q", got, want)
	}
}

// BenchmarkTake: a hold taken and let go beside 9,000 other holds in the kernel's table (a machine
// of many daemons' leases): by Take (the balanced name and the legacy probe), by what CheckLegacy
// saw (the balanced name alone, as a restart takes its holds), and as daemons before the balanced
// names took one (the legacy name's socket, bind and listen and the answering loop's registration,
// beside 9,000 legacy names). Ports
// 15000–15999 beside 50000–58999.
func BenchmarkTake(b *testing.B) {
	legacyTake := func(space Space, port int) (func(), error) {
		fd, err := bindName(space.legacyName(port), true)
		if err != nil {
			return nil, err
		}
		if err := answers.add(fd, &answer{}); err != nil {
			return nil, err
		}
		return func() { answers.remove(fd) }, nil
	}
	for _, how := range []string{"probe", "seen", "legacy"} {
		b.Run(how, func(b *testing.B) {
			space := Space(fmt.Sprintf("cockpitfs-bench/%d/%s/port/", os.Getpid(), how))
			take := func(port int) (func(), error) {
				h, err := space.Take(port, Identity{})
				if err != nil {
					return nil, err
				}
				return h.Release, nil
			}
			switch how {
			case "seen":
				seen, err := space.CheckLegacy()
				if err != nil {
					b.Fatal(err)
				}
				take = func(port int) (func(), error) {
					h, err := seen.Take(port, Identity{})
					if err != nil {
						return nil, err
					}
					return h.Release, nil
				}
			case "legacy":
				take = func(port int) (func(), error) { return legacyTake(space, port) }
			}
			for port := 50000; port < 59000; port++ {
				release, err := take(port)
				if err != nil {
					b.Fatal(err)
				}
				defer release()
			}
			b.ResetTimer()
			for i := range b.N {
				release, err := take(15000 + i%1000)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				release()
				b.StartTimer()
			}
		})
	}
}

// fields splits a table line as strings.Fields does when it has 8 fields, and refuses any other
// count, for the kernel's own lines and for names with spaces or tabs in them.
func TestFieldsSplitsAsStringsFields(t *testing.T) {
	table, err := os.ReadFile("/proc/self/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(table), "\n")
	lines = append(lines,
		"0000000000000000: 00000002 00000000 00010000 0001 01 12345 @cockpitfs/port/41000/ABCDEFGHIJ",
		"0000000000000000: 00000002 00000000 00010000 0001 01 12345 @cockpitfs/port/41000 and more",
		"0000000000000000: 00000002 00000000 00010000 0001 01 12345",
		"  0000000000000000:   00000002 00000000 00010000 0001 01 12345 @x  ",
		"", " ")
	for _, line := range lines {
		var f [8][]byte
		ok := fields([]byte(line), &f)
		want := strings.Fields(line)
		if strings.ContainsAny(line, "\t\v\f\r") {
			continue // the kernel separates with spaces; such a name fails later checks either way
		}
		if ok != (len(want) == 8) {
			t.Fatalf("fields(%q) = %v, strings.Fields has %d", line, ok, len(want))
		}
		for i := 0; ok && i < 8; i++ {
			if string(f[i]) != want[i] {
				t.Fatalf("fields(%q)[%d] = %q, want %q", line, i, f[i], want[i])
			}
		}
	}
}
