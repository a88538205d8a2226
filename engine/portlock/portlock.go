// Package portlock holds TCP port numbers for a cockpitfs daemon, machine-wide, with the kernel as
// the lock manager.
//
// Why a socket and not a store or a file: several daemons (any uid, any data directory) may run on
// one machine, and each must never lease a port another one leases. A port is held by binding the
// abstract unix socket name "cockpitfs/port/<n>/<balance>" (see name): the kernel lets exactly one socket bind a name,
// for every uid alike; it frees the name when the socket is closed or its process dies (kill -9
// included), so a crashed daemon strands nothing; and abstract names live in the network namespace,
// exactly as TCP ports do, so a container's daemon has names of its own as it has ports of its
// own. Nothing on disk can be pre-created to lock others out, and nobody polls.
//
// A held name listens: whoever connects learns the holder's pid and uid from the kernel
// (SO_PEERCRED), and a cockpitfs daemon answers one JSON line saying which daemon it is and which
// lease the port belongs to. The owner is what the kernel says, never what the holder answers: the
// answer is read only when /proc shows the holder runs this very program (the same executable
// file), and then only as which data directory and lease, never as who. Anything else holding a
// name is not a cockpitfs daemon this process can vouch for (a squatter).
//
// Daemons before the balanced names held "cockpitfs/port/<n>" (the legacy name). A daemon takes a
// port only when its legacy name is free too, and holds the legacy names as well (compat) once it
// has seen a process hold one that holds no balanced name of the same port: an older daemon then
// finds this one's ports held, as it always did (see Compat).
//
// The package binds, releases and asks; whether a family may be leased is the engine's rule.
package portlock

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Space is a family of names, one per port: Machine is the one every daemon uses. Tests that must
// not meet other daemons use a space of their own.
type Space string

// Machine is the space of every cockpitfs daemon.
const Machine Space = "cockpitfs/port/"

// ErrHeld is returned by Take when another socket holds the port's name.
var ErrHeld = errors.New("port is held by another process")

// answerTimeout bounds how long Ask waits for a holder's answer; a daemon answers at once, a
// stopped one never. Once a process has let Ask wait that long, Ask does not wait for it again
// for quietFor (an answer already there is still read): a holder that never answers costs one
// wait, not one per name it holds.
const (
	answerTimeout = 200 * time.Millisecond
	quietFor      = 10 * time.Second
)

// silent maps the pid of a process that did not answer to when Ask may wait for it again.
var silent sync.Map // int -> time.Time

// Identity is what a daemon's hold answers: the daemon and the lease the port belongs to.
type Identity struct {
	Daemon  string `json:"daemon"` // "cockpitfs"
	PID     int    `json:"pid"`
	UID     uint32 `json:"uid"`
	Data    string `json:"data"`
	Mount   string `json:"mount,omitempty"`
	Cockpit string `json:"cockpit,omitempty"`
	Stack   string `json:"stack,omitempty"`
	Key     string `json:"key,omitempty"`
	Port    int    `json:"port,omitempty"`
}

const daemonName = "cockpitfs"

// Holder is who holds a port: the kernel's pid and uid of the socket's owner (0 and false when
// it cannot be told), and the daemon's own answer when the kernel shows it runs this program.
type Holder struct {
	PID      int
	UID      uint32
	Known    bool      // PID and UID come from the kernel
	Identity *Identity // nil: not a cockpitfs daemon this process can vouch for
}

// String names the holder for a message: "cockpitfs daemon pid 12 uid 1000 (data /d, lease app/s)"
// or "process 12 uid 1000, not a cockpitfs daemon".
func (h Holder) String() string {
	who := "a process cockpitfs cannot name"
	if h.Known {
		who = fmt.Sprintf("process %d uid %d", h.PID, h.UID)
	}
	if h.Identity == nil {
		return who + ", not a cockpitfs daemon"
	}
	s := fmt.Sprintf("the cockpitfs daemon %s (data %s", who, Quoted(h.Identity.Data))
	if h.Identity.Stack != "" {
		s += ", lease " + h.Identity.Cockpit + "/" + h.Identity.Stack
	}
	return s + ")"
}

