package netns

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A listener made inside a namespace is unreachable from outside it, a process started inside it
// sees that listener, and the caller's own threads stay where they were.
func TestNamespaceIsItsOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPING: a network namespace needs root")
	}
	ns, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var l net.Listener
	if err := ns.Do(func() (err error) {
		l, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	entry := fmt.Sprintf("0100007F:%04X", l.Addr().(*net.TCPAddr).Port)

	var out strings.Builder
	cmd := exec.Command("cat", "/proc/self/net/tcp")
	cmd.Stdout = &out
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), entry) {
		t.Fatalf("a process started inside does not see %s:\n%s", entry, out.String())
	}
	for range 20 { // every thread of this process, whichever runs the read
		mine, err := os.ReadFile("/proc/thread-self/net/tcp")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(mine), entry) {
			t.Fatalf("a thread of the caller sees %s: it was left inside", entry)
		}
	}
	if c, err := net.Dial("tcp", l.Addr().String()); err == nil {
		c.Close()
		t.Fatalf("dialled %s from outside the namespace", l.Addr())
	}
}

// A goroutine that entered sees the namespace's sockets from its thread until it leaves.
func TestEnterAndLeave(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPING: a network namespace needs root")
	}
	ns, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	inside := func() string {
		link, err := os.Readlink("/proc/thread-self/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		return link
	}
	home := inside()
	leave, err := ns.Enter()
	if err != nil {
		t.Fatal(err)
	}
	there := inside()
	leave()
	if there == home {
		t.Fatalf("Enter left the thread in %s", home)
	}
	if got := inside(); got != home {
		t.Fatalf("after leave the thread is in %s, want %s", got, home)
	}
}
