package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The seeds' new lease (ports.js, leasePortFamily): inside the record's lock, a connect probe of
// each of the candidate family's ports on loopback, all at once (probeListenerFamily), then the
// record with the holder and the lease committed as any change of it is (peerStore.update). Done
// in Go, as the peer's claim is: the figure is the peer's floor. Left out, as the claim's figure
// leaves it out: the seeds' reads of every other stack's record for the leases they hold.

// peerLeaseProbeTimeout bounds each connect as ports.js's listenerTimeoutMs does; a refused
// loopback connect answers at once.
const peerLeaseProbeTimeout = 250 * time.Millisecond

// peerLeaseFixture is the peer's record of stack n, made once per run from the shared daemon's.
var peerLeaseFixture *peerStore

// peerLease starts from the shared daemon's own record of stack n without holders or an active
// lease (what its sleep drain leaves), so both commit the same document.
func peerLease(b *testing.B, stack string) *peerStore {
	if peerLeaseFixture != nil {
		return peerLeaseFixture
	}
	data, err := os.ReadFile(stack + "/record")
	if err != nil {
		b.Fatal(err)
	}
	var record map[string]any
	if err := json.Unmarshal(data, &record); err != nil {
		b.Fatal(err)
	}
	value, ok := record["value"].(map[string]any)
	if !ok {
		b.Fatalf("stack %s's record has no value", stack)
	}
	value["holders"] = []any{}
	if lease, ok := value["lease"].(map[string]any); ok {
		lease["released"] = true
	}
	if data, err = json.MarshalIndent(record, "", "  "); err != nil {
		b.Fatal(err)
	}
	if peerLeaseFixture, err = newPeerStore(filepath.Join(workDir, "peer-lease"), data); err != nil {
		b.Fatal(err)
	}
	return peerLeaseFixture
}

// newLease claims the record for holder name, leasing the family of ports at offset (step, count
// and bases are the declaration it records), after the connect probe found none of them listened on.
func (p *peerStore) newLease(name string, offset int, ports map[string]int, step, count int, bases map[string]int) error {
	probed := make([]int, 0, len(ports))
	for _, port := range ports {
		probed = append(probed, port)
	}
	slices.Sort(probed)
	return p.update(func(r map[string]any) error {
		value, ok := r["value"].(map[string]any)
		if !ok {
			return fmt.Errorf("peer record has no value")
		}
		busy, err := connectProbe(probed)
		if err != nil {
			return err
		}
		if len(busy) > 0 {
			return fmt.Errorf("peer: ports %v have a listener", busy)
		}
		addPeerHolder(value, name)
		value["lease"] = map[string]any{
			"offset":      offset,
			"ports":       ports,
			"released":    false,
			"declaration": map[string]any{"step": step, "count": count, "bases": bases},
		}
		bump(r)
		return nil
	})
}

// endLease is what the peer's sleep drain leaves: no holders, the lease released.
func (p *peerStore) endLease() error {
	return p.update(func(r map[string]any) error {
		value := r["value"].(map[string]any)
		value["holders"] = []any{}
		if lease, ok := value["lease"].(map[string]any); ok {
			lease["released"] = true
		}
		bump(r)
		return nil
	})
}

// connectProbe connects to each port on 127.0.0.1 at once (non-blocking, then one poll for all),
// as ports.js's probeLoopbackPort does for a family: a connect is a listener, a refusal none,
// anything else (a timeout included) undecided.
func connectProbe(ports []int) ([]int, error) {
	fds := make([]int, 0, len(ports))
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	var busy []int
	var waiting []unix.PollFd
	pending := map[int32]int{} // fd -> port
	for _, port := range ports {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		fds = append(fds, fd)
		switch err := unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); {
		case err == nil:
			busy = append(busy, port)
		case errors.Is(err, unix.ECONNREFUSED):
		case errors.Is(err, unix.EINPROGRESS):
			waiting = append(waiting, unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT})
			pending[int32(fd)] = port
		default:
			return nil, fmt.Errorf("probing port %d: %w", port, err)
		}
	}
	deadline := time.Now().Add(peerLeaseProbeTimeout)
	for len(waiting) > 0 {
		n, err := unix.Poll(waiting, int(time.Until(deadline)/time.Millisecond)+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("probing ports %v: no answer within %v", ports, peerLeaseProbeTimeout)
		}
		still := waiting[:0]
		for _, w := range waiting {
			if w.Revents == 0 {
				still = append(still, w)
				continue
			}
			switch soErr, err := unix.GetsockoptInt(int(w.Fd), unix.SOL_SOCKET, unix.SO_ERROR); {
			case err != nil:
				return nil, err
			case soErr == 0:
				busy = append(busy, pending[w.Fd])
			case unix.Errno(soErr) != unix.ECONNREFUSED:
				return nil, fmt.Errorf("probing port %d: %w", pending[w.Fd], unix.Errno(soErr))
			}
		}
		waiting = still
	}
	slices.Sort(busy)
	return busy, nil
}