// Quoted is a path of another daemon's answer as a line or message shows it: quoted as Go quotes
// a string when it is empty or holds a space, '=', '"', ',' or a parenthesis, so that a data
// directory (any user may name one "d mount=/x cockpit=app") never reads as fields or words of
// the line's own.
func Quoted(path string) string {
	if path == "" || strings.ContainsAny(path, " =\",()") {
		return strconv.Quote(path)
	}
	return path
}

// Hold is one port held by this process until Release.
type Hold struct {
	space  Space
	port   int
	fd     int     // the balanced name's socket; -1 once released
	legacy int     // the legacy name's socket while compat holds it, else -1
	ans    *answer // what both answer
}

// Take holds port, answering id to whoever asks. It returns ErrHeld when another socket holds it,
// under either name. It is the balanced name's three system calls, the legacy name's probe (a
// socket, a bind and a close: a second walk of a chain of the kernel's table) and the
// registration with the process's one answering loop: a new lease pays for its holds. The answer
// is encoded at the first ask, not here: most holds are never asked.
func (s Space) Take(port int, id Identity) (*Hold, error) {
	return s.take(port, id, true)
}

// take is Take; without probe, the legacy name is bound only in compat (the caller knows it free).
func (s Space) take(port int, id Identity, probe bool) (*Hold, error) {
	fd, err := bindName(s.name(port), true)
	if err != nil {
		return nil, fmt.Errorf("port %d: %w", port, err)
	}
	st := s.state()
	st.mu.Lock()
	defer st.mu.Unlock()
	legacy := -1
	if probe || st.compat {
		legacy, err = bindName(s.legacyName(port), st.compat)
	}
	if err != nil {
		unix.Close(fd)
		if errors.Is(err, ErrHeld) {
			// An older daemon's hold, or a squatter's: from now on this process holds the legacy
			// names too, so older daemons see its ports held.
			st.setCompat()
		}
		return nil, fmt.Errorf("port %d: %w", port, err)
	}
	if !st.compat && legacy >= 0 {
		unix.Close(legacy) // only a probe
		legacy = -1
	}
	id.Daemon, id.Port = daemonName, port
	h := &Hold{space: s, port: port, fd: fd, legacy: legacy, ans: &answer{id: id}}
	if err := h.register(); err != nil {
		unix.Close(fd)
		if legacy >= 0 {
			unix.Close(legacy)
		}
		return nil, fmt.Errorf("holding port %d: %w", port, err)
	}
	st.holds[h] = true
	return h, nil
}

// register makes the loop answer on the hold's sockets.
func (h *Hold) register() error {
	if err := answers.add(h.fd, h.ans); err != nil {
		return err
	}
	if h.legacy >= 0 {
		if err := answers.add(h.legacy, h.ans); err != nil {
			answers.remove(h.fd)
			return err
		}
	}
	return nil
}

// bindName binds a new socket to the abstract name; listening, it takes connections (askers), else
// it only tells whether the name is free. A name already bound is ErrHeld.
func bindName(name string, listen bool) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return -1, fmt.Errorf("holding: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: name}); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EADDRINUSE) {
			return -1, ErrHeld
		}
		return -1, fmt.Errorf("holding: %w", err)
	}
	if listen {
		if err := unix.Listen(fd, 16); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("holding: %w", err)
		}
	}
	return fd, nil
}

// Release lets the port go: no asker is answered from it afterwards. The legacy name goes first,
// so the port is never free under it while still held under the balanced name (a daemon taking
// it then sees it held, not an older daemon's). Releasing twice does nothing.
func (h *Hold) Release() {
	st := h.space.state()
	st.mu.Lock()
	defer st.mu.Unlock()
	h.release(st)
}

// release is Release with st.mu held.
func (h *Hold) release(st *spaceState) {
	if h.fd < 0 {
		return
	}
	if h.legacy >= 0 {
		answers.remove(h.legacy)
		h.legacy = -1
	}
	answers.remove(h.fd)
	h.fd = -1
	delete(st.holds, h)
}

// spaceState is what this process knows of a space: whether it holds the legacy names too, and
// its live holds (to give them legacy names when it starts to).
type spaceState struct {
	mu     sync.Mutex
	compat bool
	holds  map[*Hold]bool // GUARDED_BY(mu)
	shared []*Hold        // GUARDED_BY(mu): holds let go as compat began, see Shared
}

var states sync.Map // Space -> *spaceState

