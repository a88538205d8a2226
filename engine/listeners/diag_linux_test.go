package listeners

import (
	"errors"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// askKernel is sockDiagListening on ports, skipping the test where this kernel or sandbox offers
// no sock_diag (Listening falls back to the tables there, tested apart).
func askKernel(t *testing.T, ports ...int) map[int]bool {
	t.Helper()
	want := map[int]bool{}
	for _, p := range ports {
		want[p] = true
	}
	found, err := sockDiagListening(want)
	if errors.Is(err, errDiagUnavailable) {
		t.Skipf("sock_diag unavailable here: %v", err)
	}
	if err != nil {
		t.Fatalf("sockDiagListening(%v): %v", ports, err)
	}
	return found
}

func setOf(ports ...int) map[int]bool {
	m := map[int]bool{}
	for _, p := range ports {
		m[p] = true
	}
	return m
}

func TestSockDiagSeesBothFamilies(t *testing.T) {
	for _, tc := range []struct{ network, address string }{
		{"tcp4", "127.0.0.1:0"},
		{"tcp4", "0.0.0.0:0"},
		{"tcp6", "[::1]:0"},
		{"tcp", "[::]:0"}, // dual stack: one IPv6 socket that IPv4 clients reach too
	} {
		t.Run(tc.network+" "+tc.address, func(t *testing.T) {
			port := listen(t, tc.network, tc.address)
			free := closedPort(t)
			if got := askKernel(t, port, free); !maps.Equal(got, setOf(port)) {
				t.Fatalf("sock_diag found %v, want {%d}", got, port)
			}
		})
	}
}

// An IPv6 socket bound to a v4-mapped address listens for IPv4 clients; it is an AF_INET6 socket,
// so only the AF_INET6 dump sees it.
func TestSockDiagSeesV4MappedListener(t *testing.T) {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no IPv6 sockets here: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
		t.Fatal(err)
	}
	mapped := [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 1}
	if err := unix.Bind(fd, &unix.SockaddrInet6{Addr: mapped}); err != nil {
		t.Skipf("cannot bind ::ffff:127.0.0.1 here: %v", err)
	}
	if err := unix.Listen(fd, 8); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*unix.SockaddrInet6).Port
	// It is what an IPv4 client reaches on that port.
	conn, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("IPv4 connect to the v4-mapped listener: %v", err)
	}
	conn.Close()
	if got := askKernel(t, port); !maps.Equal(got, setOf(port)) {
		t.Fatalf("sock_diag found %v, want {%d}", got, port)
	}
	if got := mustListening(t, port); !slices.Equal(got, []int{port}) {
		t.Fatalf("Listening = %v, want [%d]", got, port)
	}
}

// The kernel applies the port filter: a listener that was not asked about is not reported, and
// the ports of established connections (both ends) never are.
func TestSockDiagReportsOnlyAskedListeners(t *testing.T) {
	asked := listen(t, "tcp4", "127.0.0.1:0")
	notAsked := listen(t, "tcp6", "[::1]:0")
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
	clientPort := client.LocalAddr().(*net.TCPAddr).Port
	got := askKernel(t, asked, clientPort)
	if !maps.Equal(got, setOf(asked)) {
		t.Fatalf("sock_diag found %v asking about %d (listening) and %d (a client's port); %d listens unasked", got, asked, clientPort, notAsked)
	}
}

// Hundreds of listeners among thousands of asked ports: more than one request's filter holds, and
// far more than a one-byte jump can cross. The answer is exactly the listeners, as the socket
// tables have them.
func TestSockDiagManySockets(t *testing.T) {
	var listening []int
	for i := range 300 {
		network, address := "tcp4", "127.0.0.1:0"
		if i%2 == 1 {
			network, address = "tcp6", "[::1]:0"
		}
		listening = append(listening, listen(t, network, address))
	}
	asked := slices.Clone(listening)
	isListening := setOf(listening...)
	for port := 1024; len(asked) < 2500 && port <= 65535; port++ {
		if !isListening[port] {
			asked = append(asked, port)
		}
	}
	got := askKernel(t, asked...)
	// Other processes on this machine may listen on some asked ports: the ports of ours must all
	// be there, and everything found must be what the kernel's tables show listening.
	for _, p := range listening {
		if !got[p] {
			t.Fatalf("sock_diag missed listener %d (found %d of %d asked)", p, len(got), len(asked))
		}
	}
	tables, err := listeningFrom(tcpTablePath, tcp6TablePath, asked)
	if err != nil {
		t.Fatal(err)
	}
	for p := range got {
		if !isListening[p] && !slices.Contains(tables, p) {
			t.Fatalf("sock_diag reported port %d, which no table shows listening", p)
		}
	}
}

