package engine

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
)

// ephemeralRangePath is where Linux keeps the local ports it hands to outgoing connections.
const ephemeralRangePath = "/proc/sys/net/ipv4/ip_local_port_range"

// ephemeralRange is the kernel's range of ports for outgoing connections, both ends included. A
// leased port inside it can be taken by any process's connect(2) between the lease and the bind.
type ephemeralRange struct {
	Low, High int
}

// ephemeralRangeFile is ephemeralRangePath kept open: a read at offset 0 of a sysctl file is its
// value now, and opening it costs twice what reading it does (every health read reads it). Its
// mutex guards f and is held across the read (LOCK ORDERING 6).
var ephemeralRangeFile struct {
	sync.Mutex
	f *os.File
}

// readEphemeralRange reads this host's range.
func readEphemeralRange() (ephemeralRange, error) {
	data, err := readEphemeralRangeFile()
	if err != nil {
		return ephemeralRange{}, fmt.Errorf("read the kernel's ephemeral port range: %w", err)
	}
	return parseEphemeralRange(string(data))
}

func readEphemeralRangeFile() ([]byte, error) {
	k := &ephemeralRangeFile
	k.Lock()
	defer k.Unlock()
	if k.f == nil {
		f, err := os.Open(ephemeralRangePath)
		if err != nil {
			return nil, err
		}
		k.f = f
	}
	buf := make([]byte, 64) // "32768\t60999\n"
	n, err := k.f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		k.f.Close() // opened again at the next read
		k.f = nil
		return nil, err
	}
	return buf[:n], nil
}

// parseEphemeralRange reads the content of ip_local_port_range: two ports separated by white
// space ("32768\t60999\n"), low ≤ high.
func parseEphemeralRange(text string) (ephemeralRange, error) {
	fields := strings.Fields(text)
	if len(fields) != 2 {
		return ephemeralRange{}, fmt.Errorf("ephemeral port range %q is not two ports", text)
	}
	var ends [2]int
	for i, f := range fields {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 65535 {
			return ephemeralRange{}, fmt.Errorf("ephemeral port range %q: %q is not a port", text, f)
		}
		ends[i] = n
	}
	if ends[0] > ends[1] {
		return ephemeralRange{}, fmt.Errorf("ephemeral port range %q ends before it starts", text)
	}
	return ephemeralRange{Low: ends[0], High: ends[1]}, nil
}

func (r ephemeralRange) String() string { return fmt.Sprintf("%d-%d", r.Low, r.High) }

// inside returns the ports that lie in r, sorted.
func (r ephemeralRange) inside(ports []int) []int {
	var in []int
	for _, p := range ports {
		if p >= r.Low && p <= r.High {
			in = append(in, p)
		}
	}
	sort.Ints(in)
	return in
}

// ephemeralOverlap returns the candidate ports of decl that lie in r, sorted.
func (r ephemeralRange) ephemeralOverlap(decl portdecl.Declaration) []int {
	return r.inside(candidatePorts(decl))
}

func candidatePorts(decl portdecl.Declaration) []int {
	var ports []int
	for _, f := range decl.Candidates() {
		ports = append(ports, familyPorts(f)...)
	}
	return ports
}

// ephemeralWarning is the warning an accepted config earns when its candidates overlap this host's
// ephemeral range; "" when they do not, or when the range cannot be read (nothing to warn about
// that we know of).
func ephemeralWarning(decl portdecl.Declaration) string {
	r, err := readEphemeralRange()
	if err != nil {
		return ""
	}
	overlap := r.ephemeralOverlap(decl)
	if len(overlap) == 0 {
		return ""
	}
	return fmt.Sprintf("candidate ports %s overlap the kernel's ephemeral port range (%s); the kernel may hand them to any outgoing connection",
		summarizePorts(overlap), r)
}

// summarizePorts names a few ports and how many there are, so a 1024-port overlap stays one
// readable line.
func summarizePorts(ports []int) string {
	const shown = 6
	if len(ports) <= shown {
		return joinPorts(ports)
	}
	return fmt.Sprintf("%s,…,%d (%d ports)", joinPorts(ports[:shown-1]), ports[len(ports)-1], len(ports))
}
