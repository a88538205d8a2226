package listeners

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// The kernel's sock_diag interface (linux/inet_diag.h), asked only about the candidate ports: a
// listener check then costs the same whatever the number of sockets on the host, where reading
// /proc/net/tcp{,6} formats and parses every one of them.
const (
	inetDiagReqBytecode = 1  // INET_DIAG_REQ_BYTECODE: the request's filter attribute
	inetDiagBcJmp       = 1  // INET_DIAG_BC_JMP
	inetDiagBcSEq       = 11 // INET_DIAG_BC_S_EQ: local port equal to the next op's "no"
	tcpListenState      = 10

	inetDiagReqV2Size = 56 // family, protocol, ext, pad, states, inet_diag_sockid (48)
	// The original request, TCPDIAG_GETSOCK with struct inet_diag_req: family, src_len, dst_len,
	// ext, inet_diag_sockid (48), states, dbs. The kernel dumps it with no family filter, so one
	// walk of the listening table answers for IPv4 and IPv6 both, where SOCK_DIAG_BY_FAMILY walks
	// it once per family (16,384 buckets here: most of a check's cost).
	tcpDiagGetSock   = 18
	inetDiagReqSize  = 60
	inetDiagReqState = 52 // offset of idiag_states
	inetDiagMsgSize  = 72 // up to inode; family, state, the local port, the uid and the inode are read
	inetDiagMsgUID   = 64
	inetDiagMsgInode = 68
	bcPortSize       = 12 // per port: S_EQ, the port, JMP (see portFilter)

	// diagPortsPerRequest keeps a filter's jumps within its 16-bit offsets (12 bytes a port).
	diagPortsPerRequest = 1024
)

// errDiagUnavailable means sock_diag cannot answer here (no netlink, no tcp_diag, a sandbox that
// refuses it): the caller falls back to the socket tables.
var errDiagUnavailable = errors.New("sock_diag unavailable")

// diag is the daemon's one sock_diag socket, kept open between checks: opening and closing a
// netlink socket (and zeroing a fresh receive buffer) was most of a check's cost. mu makes the
// checks take turns on it, so each request's replies are read by the check that sent it; a reply
// still queued from a check that gave up is told apart by its sequence number.
var diag struct {
	mu  sync.Mutex
	fd  int // -1 until opened, and again after a failure left the socket's state unknown
	seq uint32
	buf []byte
	// perFamily: the kernel refused the one-walk request (TCPDIAG_GETSOCK), so each check asks
	// once per family.
	perFamily bool
}

func init() { diag.fd = -1 }

// openDiag opens the sock_diag socket unless it is open. diag.mu is held.
func openDiag() error {
	if diag.fd >= 0 {
		return nil
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return fmt.Errorf("%w: %v", errDiagUnavailable, err)
	}
	diag.fd = fd
	diag.buf = make([]byte, 32<<10)
	return nil
}

// sockDiagListening sets found[port] for every port of want with a TCP socket in LISTEN state,
// IPv4 or IPv6 (v4-mapped and dual-stack sockets are IPv6 sockets). It returns an error wrapping
// errDiagUnavailable when the kernel cannot be asked, and one wrapping ErrUndecided when its
// answer does not parse.
func sockDiagListening(want map[int]bool) (map[int]bool, error) {
	found := make(map[int]bool, len(want))
	err := sockDiag(want, func(port int, _ Owner) { found[port] = true })
	if err != nil {
		return nil, err
	}
	return found, nil
}

// sockDiagOwners is sockDiagListening with every listening socket, per port.
func sockDiagOwners(want map[int]bool) (map[int][]Owner, error) {
	owners := make(map[int][]Owner, len(want))
	err := sockDiag(want, func(port int, s Owner) {
		if !slices.Contains(owners[port], s) {
			owners[port] = append(owners[port], s)
		}
	})
	if err != nil {
		return nil, err
	}
	return owners, nil
}