// One socket serves every check, and each check still sees the listeners of its moment: a port
// that starts listening between two checks, then stops, reads so at each.
func TestSockDiagKeepsOneSocketAndSeesEachMoment(t *testing.T) {
	free := closedPort(t)
	askKernel(t, free)
	diag.mu.Lock()
	fd := diag.fd
	diag.mu.Unlock()
	l, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(free))
	if err != nil {
		t.Fatal(err)
	}
	if got := askKernel(t, free); !maps.Equal(got, setOf(free)) {
		t.Fatalf("with a listener on %d: found %v", free, got)
	}
	l.Close()
	if got := askKernel(t, free); len(got) != 0 {
		t.Fatalf("after the listener closed: found %v", got)
	}
	diag.mu.Lock()
	defer diag.mu.Unlock()
	if diag.fd != fd || fd < 0 {
		t.Fatalf("the checks used sockets %d and %d, want one kept open", fd, diag.fd)
	}
}

// Concurrent checks share the socket and each reads its own answer, never another's.
func TestSockDiagConcurrentChecksReadTheirOwnAnswers(t *testing.T) {
	const checkers = 8
	ports := make([]int, checkers)
	for i := range ports {
		ports[i] = listen(t, "tcp4", "127.0.0.1:0")
	}
	free := closedPort(t)
	askKernel(t, free)
	errs := make(chan error, checkers)
	for i := range checkers {
		go func() {
			for range 50 {
				found, err := sockDiagListening(setOf(ports[i], free))
				if err == nil && !maps.Equal(found, setOf(ports[i])) {
					err = errors.New("checker " + strconv.Itoa(i) + " read another answer")
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range checkers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// A check asks in one request for both families (one walk of the kernel's listening table); where
// the kernel refuses that request it asks once per family. Both give the same answer, and this
// kernel takes the one-walk request, so the tests above exercise it.
func TestSockDiagOneWalkAndPerFamilyAgree(t *testing.T) {
	ports := []int{
		listen(t, "tcp4", "127.0.0.1:0"),
		listen(t, "tcp4", "0.0.0.0:0"),
		listen(t, "tcp6", "[::1]:0"),
		listen(t, "tcp", "[::]:0"),
		closedPort(t),
	}
	want := setOf(ports[:4]...)
	askKernel(t, ports...)
	diag.mu.Lock()
	perFamily := diag.perFamily
	diag.mu.Unlock()
	if perFamily {
		t.Fatal("this kernel refused the one-walk request (TCPDIAG_GETSOCK): every check asks twice")
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 32<<10)
	var seq uint32
	for _, perFamily := range []bool{false, true} {
		got := map[int]bool{}
		err := askListeners(fd, buf, &seq, setOf(ports...), perFamily, func(port int, _ Owner) { got[port] = true })
		if err != nil {
			t.Fatalf("perFamily=%v: %v", perFamily, err)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("perFamily=%v: found %v, want %v", perFamily, got, want)
		}
	}
}

// TestSockDiagOwnersAreTheListenersUIDs: Owners names the uid of each listener (here this
// process's; the proxy's tests meet another user's) and nothing for a port without one.
func TestSockDiagOwnersAreTheListenersUIDs(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mine := l.Addr().(*net.TCPAddr).Port
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	unused := free.Addr().(*net.TCPAddr).Port
	free.Close()
	owners, err := Owners([]int{mine, unused})
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if f, err := l.(*net.TCPListener).File(); err != nil {
		t.Fatal(err)
	} else {
		err = syscall.Fstat(int(f.Fd()), &st)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := owners[mine]; len(got) != 1 || got[0] != (Owner{UID: uint32(os.Getuid()), Inode: uint32(st.Ino)}) {
		t.Fatalf("owners of %d = %v, want [{%d %d}]", mine, got, os.Getuid(), st.Ino)
	}
	if got, ok := owners[unused]; ok {
		t.Fatalf("a port nothing listens on has owners %v", got)
	}
}