func (s Space) state() *spaceState {
	if st, ok := states.Load(s); ok {
		return st.(*spaceState)
	}
	st, _ := states.LoadOrStore(s, &spaceState{holds: map[*Hold]bool{}})
	return st.(*spaceState)
}

// Compat says whether this process holds the legacy names of its holds in the space too.
func (s Space) Compat() bool {
	st := s.state()
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.compat
}

// setCompat starts holding legacy names, binding them for every live hold; st.mu is held. A hold
// whose legacy name another process holds is a port an older daemon took while this one held it
// without the legacy name (it started after this one saw none): the hold is let go, and kept for
// its taker to report the port as another's (see Shared).
func (st *spaceState) setCompat() {
	if st.compat {
		return
	}
	st.compat = true
	for h := range st.holds {
		legacy, err := bindName(h.space.legacyName(h.port), true)
		if err == nil {
			err = answers.add(legacy, h.ans)
			if err != nil {
				unix.Close(legacy)
			}
		}
		if err != nil {
			h.release(st)
			st.shared = append(st.shared, h)
			continue
		}
		h.legacy = legacy
	}
}

// Shared returns, once, the holds of which (mine says) this process let go when it began to hold
// the legacy names, since an older daemon held those names too: the leases they belong to do not
// hold their ports any more.
func (s Space) Shared(mine func(*Hold) bool) []*Hold {
	st := s.state()
	st.mu.Lock()
	defer st.mu.Unlock()
	var shared []*Hold
	st.shared = slices.DeleteFunc(st.shared, func(h *Hold) bool {
		if mine(h) {
			shared = append(shared, h)
			return true
		}
		return false
	})
	return shared
}

// Port is the port held.
func (h *Hold) Port() int { return h.port }

// CheckLegacy makes this process hold legacy names too when a process holds a legacy name in the
// space without the balanced name of the same port — an older daemon's hold (a daemon in compat
// holds both) — as the kernel's table shows now. A daemon calls it before it takes its holds, and
// takes them with what it returns.
func (s Space) CheckLegacy() (*Legacy, error) {
	balanced, legacy, err := s.bound()
	if err != nil {
		return nil, err
	}
	seen := &Legacy{space: s, held: map[int]bool{}}
	for port := range legacy {
		if _, both := balanced[port]; !both {
			seen.held[port] = true
		}
	}
	if len(seen.held) > 0 {
		st := s.state()
		st.mu.Lock()
		st.setCompat()
		st.mu.Unlock()
	}
	return seen, nil
}

// Legacy is what CheckLegacy saw: the ports whose legacy name alone was bound.
type Legacy struct {
	space Space
	held  map[int]bool
}

// Take is Space.Take with the legacy names as CheckLegacy saw them, a moment ago, instead of a
// probe per port: a daemon's restart takes thousands of holds, and the probe is a second walk of
// a chain of the kernel's table (a quarter of the holds' time beside 20,000 names). A port whose
// legacy name was bound is ErrHeld. An older daemon that bound one since is the case compat cannot
// exclude anyway (one starting after this daemon looked).
func (l *Legacy) Take(port int, id Identity) (*Hold, error) {
	if l.held[port] {
		return nil, fmt.Errorf("port %d: %w", port, ErrHeld)
	}
	return l.space.take(port, id, false)
}

// answers is the process's one loop answering every hold's askers (one epoll set), so a hold costs
// no goroutine and no thread.
var answers answerLoop

type answerLoop struct {
	start sync.Once
	err   error
	ep    int
	mu    sync.Mutex        // guards lines, held across the loop's accepts and answers; a leaf
	lines map[int32]*answer // by listening fd
}

// answer is what one hold answers its askers.
type answer struct {
	id   Identity
	line []byte // id's JSON line, encoded at the first ask
}

