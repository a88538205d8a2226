package executor

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// started runs a python program printing a line when ready; it is killed when the test ends.
func started(t *testing.T, program string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("python3", append([]string{"-c", program}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	testtool.StartReady(t, cmd)
	return cmd
}

// Find names the process listening on a port and not the one connected to it; Stop leaves it to a
// requester who may not signal it, never signals a process whose start is not the one found, and
// ends it for one who may.
func TestFindAndStop(t *testing.T) {
	testtool.Need(t, "python3")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	server := started(t, `import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); print("listening", flush=True)
c, _ = s.accept()
import time; time.sleep(3600)`, strconv.Itoa(port))
	client := started(t, `import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); print("connected", flush=True)
time.sleep(3600)`, strconv.Itoa(port))

	targets, err := Find([]int{port}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(targets) != 1 || targets[0].PID != server.Process.Pid || strings.Join(targets[0].Why, ",") != "listens on port "+strconv.Itoa(port) {
		t.Fatalf("Find: %+v, want only the server %d", targets, server.Process.Pid)
	}
	if got := Stop(targets, []uint32{65534}, time.Second); got[0].Result != "not signalled" || got[0].Errno != "EPERM" {
		t.Fatalf("Stop as uid 65534: %+v", got)
	}
	// Acting for several uids, a stop signals only what each may: the server's own uid is not enough.
	if got := Stop(targets, []uint32{uint32(os.Getuid()), 65534}, time.Second); os.Getuid() != 65534 && (got[0].Result != "not signalled" || got[0].DeniedTo != 65534) {
		t.Fatalf("Stop as uids %d and 65534: %+v", os.Getuid(), got)
	}
	reused := targets[0]
	reused.start = "1" // as if the pid now were another process's
	if got := Stop([]Target{reused}, []uint32{0}, time.Second); got[0].Result != "gone" {
		t.Fatalf("Stop of a pid whose start changed: %+v", got)
	}
	if got := Stop(targets, []uint32{0}, time.Minute); got[0].Result != "terminated" {
		t.Fatalf("Stop as root: %+v", got)
	}
	server.Wait()
	if ws := server.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("the server ended by %v", server.ProcessState)
	}
	if err := client.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the client: %v", err)
	}
}
