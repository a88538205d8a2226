package agent

import (
	"net"
	"os"
	"strings"
	"testing"
)

// TestListening finds real listeners, IPv4 and IPv6, in the kernel's socket tables, with this
// process as their owner, and no listener once they close.
func TestListening(t *testing.T) {
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ network, addr, want string }{
		{"tcp4", "127.0.0.1:0", "127.0.0.1"},
		{"tcp6", "[::1]:0", "::1"},
	} {
		ln, err := net.Listen(c.network, c.addr)
		if err != nil {
			t.Logf("%s: %v", c.network, err)
			continue
		}
		port := ln.Addr().(*net.TCPAddr).Port
		got, err := listening(port)
		if err != nil {
			t.Fatal(err)
		}
		want := Listener{Address: c.want, Port: port, PID: os.Getpid(), Command: strings.TrimSpace(string(comm))}
		if len(got) != 1 || got[0] != want {
			t.Errorf("%s: listening(%d) = %+v, want %+v", c.network, port, got, want)
		}
		ln.Close()
		if got, err := listening(port); err != nil || len(got) != 0 {
			t.Errorf("%s: after close, listening(%d) = %+v, %v", c.network, port, got, err)
		}
	}
}

func TestParseLeased(t *testing.T) {
	for line, want := range map[string]LeasedPort{
		"cockpit=app stack=s1 key=HTTP offset=0\n": {Port: 1, Cockpit: "app", Stack: "s1", Key: "HTTP", Line: "cockpit=app stack=s1 key=HTTP offset=0"},
		"daemon=none pid=42 uid=0\n":               {Port: 1, Daemon: "none", PID: "42", Line: "daemon=none pid=42 uid=0"},
	} {
		if got := parseLeased(1, line); got != want {
			t.Errorf("parseLeased(%q) = %+v, want %+v", line, got, want)
		}
	}
}
