package listeners

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// PeerUID names the uid of a connection's other end: this process's own (root's here), and that
// of a process of uid 65534 that connects.
func TestPeerUIDOfAConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	local := ln.Addr().(*net.TCPAddr).AddrPort()
	accept := func() (*net.TCPConn, uint32) {
		t.Helper()
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		uid, err := PeerUID(c.LocalAddr().(*net.TCPAddr).AddrPort(), c.RemoteAddr().(*net.TCPAddr).AddrPort())
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.TCPConn), uid
	}
	own, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	c, uid := accept()
	c.Close()
	if uid != uint32(os.Getuid()) {
		t.Fatalf("this process's connection: uid %d, want %d", uid, os.Getuid())
	}
	if os.Getuid() != 0 {
		t.Skip("a connection of another uid needs root")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("no setpriv")
	}
	nobody := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", "-c",
		"exec 3<>/dev/tcp/127.0.0.1/"+strconv.Itoa(int(local.Port()))+"; read -r -u 3")
	if err := nobody.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { nobody.Process.Kill(); nobody.Wait() }()
	c, uid = accept()
	defer c.Close()
	if uid != 65534 {
		t.Fatalf("nobody's connection: uid %d, want 65534", uid)
	}
	if _, err := PeerUID(local, netip.MustParseAddrPort("127.0.0.1:1")); err == nil {
		t.Fatal("a connection that does not exist has a uid")
	}
	// Over IPv6 (the proxy listens on ::1 too; browsers try it first for *.localhost).
	ln6, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback:", err)
	}
	defer ln6.Close()
	own6, err := net.Dial("tcp", ln6.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer own6.Close()
	c6, err := ln6.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c6.Close()
	if uid, err := PeerUID(c6.LocalAddr().(*net.TCPAddr).AddrPort(), c6.RemoteAddr().(*net.TCPAddr).AddrPort()); err != nil || uid != uint32(os.Getuid()) {
		t.Fatalf("this process's connection over IPv6: uid %d, %v; want %d", uid, err, os.Getuid())
	}
}
