package listeners

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// tcpListen is the kernel's TCP_LISTEN state as printed in the st column.
const tcpListen = 0x0A

// parseTable reads one /proc/net/tcp or /proc/net/tcp6 table from r and sets found[port] for every
// port in want that has a socket in LISTEN state. Rows look like
//
//	0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000  0 12345 ...
//
// (local address is hex IP, a colon and a 4-digit hex port). Any row that does not have that shape
// is an error: a table we cannot parse must not read as "nothing listens".
func parseTable(r io.Reader, want map[int]bool, found map[int]bool) error {
	scanner := bufio.NewScanner(r)
	if !scanner.Scan() {
		if err := scanner.Err(); err != nil {
			return err
		}
		return errors.New("empty table, no header")
	}
	header := scanner.Bytes()
	first, rest := nextField(header)
	second, _ := nextField(rest)
	if string(first) != "sl" || string(second) != "local_address" {
		return fmt.Errorf("unexpected header %q", header)
	}
	for lineNumber := 2; scanner.Scan(); lineNumber++ {
		port, listening, err := parseRow(scanner.Bytes())
		if err != nil {
			return fmt.Errorf("line %d: %w", lineNumber, err)
		}
		if listening && want[port] {
			found[port] = true
		}
	}
	return scanner.Err()
}

// parseRow extracts the local port and whether the socket is in LISTEN state. It slices fields
// without allocating: a busy host's table holds tens of thousands of rows.
func parseRow(row []byte) (port int, listening bool, err error) {
	slot, rest := nextField(row)
	local, rest := nextField(rest)
	remote, rest := nextField(rest)
	state, _ := nextField(rest)
	if len(state) == 0 {
		return 0, false, fmt.Errorf("too few fields in %q", row)
	}
	if len(slot) < 2 || slot[len(slot)-1] != ':' {
		return 0, false, fmt.Errorf("bad slot field %q", slot)
	}
	if _, err := parseAddress(remote); err != nil {
		return 0, false, fmt.Errorf("remote address: %w", err)
	}
	port, err = parseAddress(local)
	if err != nil {
		return 0, false, fmt.Errorf("local address: %w", err)
	}
	st, err := strconv.ParseUint(string(state), 16, 8)
	if err != nil || len(state) != 2 {
		return 0, false, fmt.Errorf("bad state %q", state)
	}
	return port, st == tcpListen, nil
}

// parseAddress validates a hex "IP:PORT" field (8 hex digits for IPv4, 32 for IPv6) and returns the port.
func parseAddress(field []byte) (int, error) {
	ip, portHex, ok := bytes.Cut(field, []byte{':'})
	if !ok || (len(ip) != 8 && len(ip) != 32) || !isHex(ip) || len(portHex) != 4 {
		return 0, fmt.Errorf("malformed %q", field)
	}
	port, err := strconv.ParseUint(string(portHex), 16, 16)
	if err != nil {
		return 0, fmt.Errorf("non-hex port in %q", field)
	}
	return int(port), nil
}

func isHex(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// nextField returns the first space-separated field of b and what follows it.
func nextField(b []byte) (field, rest []byte) {
	b = bytes.TrimLeft(b, " \t")
	end := bytes.IndexAny(b, " \t")
	if end < 0 {
		return b, nil
	}
	return b[:end], b[end:]
}
