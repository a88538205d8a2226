// Package listeners answers whether TCP ports have a listener on this host, so that leasing a port
// family (SPEC §4) skips families already in use and the health view can report what listens now.
// The evidence is the kernel's: asked through sock_diag about the given ports only, or, where
// netlink cannot answer, read from its socket tables (/proc/net/tcp and /proc/net/tcp6); where
// neither can be read it falls back to a loopback connect probe. A check that cannot decide returns
// an error wrapping ErrUndecided instead of guessing "free".
package listeners

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
)

// ErrUndecided wraps every failure to decide (the engine maps it to PORT_LISTENER_EVIDENCE_INVALID / EAGAIN).
var ErrUndecided = errors.New("listener check could not decide")

const (
	tcpTablePath  = "/proc/net/tcp"
	tcp6TablePath = "/proc/net/tcp6"
)

// Listening returns the subset of ports (in the order given, no duplicates) that have a TCP socket in
// LISTEN state on this host, IPv4 or IPv6, bound to any address. It asks the kernel through
// sock_diag, then reads the kernel's socket tables when netlink cannot answer, and falls back to a
// loopback connect probe on 127.0.0.1 and [::1] when they cannot be read either. Any failure to
// decide, including a port outside 1-65535, is an error wrapping ErrUndecided.
func Listening(ports []int) ([]int, error) {
	want, err := wanted(ports)
	if err != nil || len(want) == 0 {
		return nil, err
	}
	found, err := sockDiagListening(want)
	if errors.Is(err, errDiagUnavailable) {
		return listeningFrom(tcpTablePath, tcp6TablePath, ports)
	}
	if err != nil {
		return nil, err
	}
	return inOrder(ports, found), nil
}

// Owner is a listening socket as sock_diag reports it: its owner's uid and its inode, which no
// other socket has while it lives.
type Owner struct{ UID, Inode uint32 }

// Owners returns the TCP sockets listening on each of ports that has one, as the kernel's
// sock_diag reports them: who a connection to the port would reach. Where sock_diag cannot answer
// it returns an error wrapping ErrUndecided: no other source tells owners apart reliably.
func Owners(ports []int) (map[int][]Owner, error) {
	want, err := wanted(ports)
	if err != nil {
		return nil, err
	}
	owners, err := sockDiagOwners(want)
	if err != nil && !errors.Is(err, ErrUndecided) {
		err = fmt.Errorf("%w: %w", ErrUndecided, err)
	}
	return owners, err
}

// PeerUID is the uid of the process end of a TCP connection from this host (peer) to local, as
// an accepted connection's remote and local addresses give them: the socket's owner, as the
// kernel keeps it. An error when the kernel cannot say (the peer gone already, no sock_diag).
func PeerUID(local, peer netip.AddrPort) (uint32, error) {
	return peerUID(netip.AddrPortFrom(local.Addr().Unmap(), local.Port()), netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port()))
}

// wanted is the set of ports, each checked to be a TCP port.
func wanted(ports []int) (map[int]bool, error) {
	want := make(map[int]bool, len(ports))
	for _, port := range ports {
		if port < 1 || port > 65535 {
			return nil, fmt.Errorf("%w: port %d is outside 1-65535", ErrUndecided, port)
		}
		want[port] = true
	}
	return want, nil
}

// listeningFrom is Listening without sock_diag, with the table paths as parameters, so tests can
// feed real files.
func listeningFrom(tcpPath, tcp6Path string, ports []int) ([]int, error) {
	want, err := wanted(ports)
	if err != nil || len(want) == 0 {
		return nil, err
	}
	found, readable, err := readTables(tcpPath, tcp6Path, want)
	if err != nil {
		return nil, err
	}
	if !readable {
		return probeLoopback(ports)
	}
	return inOrder(ports, found), nil
}

// readTables reports readable=false when a table cannot be opened (no /proc, not Linux, permission),
// which sends the caller to the probe. A missing tcp6 means IPv6 is disabled and is no evidence
// either way. A table that opens but does not parse is an error: it must not read as "free".
func readTables(tcpPath, tcp6Path string, want map[int]bool) (found map[int]bool, readable bool, err error) {
	tcp, err := os.Open(tcpPath)
	if err != nil {
		return nil, false, nil
	}
	defer tcp.Close()
	tcp6, err := os.Open(tcp6Path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		tcp6 = nil
	case err != nil:
		return nil, false, nil
	default:
		defer tcp6.Close()
	}

	found = make(map[int]bool, len(want))
	if err := parseTable(tcp, want, found); err != nil {
		return nil, true, fmt.Errorf("%w: %s: %v", ErrUndecided, tcpPath, err)
	}
	if tcp6 != nil {
		if err := parseTable(tcp6, want, found); err != nil {
			return nil, true, fmt.Errorf("%w: %s: %v", ErrUndecided, tcp6Path, err)
		}
	}
	return found, true, nil
}

// inOrder returns the ports marked in listening, in the order given, each once.
func inOrder(ports []int, listening map[int]bool) []int {
	var result []int
	seen := make(map[int]bool, len(ports))
	for _, port := range ports {
		if listening[port] && !seen[port] {
			seen[port] = true
			result = append(result, port)
		}
	}
	return result
}