// sockDiag calls mark with the port and uid of each TCP socket in LISTEN state on a port of want.
func sockDiag(want map[int]bool, mark func(port int, s Owner)) error {
	diag.mu.Lock()
	defer diag.mu.Unlock()
	if err := openDiag(); err != nil {
		return err
	}
	err := askListeners(diag.fd, diag.buf, &diag.seq, want, diag.perFamily, mark)
	if !diag.perFamily && oneWalkRefused(err) {
		diag.perFamily = true
		err = askListeners(diag.fd, diag.buf, &diag.seq, want, true, mark)
	}
	if err != nil {
		// A socket that failed, or whose reply did not parse, is not asked again: the next check
		// opens a new one.
		unix.Close(diag.fd)
		diag.fd = -1
	}
	return err
}

// oneWalkRefused: the kernel answered the one-walk request with an error saying it does not
// know it, as a kernel without the original inet_diag interface would.
func oneWalkRefused(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS)
}

// askListeners dumps the listeners of want's ports, both families, on fd: in one request, or
// perFamily, one request per family.
func askListeners(fd int, buf []byte, seq *uint32, want map[int]bool, perFamily bool, mark func(int, Owner)) error {
	ports := make([]int, 0, len(want))
	for port := range want {
		ports = append(ports, port)
	}
	for start := 0; start < len(ports); start += diagPortsPerRequest {
		chunk := ports[start:min(start+diagPortsPerRequest, len(ports))]
		if !perFamily {
			*seq++
			if err := dumpListeners(fd, buf, *seq, bothFamiliesRequest(*seq, chunk), mark); err != nil {
				return err
			}
			continue
		}
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			*seq++
			err := dumpListeners(fd, buf, *seq, familyRequest(*seq, family, chunk), mark)
			// Without IPv6 in the kernel there is no AF_INET6 handler (ENOENT): no IPv6 listeners.
			if family == unix.AF_INET6 && errors.Is(err, unix.ENOENT) {
				continue
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// dumpListeners sends one dump request numbered seq and marks the listeners it returns.
func dumpListeners(fd int, buf []byte, seq uint32, request []byte, mark func(int, Owner)) error {
	if err := unix.Sendto(fd, request, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("%w: send: %v", errDiagUnavailable, err)
	}
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: receive: %v", errDiagUnavailable, err)
		}
		done, err := readDiagReplies(buf[:n], seq, mark)
		if done || err != nil {
			return err
		}
	}
}

// familyRequest is inet_diag_req_v2 for TCP sockets of family in LISTEN state, filtered to ports.
func familyRequest(seq uint32, family uint8, ports []int) []byte {
	msg, req := dumpRequest(seq, unix.SOCK_DIAG_BY_FAMILY, inetDiagReqV2Size, ports)
	req[0], req[1] = family, unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(req[4:], 1<<tcpListenState)
	return msg
}

// bothFamiliesRequest is the original inet_diag_req for TCP sockets in LISTEN state, filtered to
// ports: the kernel answers it for both families in one walk.
func bothFamiliesRequest(seq uint32, ports []int) []byte {
	msg, req := dumpRequest(seq, tcpDiagGetSock, inetDiagReqSize, ports)
	req[0] = unix.AF_INET // read by nothing in a dump; the kernel's own tools set it
	binary.NativeEndian.PutUint32(req[inetDiagReqState:], 1<<tcpListenState)
	return msg
}

// dumpRequest is a netlink dump request of kind: header, a zeroed request of reqSize bytes
// (returned for the caller to fill), and the bytecode attribute keeping only the given local ports.
func dumpRequest(seq uint32, kind uint16, reqSize int, ports []int) (msg, req []byte) {
	filter := portFilter(ports)
	attrLen := unix.SizeofNlAttr + len(filter)
	size := unix.NLMSG_HDRLEN + reqSize + attrLen
	msg = make([]byte, size)
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:], uint32(size))
	ne.PutUint16(msg[4:], kind)
	ne.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(msg[8:], seq)
	req = msg[unix.NLMSG_HDRLEN : unix.NLMSG_HDRLEN+reqSize]
	attr := msg[unix.NLMSG_HDRLEN+reqSize:]
	ne.PutUint16(attr[0:], uint16(attrLen))
	ne.PutUint16(attr[2:], inetDiagReqBytecode)
	copy(attr[unix.SizeofNlAttr:], filter)
	return msg, req
}

