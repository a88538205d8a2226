// Package portlock holds TCP port numbers for a cockpitfs daemon, machine-wide, with the kernel as
// the lock manager.
//
// Why a socket and not a store or a file: several daemons (any uid, any data directory) may run on
// one machine, and each must never lease a port another one leases. A port is held by binding the
// abstract unix socket name "cockpitfs/port/<n>": the kernel lets exactly one socket bind a name,
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
// The package binds, releases and asks; whether a family may be leased is the engine's rule.
package portlock

import (
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
	s := fmt.Sprintf("the cockpitfs daemon %s (data %s", who, h.Identity.Data)
	if h.Identity.Stack != "" {
		s += ", lease " + h.Identity.Cockpit + "/" + h.Identity.Stack
	}
	return s + ")"
}

// Hold is one port held by this process until Release.
type Hold struct {
	fd int
}

// Take holds port, answering id to whoever asks. It returns ErrHeld when another socket holds it.
// It is three system calls and the registration with the process's one answering loop: a new
// lease pays for its holds. The answer is encoded at the first ask, not here: most holds are
// never asked.
func (s Space) Take(port int, id Identity) (*Hold, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("holding port %d: %w", port, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: s.name(port)}); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EADDRINUSE) {
			return nil, fmt.Errorf("port %d: %w", port, ErrHeld)
		}
		return nil, fmt.Errorf("holding port %d: %w", port, err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("holding port %d: %w", port, err)
	}
	id.Daemon, id.Port = daemonName, port
	if err := answers.add(fd, &answer{id: id}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("holding port %d: %w", port, err)
	}
	return &Hold{fd: fd}, nil
}

// Release lets the port go: no asker is answered from it afterwards.
func (h *Hold) Release() {
	answers.remove(h.fd)
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

// Ask says who holds port; ok is false when nobody does. It never blocks longer than
// answerTimeout: the connect is non-blocking (a holder that never accepts fills its backlog).
func (s Space) Ask(port int) (holder Holder, ok bool, err error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return Holder{}, false, err
	}
	defer unix.Close(fd)
	switch err := unix.Connect(fd, &unix.SockaddrUnix{Name: s.name(port)}); {
	case errors.Is(err, unix.ECONNREFUSED), errors.Is(err, unix.EAGAIN):
		// Bound but not listening, or not accepting: held by something that will not say, so
		// look for it in the kernel's tables.
		inode, bound := s.inode(port)
		if !bound {
			return Holder{}, false, nil
		}
		return owner(inode), true, nil
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

// Bound maps each port whose name is bound in this network namespace to the inode of the socket
// bound to it, from the kernel's unix socket table (/proc/net/unix, readable by everyone). The
// inode names one socket for its life: a holder seen with the same inode is the same holder.
func (s Space) Bound() (map[int]string, error) {
	data, err := os.ReadFile("/proc/thread-self/net/unix")
	if err != nil {
		return nil, err
	}
	prefix := "@" + string(s)
	bound := map[int]string{}
	for _, line := range strings.Split(string(data), "\n") {
		// Num RefCount Protocol Flags Type St Inode Path. Connections queued on a listener show
		// its name too, connected (St 03); the bound socket itself is unconnected (01).
		f := strings.Fields(line)
		if len(f) != 8 || !strings.HasPrefix(f[7], prefix) {
			continue
		}
		port, err := strconv.Atoi(strings.TrimPrefix(f[7], prefix))
		if err != nil {
			continue
		}
		if _, seen := bound[port]; !seen || f[5] == "01" {
			bound[port] = f[6]
		}
	}
	return bound, nil
}

// inode is the socket inode bound to port's name ("" when it cannot be told), and whether the name
// is bound at all.
func (s Space) inode(port int) (string, bool) {
	bound, err := s.Bound()
	if err != nil {
		return "", true // cannot tell: the connect was refused by something there
	}
	inode, ok := bound[port]
	return inode, ok
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

// name is the abstract name of port (Go writes the leading NUL for "@").
func (s Space) name(port int) string {
	return "@" + string(s) + strconv.Itoa(port)
}
