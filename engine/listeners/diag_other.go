//go:build !linux

package listeners

import (
	"errors"
	"net/netip"
)

// errDiagUnavailable: sock_diag is Linux's; elsewhere the socket tables or the probe answer.
var errDiagUnavailable = errors.New("sock_diag unavailable")

func sockDiagListening(map[int]bool) (map[int]bool, error) { return nil, errDiagUnavailable }

func sockDiagOwners(map[int]bool) (map[int][]Owner, error) { return nil, errDiagUnavailable }

func peerUID(netip.AddrPort, netip.AddrPort) (uint32, error) { return 0, errDiagUnavailable }