// portFilter is inet_diag bytecode accepting a socket whose local port is any of ports. The
// kernel runs it as a program of 4-byte ops {code, yes, no}: it jumps forward by yes when the
// condition holds, by no when not, and accepts when it lands exactly on the end. Per port:
//
//	S_EQ  yes=8 (to the JMP)  no=12 (to the next port's S_EQ; after the last, past the end: reject)
//	      port (the operand, in the "no" field of a second op)
//	JMP   yes=4 (the kernel's checker walks ops by yes)  no=to the end: accept
//
// "yes" is one byte, so a match cannot jump to the end directly; "no" has 16 bits.
func portFilter(ports []int) []byte {
	ne := binary.NativeEndian
	bc := make([]byte, bcPortSize*len(ports))
	for i, port := range ports {
		op := bc[bcPortSize*i:]
		remaining := len(bc) - bcPortSize*i
		op[0], op[1] = inetDiagBcSEq, 8
		ne.PutUint16(op[2:], bcPortSize)
		if i == len(ports)-1 {
			ne.PutUint16(op[2:], uint16(remaining+4))
		}
		ne.PutUint16(op[6:], uint16(port))
		op[8], op[9] = inetDiagBcJmp, 4
		ne.PutUint16(op[10:], uint16(remaining-8))
	}
	return bc
}

// readDiagReplies parses one datagram of the dump answering seq, marking each listener's port
// and uid; done once it holds NLMSG_DONE. An NLMSG_ERROR is returned as the errno it carries.
func readDiagReplies(b []byte, seq uint32, mark func(int, Owner)) (done bool, err error) {
	ne := binary.NativeEndian
	for len(b) >= unix.NLMSG_HDRLEN {
		size := int(ne.Uint32(b[0:]))
		kind := ne.Uint16(b[4:])
		replySeq := ne.Uint32(b[8:])
		if size < unix.NLMSG_HDRLEN || size > len(b) {
			return true, fmt.Errorf("%w: sock_diag: malformed reply (length %d of %d)", ErrUndecided, size, len(b))
		}
		body := b[unix.NLMSG_HDRLEN:size]
		b = b[min(nlmsgAlign(size), len(b)):]
		if replySeq != seq {
			continue // left over from an earlier request on this socket
		}
		switch kind {
		case unix.NLMSG_DONE:
			return true, nil
		case unix.NLMSG_ERROR:
			if len(body) < 4 {
				return true, fmt.Errorf("%w: sock_diag: short error reply", ErrUndecided)
			}
			if errno := -int32(ne.Uint32(body)); errno != 0 {
				return true, fmt.Errorf("%w: %w", errDiagUnavailable, unix.Errno(errno))
			}
		case unix.SOCK_DIAG_BY_FAMILY, tcpDiagGetSock: // each request's replies carry its kind
			if len(body) < inetDiagMsgSize {
				return true, fmt.Errorf("%w: sock_diag: short socket reply (%d bytes)", ErrUndecided, len(body))
			}
			// inet_diag_msg: family, state, timer, retrans, then the socket id whose first field
			// is the local port in network byte order; after the id (48 bytes), expires, rqueue
			// and wqueue, the socket's uid.
			if body[1] == tcpListenState {
				mark(int(binary.BigEndian.Uint16(body[4:])), Owner{UID: ne.Uint32(body[inetDiagMsgUID:]), Inode: ne.Uint32(body[inetDiagMsgInode:])})
			}
		}
	}
	return false, nil
}

func nlmsgAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// tcpEstablishedStates are every TCP state but LISTEN: a peer's socket in whatever state it is.
const tcpEstablishedStates = ^uint32(1 << tcpListenState)

// peerUID is the uid of the local TCP socket whose own address is peer and whose remote is
// local: the other end of a connection this process accepted on local, from this host.
func peerUID(local, peer netip.AddrPort) (uint32, error) {
	diag.mu.Lock()
	defer diag.mu.Unlock()
	if err := openDiag(); err != nil {
		return 0, err
	}
	diag.seq++
	uid, err := askSocket(diag.fd, diag.buf, diag.seq, socketRequest(diag.seq, local, peer))
	if err != nil && !errors.Is(err, unix.ENOENT) {
		unix.Close(diag.fd) // its state unknown: the next question opens a new one
		diag.fd = -1
	}
	return uid, err
}

// askSocket sends request, a question about one socket numbered seq, and returns the uid of the
// socket the kernel answers with; ENOENT when there is none.
func askSocket(fd int, buf []byte, seq uint32, request []byte) (uint32, error) {
	if err := unix.Sendto(fd, request, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("%w: send: %v", errDiagUnavailable, err)
	}
	ne := binary.NativeEndian
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("%w: receive: %v", errDiagUnavailable, err)
		}
		for b := buf[:n]; len(b) >= unix.NLMSG_HDRLEN; {
			size := int(ne.Uint32(b[0:]))
			if size < unix.NLMSG_HDRLEN || size > len(b) {
				return 0, fmt.Errorf("%w: sock_diag: malformed reply (length %d of %d)", ErrUndecided, size, len(b))
			}
			kind, replySeq, body := ne.Uint16(b[4:]), ne.Uint32(b[8:]), b[unix.NLMSG_HDRLEN:size]
			b = b[min(nlmsgAlign(size), len(b)):]
			switch {
			case replySeq != seq: // left over from an earlier request on this socket
			case kind == unix.NLMSG_ERROR && len(body) >= 4:
				return 0, unix.Errno(-int32(ne.Uint32(body)))
			case kind == unix.SOCK_DIAG_BY_FAMILY && len(body) >= inetDiagMsgSize:
				return ne.Uint32(body[inetDiagMsgUID:]), nil
			default:
				return 0, fmt.Errorf("%w: sock_diag: unexpected reply %d of %d bytes", ErrUndecided, kind, len(body))
			}
		}
	}
}

// socketRequest is inet_diag_req_v2 for the one TCP socket bound to peer and connected to local,
// in any state but LISTEN.
func socketRequest(seq uint32, local, peer netip.AddrPort) []byte {
	ne := binary.NativeEndian
	size := unix.NLMSG_HDRLEN + inetDiagReqV2Size
	msg := make([]byte, size)
	ne.PutUint32(msg[0:], uint32(size))
	ne.PutUint16(msg[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(msg[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(msg[8:], seq)
	req := msg[unix.NLMSG_HDRLEN:]
	req[0], req[1] = unix.AF_INET6, unix.IPPROTO_TCP
	if peer.Addr().Is4() {
		req[0] = unix.AF_INET
	}
	ne.PutUint32(req[4:], tcpEstablishedStates)
	// inet_diag_sockid: sport, dport (network order), src[16], dst[16], if, cookie (none).
	id := req[8:]
	binary.BigEndian.PutUint16(id[0:], peer.Port())
	binary.BigEndian.PutUint16(id[2:], local.Port())
	src, dst := peer.Addr().As16(), local.Addr().As16()
	if peer.Addr().Is4() {
		s4, d4 := peer.Addr().As4(), local.Addr().As4()
		src, dst = [16]byte{}, [16]byte{}
		copy(src[:], s4[:])
		copy(dst[:], d4[:])
	}
	copy(id[4:], src[:])
	copy(id[20:], dst[:])
	ne.PutUint32(id[40:], 0xffffffff) // INET_DIAG_NOCOOKIE
	ne.PutUint32(id[44:], 0xffffffff)
	return msg
}