func (a *answerLoop) add(fd int, ans *answer) error {
	a.start.Do(func() {
		a.ep, a.err = unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if a.err == nil {
			a.lines = map[int32]*answer{}
			go a.serve()
		}
	})
	if a.err != nil {
		return a.err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lines[int32(fd)] = ans
	return unix.EpollCtl(a.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
}

// remove closes fd under the lock the loop answers under, so the loop never accepts on a closed
// (or reused) descriptor as if it were the hold.
func (a *answerLoop) remove(fd int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.lines, int32(fd))
	unix.EpollCtl(a.ep, unix.EPOLL_CTL_DEL, fd, nil)
	unix.Close(fd)
}

func (a *answerLoop) serve() {
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(a.ep, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return // holds still hold; askers then learn the pid and uid alone
		}
		a.mu.Lock()
		for _, ev := range events[:n] {
			ans, ok := a.lines[ev.Fd]
			if !ok {
				continue
			}
			if ans.line == nil {
				line, _ := json.Marshal(ans.id) // strings and numbers: it cannot fail
				ans.line = append(line, '\n')
			}
			for {
				c, _, err := unix.Accept4(int(ev.Fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
				if err != nil {
					break // EAGAIN: every asker answered
				}
				unix.Write(c, ans.line)
				unix.Close(c)
			}
		}
		a.mu.Unlock()
	}
}

// Ask says who holds port, under either name; ok is false when nobody does. It never blocks longer
// than answerTimeout: the connects are non-blocking (a holder that never accepts fills its
// backlog), and one holder answers.
func (s Space) Ask(port int) (holder Holder, ok bool, err error) {
	for _, name := range []string{s.name(port), s.legacyName(port)} {
		if holder, connected, err := s.ask(name, port); connected || err != nil {
			return holder, true, err
		}
	}
	// Neither name took a connection: bound but not listening, not accepting, or free. Held by
	// something that will not say, if by anything, so look for it in the kernel's tables.
	balanced, legacy, err := s.bound()
	if err != nil {
		return Holder{}, true, nil // cannot tell: the connect was refused by something there
	}
	inode, bound := balanced[port]
	if !bound {
		inode, bound = legacy[port]
	}
	if !bound {
		return Holder{}, false, nil
	}
	return owner(inode), true, nil
}

// ask connects to the name of port and says who holds it; connected is false when the name took
// no connection.
func (s Space) ask(name string, port int) (holder Holder, connected bool, err error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return Holder{}, false, err
	}
	defer unix.Close(fd)
	switch err := unix.Connect(fd, &unix.SockaddrUnix{Name: name}); {
	case errors.Is(err, unix.ECONNREFUSED), errors.Is(err, unix.EAGAIN):
		return Holder{}, false, nil
	case err != nil:
		return Holder{}, false, fmt.Errorf("asking who holds port %d: %w", port, err)
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return Holder{}, true, err
	}
	holder = Holder{PID: int(cred.Pid), UID: cred.Uid, Known: true}
	if !sameProgram(holder.PID) {
		return holder, true, nil
	}
	if id, ok := readIdentity(fd, holder.PID); ok && id.Port == port && id.PID == holder.PID && id.UID == holder.UID && id.printable() {
		holder.Identity = &id
	}
	return holder, true, nil
}

// sameProgram says the kernel shows process pid running the executable file this process runs
// (/proc/<pid>/exe, which only root and the process's own user may follow).
func sameProgram(pid int) bool {
	var self, other unix.Stat_t
	if unix.Stat("/proc/self/exe", &self) != nil || unix.Stat("/proc/"+strconv.Itoa(pid)+"/exe", &other) != nil {
		return false
	}
	return self.Dev == other.Dev && self.Ino == other.Ino
}

// printable says every text of the answer is one a line shows as it is: names of the tree's
// alphabet, and paths of printable UTF-8.
func (id Identity) printable() bool {
	for _, name := range []string{id.Cockpit, id.Stack, id.Key} {
		if strings.ContainsFunc(name, func(r rune) bool {
			return !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
		}) {
			return false
		}
	}
	for _, path := range []string{id.Data, id.Mount} {
		if !utf8.ValidString(path) || strings.ContainsFunc(path, func(r rune) bool { return r == '\\' || !unicode.IsPrint(r) }) {
			return false
		}
	}
	return true
}

// readIdentity reads the one-line answer of process pid, waiting at most answerTimeout for it,
// and not at all while it is silent (see quietFor).
func readIdentity(fd, pid int) (Identity, bool) {
	var line []byte
	buf := make([]byte, 1024)
	deadline := time.Now().Add(answerTimeout)
	if until, ok := silent.Load(pid); ok && until.(time.Time).After(time.Now()) {
		deadline = time.Now()
	} else if ok {
		silent.Delete(pid)
	}
	for len(line) < 64<<10 && !strings.Contains(string(line), "\n") {
		wait := max(time.Until(deadline), 0)
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int((wait+time.Millisecond-1)/time.Millisecond))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err == nil && n == 0 && wait > 0 {
			silent.Store(pid, time.Now().Add(quietFor))
		}
		if err != nil || n == 0 {
			return Identity{}, false
		}
		n, err = unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil || n <= 0 {
			break
		}
		line = append(line, buf[:n]...)
	}
	var id Identity
	if json.Unmarshal(line, &id) != nil || id.Daemon != daemonName {
		return Identity{}, false
	}
	return id, true
}

