package listeners

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func listen(t *testing.T, network, address string) int {
	t.Helper()
	l, err := net.Listen(network, address)
	if err != nil {
		t.Skipf("cannot listen on %s %s here: %v", network, address, err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

// closedPort returns a port that was just listened on and closed, so nothing listens on it.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

func mustListening(t *testing.T, ports ...int) []int {
	t.Helper()
	got, err := Listening(ports)
	if err != nil {
		t.Fatalf("Listening(%v): %v", ports, err)
	}
	return got
}

func TestListeningSeesRealListeners(t *testing.T) {
	for _, tc := range []struct{ network, address string }{
		{"tcp4", "127.0.0.1:0"},
		{"tcp4", "0.0.0.0:0"},
		{"tcp6", "[::1]:0"},
		{"tcp", "[::]:0"},
	} {
		t.Run(tc.network+" "+tc.address, func(t *testing.T) {
			port := listen(t, tc.network, tc.address)
			free := closedPort(t)
			if got := mustListening(t, free, port, free); !slices.Equal(got, []int{port}) {
				t.Fatalf("Listening = %v, want [%d]", got, port)
			}
		})
	}
}

func TestListeningKeepsOrderWithoutDuplicates(t *testing.T) {
	a := listen(t, "tcp4", "127.0.0.1:0")
	b := listen(t, "tcp4", "127.0.0.1:0")
	if got := mustListening(t, b, a, b, closedPort(t), a); !slices.Equal(got, []int{b, a}) {
		t.Fatalf("Listening = %v, want [%d %d]", got, b, a)
	}
}

func TestListeningClosedPortIsFree(t *testing.T) {
	if got := mustListening(t, closedPort(t)); len(got) != 0 {
		t.Fatalf("Listening = %v for a closed port", got)
	}
}

func TestListeningIgnoresEstablishedLocalPort(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err := net.Dial("tcp4", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()

	listenerPort := l.Addr().(*net.TCPAddr).Port
	clientPort := client.LocalAddr().(*net.TCPAddr).Port
	if got := mustListening(t, clientPort, listenerPort); !slices.Equal(got, []int{listenerPort}) {
		t.Fatalf("Listening = %v, want only the listener %d, not the client's port %d", got, listenerPort, clientPort)
	}
}

func TestListeningIgnoresUDP(t *testing.T) {
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	port := conn.LocalAddr().(*net.UDPAddr).Port
	if got := mustListening(t, port); len(got) != 0 {
		t.Fatalf("Listening = %v for a UDP-only port", got)
	}
}

func TestListeningRejectsOutOfRangePorts(t *testing.T) {
	for _, port := range []int{0, -1, 65536} {
		if _, err := Listening([]int{port}); !errors.Is(err, ErrUndecided) {
			t.Fatalf("Listening([%d]) error = %v, want ErrUndecided", port, err)
		}
	}
}

func TestListeningNoPorts(t *testing.T) {
	if got := mustListening(t); len(got) != 0 {
		t.Fatalf("Listening() = %v", got)
	}
}

func writeTable(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestListeningFromToleratesMissingTCP6(t *testing.T) {
	tcp := writeTable(t, "tcp", tcpSnapshot)
	missing := filepath.Join(t.TempDir(), "tcp6")
	got, err := listeningFrom(tcp, missing, []int{8081, 8080})
	if err != nil || !slices.Equal(got, []int{8080}) {
		t.Fatalf("listeningFrom = %v, %v; want [8080]", got, err)
	}
}

func TestListeningFromReadsBothTables(t *testing.T) {
	tcp := writeTable(t, "tcp", tcpSnapshot)
	tcp6 := writeTable(t, "tcp6", tcp6Snapshot)
	got, err := listeningFrom(tcp, tcp6, []int{443, 8083, 22})
	if err != nil || !slices.Equal(got, []int{443, 22}) {
		t.Fatalf("listeningFrom = %v, %v; want [443 22]", got, err)
	}
}

func TestListeningFromMalformedTableIsUndecided(t *testing.T) {
	good := writeTable(t, "good", tcpSnapshot)
	bad := writeTable(t, "bad", "garbage\n")
	for _, paths := range [][2]string{{bad, good}, {good, bad}} {
		if got, err := listeningFrom(paths[0], paths[1], []int{8080}); !errors.Is(err, ErrUndecided) {
			t.Fatalf("listeningFrom(%s, %s) = %v, %v; want ErrUndecided", paths[0], paths[1], got, err)
		}
	}
}

// Without a readable tcp table (no /proc) the answer comes from the loopback probe, so a real
// listener that no file mentions is still found.
func TestListeningFromFallsBackToProbe(t *testing.T) {
	port := listen(t, "tcp4", "127.0.0.1:0")
	missing := filepath.Join(t.TempDir(), "tcp")
	got, err := listeningFrom(missing, missing+"6", []int{closedPort(t), port})
	if err != nil || !slices.Equal(got, []int{port}) {
		t.Fatalf("listeningFrom = %v, %v; want [%d] from the probe", got, err, port)
	}
}

func TestProbeLoopback(t *testing.T) {
	v4 := listen(t, "tcp4", "127.0.0.1:0")
	free := closedPort(t)
	got, err := probeLoopback([]int{free, v4})
	if err != nil || !slices.Equal(got, []int{v4}) {
		t.Fatalf("probeLoopback = %v, %v; want [%d]", got, err, v4)
	}
}

func TestProbeLoopbackIPv6Only(t *testing.T) {
	v6 := listen(t, "tcp6", "[::1]:0")
	got, err := probeLoopback([]int{v6})
	if err != nil || !slices.Equal(got, []int{v6}) {
		t.Fatalf("probeLoopback = %v, %v; want [%d] through [::1]", got, err, v6)
	}
}

func BenchmarkListening(b *testing.B) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ports := []int{l.Addr().(*net.TCPAddr).Port, 1}
	for b.Loop() {
		if _, err := Listening(ports); err != nil {
			b.Fatal(err)
		}
	}
}

// Sockets lists a listening socket with its address, port, owner and inode, on both families,
// and never a client's socket connected to the port.
func TestSocketsListListenersWithTheirInodes(t *testing.T) {
	l4, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l4.Close()
	port := l4.Addr().(*net.TCPAddr).Port
	client, err := net.Dial("tcp4", l4.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	got, err := Sockets(func(p int) bool { return p == port })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Address != "127.0.0.1" || got[0].Port != port || got[0].UID != uint32(os.Getuid()) || got[0].Inode == "" {
		t.Fatalf("Sockets = %+v, want one listener on 127.0.0.1:%d", got, port)
	}
	l6, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback")
	}
	defer l6.Close()
	port6 := l6.Addr().(*net.TCPAddr).Port
	if got, err := Sockets(func(p int) bool { return p == port6 }); err != nil || len(got) != 1 || got[0].Address != "::1" {
		t.Fatalf("Sockets on ::1 = %+v, %v", got, err)
	}
}
