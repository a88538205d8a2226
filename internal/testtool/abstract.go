package testtool

import (
	"bufio"
	"os/exec"
	"testing"
)

// StartReady starts cmd, has it killed when t ends, and returns the first line it prints, which
// it prints once ready.
func StartReady(t testing.TB, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("%s printed no line: %v", cmd.Args[0], err)
	}
	return line
}

// HoldAbstract runs python3 binding, and listening on, each abstract unix socket name (given
// without the leading NUL or @), as another process holding them would — an older cockpitfs daemon
// its legacy port names. It returns once every name is bound; the process is killed when t ends.
func HoldAbstract(t testing.TB, names ...string) *exec.Cmd {
	t.Helper()
	Need(t, "python3")
	cmd := exec.Command("python3", append([]string{"-c", `import socket, sys, time
held = []
for name in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(b"\0" + name.encode())
    s.listen(1)
    held.append(s)
print("bound", flush=True)
time.sleep(600)`}, names...)...)
	if line := StartReady(t, cmd); line != "bound\n" {
		t.Fatalf("python3 did not bind %v: %q", names, line)
	}
	return cmd
}