// Held lists the ports whose names are bound in this network namespace, in port order.
func (s Space) Held() ([]int, error) {
	bound, err := s.Bound()
	if err != nil {
		return nil, err
	}
	ports := make([]int, 0, len(bound))
	for port := range bound {
		ports = append(ports, port)
	}
	slices.Sort(ports)
	return ports, nil
}

// Bound maps each port held in this network namespace, under either name, to the inode of the
// socket bound to its name (the balanced name's, when both are bound), from the kernel's unix
// socket table (/proc/net/unix, readable by everyone). The inode names one socket for its life: a
// holder seen with the same inode is the same holder.
func (s Space) Bound() (map[int]string, error) {
	balanced, legacy, err := s.bound()
	if err != nil {
		return nil, err
	}
	for port, inode := range legacy {
		if _, ok := balanced[port]; !ok {
			balanced[port] = inode
		}
	}
	return balanced, nil
}

// bound maps each port whose balanced name is bound, and each whose legacy name is, to the inode
// of the socket bound to it. The table has a line per unix socket of the namespace — tens of
// thousands beside other daemons' holds — and is read at each listing of the machine's ports:
// it is read into a buffer the next read may reuse (until a collection frees it), and a line is
// split into fields only when it names the space, so a read leaves no garbage per line.
func (s Space) bound() (balanced, legacy map[int]string, err error) {
	table, _ := tables.Get().(*bytes.Buffer)
	if table == nil {
		table = new(bytes.Buffer)
	}
	defer tables.Put(table)
	// Read to the end: the kernel renders this table a page at a time, so a short read is not
	// its end (liveness.readProc's files are rendered whole at the first read; this one is not).
	table.Reset()
	file, err := os.Open("/proc/thread-self/net/unix")
	if err != nil {
		return nil, nil, err
	}
	_, err = table.ReadFrom(file)
	file.Close()
	if err != nil {
		return nil, nil, err
	}
	prefix := []byte("@" + string(s))
	balanced, legacy = map[int]string{}, map[int]string{}
	var f [8][]byte
	for rest := table.Bytes(); len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		// Num RefCount Protocol Flags Type St Inode Path. Connections queued on a listener show
		// its name too, connected (St 03); the bound socket itself is unconnected (01).
		if !bytes.Contains(line, prefix) || !fields(line, &f) || !bytes.HasPrefix(f[7], prefix) {
			continue
		}
		digits, balance, isBalanced := strings.Cut(string(f[7][len(prefix):]), "/")
		port, err := strconv.Atoi(digits)
		if err != nil || port < 0 || port > 65535 || strconv.Itoa(port) != digits {
			continue
		}
		into := legacy
		if isBalanced {
			if "/"+balance != s.name(port)[len(prefix)+len(digits):] {
				continue // not the name of any port: it holds nothing
			}
			into = balanced
		}
		if _, seen := into[port]; !seen || string(f[5]) == "01" {
			into[port] = string(f[6])
		}
	}
	return balanced, legacy, nil
}

// tables holds the buffers bound has read the kernel's table into.
var tables sync.Pool // of *bytes.Buffer

// fields splits line at runs of spaces into exactly len(f) fields, as strings.Fields would,
// without allocating; false when it has another number of fields.
func fields(line []byte, f *[8][]byte) bool {
	n := 0
	for len(line) > 0 {
		line = bytes.TrimLeft(line, " ")
		if len(line) == 0 {
			break
		}
		if n == len(f) {
			return false
		}
		end := bytes.IndexByte(line, ' ')
		if end < 0 {
			end = len(line)
		}
		f[n], line = line[:end], line[end:]
		n++
	}
	return n == len(f)
}

