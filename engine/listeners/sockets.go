package listeners

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
)

// Socket is a TCP socket in LISTEN state as the kernel's socket table shows it.
type Socket struct {
	Address string // the local address, as net.IP prints it ("0.0.0.0", "::1")
	Port    int
	UID     uint32 // its owner
	Inode   string // as a process's /proc/<pid>/fd links name it: socket:[<Inode>]
}

// Sockets lists the TCP sockets listening (IPv4 and IPv6) in this network namespace on a port
// want accepts, from /proc/net/tcp and /proc/net/tcp6 (no tcp6: no IPv6). Only LISTEN rows
// count: a client connected to a port (a browser, curl) has a socket whose remote port is it,
// never a listening one. A row that does not parse is an error, as in Listening's fallback.
func Sockets(want func(port int) bool) ([]Socket, error) {
	var found []Socket
	for _, table := range []string{tcpTablePath, tcp6TablePath} {
		data, err := os.ReadFile(table)
		if errors.Is(err, os.ErrNotExist) && table == tcp6TablePath {
			continue
		}
		if err != nil {
			return nil, err
		}
		lines := bytes.Split(data, []byte("\n"))
		for i, line := range lines[1:] { // the header
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			port, listening, err := parseRow(line)
			if err != nil {
				return nil, fmt.Errorf("%s line %d: %w", table, i+2, err)
			}
			if !listening || !want(port) {
				continue
			}
			s, err := socketOf(line, port)
			if err != nil {
				return nil, fmt.Errorf("%s line %d: %w", table, i+2, err)
			}
			found = append(found, s)
		}
	}
	return found, nil
}

// socketOf reads a LISTEN row's local address, uid (its 8th field) and inode (its 10th).
func socketOf(row []byte, port int) (Socket, error) {
	var f [10][]byte
	rest := row
	for i := range f {
		f[i], rest = nextField(rest)
	}
	if len(f[9]) == 0 {
		return Socket{}, fmt.Errorf("too few fields in %q", row)
	}
	uid, err := strconv.ParseUint(string(f[7]), 10, 32)
	if err != nil {
		return Socket{}, fmt.Errorf("bad uid %q", f[7])
	}
	hexAddr, _, _ := bytes.Cut(f[1], []byte{':'})
	raw := make([]byte, hex.DecodedLen(len(hexAddr)))
	if _, err := hex.Decode(raw, hexAddr); err != nil {
		return Socket{}, fmt.Errorf("bad address %q", f[1])
	}
	// The kernel prints the address as 32-bit words in host (little-endian) order.
	for i := 0; i+4 <= len(raw); i += 4 {
		raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	return Socket{Address: net.IP(raw).String(), Port: port, UID: uint32(uid), Inode: string(f[9])}, nil
}
