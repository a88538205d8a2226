package portlock

import (
	"bufio"
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

// squatter runs python3 holding the name of port in space as a process that is not cockpitfs:
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
	cmd := exec.Command("python3", "-c", script, fmt.Sprintf("%s%d", space, port), mode)
	startBound(t, cmd)
	return cmd
}

// startBound starts cmd and returns once it prints "bound" (its names are bound); it is killed
// when the test ends.
func startBound(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "bound\n" {
		t.Fatalf("%s did not bind: %q %v", cmd.Args[0], line, err)
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
    c.close()`, fmt.Sprintf("%s%d", space, 40300), "40300")
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