// owner finds the process with socket inode open, among those whose fds this process may read
// (all of them as root), and its uid; unknown when none is found. One scan of /proc serves every
// owner asked for within ownersFreshFor: names held by processes that do not listen cost one
// scan, not one per name.
func owner(inode string) Holder {
	if inode == "" {
		return Holder{}
	}
	owners.mu.Lock()
	defer owners.mu.Unlock()
	if h, ok := owners.byInode[inode]; ok && time.Since(owners.at) < ownersFreshFor {
		return h
	}
	owners.byInode, owners.at = scanSockets(), time.Now()
	return owners.byInode[inode]
}

// ownersFreshFor is how long a scan of /proc names the owners of the sockets it saw. A socket
// bound since is not in it, and makes the next owner scan again.
const ownersFreshFor = time.Second

var owners struct {
	mu      sync.Mutex
	at      time.Time
	byInode map[string]Holder // GUARDED_BY(mu)
}

// scanSockets maps the inode of every socket a process this one may read has open to that
// process (the first /proc lists, when several share it) and its uid.
func scanSockets() map[string]Holder {
	byInode := map[string]Holder{}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/"+p.Name(), &st) != nil {
			continue
		}
		fds, _ := os.ReadDir("/proc/" + p.Name() + "/fd")
		for _, fd := range fds {
			link, _ := os.Readlink("/proc/" + p.Name() + "/fd/" + fd.Name())
			if inode, ok := strings.CutPrefix(link, "socket:["); ok {
				inode = strings.TrimSuffix(inode, "]")
				if _, seen := byInode[inode]; !seen {
					byInode[inode] = Holder{PID: pid, UID: st.Uid, Known: true}
				}
			}
		}
	}
	return byInode
}

// name is the abstract name of port's hold (Go writes the leading NUL for "@"): the space, the
// port, "/" and a balance of ten characters that spreads the names over the kernel's hash table.
//
// Why the balance: the kernel finds an abstract name in one of 256 chains, chosen by the 16-bit
// ones' complement sum of the address (csum_partial of the family and the name, folded: both
// bytes of the sum xored, and the socket type; net/unix/af_unix.c, unix_abstract_hash). Names
// that differ only in a few decimal digits sum to a few dozen values — the legacy names of 20,000
// ports fill 32 chains — and every bind and connect walks its chain. The balance makes the sum of
// the whole address equal port mod 256 (in ones' complement arithmetic, mod 0xffff): both bytes
// xored are then port mod 256, so 256 consecutive ports use every chain once, and each chain
// holds the names of 256 of the 65,536 ports (TestNamesSpreadOverEveryChain). Characters
// 'A'+v (v ≤ 51, so A–t): the five at even offsets of the address add the low byte of what the sum lacks,
// the five at odd offsets its high byte, each spread evenly over its five.
func (s Space) name(port int) string {
	b := make([]byte, 0, 1+len(s)+6+balanceLen)
	b = append(b, '@')
	b = append(b, s...)
	b = strconv.AppendInt(b, int64(port), 10)
	b = append(b, '/')
	start := len(b)
	for range balanceLen {
		b = append(b, 'A')
	}
	// Byte i of b is byte i+2 of the address (after the two of the family, AF_UNIX little-endian);
	// the '@' stands for the NUL, which adds nothing. A byte at an even offset is a word's low byte.
	sum := uint32(unix.AF_UNIX)
	for i, c := range b[1:] {
		if (i+3)%2 == 0 {
			sum += uint32(c)
		} else {
			sum += uint32(c) << 8
		}
	}
	lack := (uint32(port&0xff) + 0xffff - sum%0xffff) % 0xffff
	// The balance's characters alternate between the two bytes: the j-th is the j/2-th of its byte's five.
	for j := range balanceLen {
		add := lack & 0xff
		if (start+j+2)%2 == 1 {
			add = lack >> 8
		}
		v := add / (balanceLen / 2)
		if uint32(j/2) < add%(balanceLen/2) {
			v++
		}
		b[start+j] += byte(v)
	}
	return string(b)
}

// balanceLen is the length of a name's balance: five characters of 0–51 each cover a byte's 0–255.
const balanceLen = 10

// legacyName is the name daemons held before the balanced names: the space and the port.
func (s Space) legacyName(port int) string {
	return "@" + string(s) + strconv.Itoa(port)
}
