package testtool

import (
	"bufio"
	"os/exec"
	"testing"
)

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
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "bound\n" {
		t.Fatalf("python3 did not bind %v: %q %v", names, line, err)
	}
	return cmd
}
