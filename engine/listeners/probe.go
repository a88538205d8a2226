package listeners

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// probeTimeout bounds each loopback connect; a listener on loopback answers in microseconds, so
// hitting it means something (a firewall dropping SYNs, a full backlog) keeps us from deciding.
const probeTimeout = 250 * time.Millisecond

// probeLoopback is the fallback when the socket tables cannot be read: it connects to every port on
// 127.0.0.1 and [::1] concurrently. It sees only listeners reachable through loopback (those bound
// to a wildcard or a loopback address), which is the best a process without /proc can know.
func probeLoopback(ports []int) ([]int, error) {
	type outcome struct {
		port      int
		listening bool
		err       error
	}
	outcomes := make([]outcome, 2*len(ports))
	var wg sync.WaitGroup
	for i, port := range ports {
		for j, host := range []string{"127.0.0.1", "::1"} {
			wg.Go(func() {
				listening, err := probePort(host, port)
				outcomes[2*i+j] = outcome{port, listening, err}
			})
		}
	}
	wg.Wait()

	// A connect on either address decides "listening" even if the other address could not decide.
	listening := make(map[int]bool, len(ports))
	for _, o := range outcomes {
		if o.listening {
			listening[o.port] = true
		}
	}
	for _, o := range outcomes {
		if o.err != nil && !listening[o.port] {
			return nil, o.err
		}
	}
	return inOrder(ports, listening), nil
}

// probePort connects once to host:port. A refused connect is "free"; for [::1], errors that mean
// the host has no IPv6 loopback are "free" too. Anything else is an error wrapping ErrUndecided.
func probePort(host string, port int) (bool, error) {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), probeTimeout)
	if err == nil {
		conn.Close()
		return true, nil
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return false, nil
	}
	if host == "::1" && (errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, syscall.EAFNOSUPPORT)) {
		return false, nil
	}
	return false, fmt.Errorf("%w: port %d on %s: %v", ErrUndecided, port, host, err)
}
