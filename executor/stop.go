// Package executor is cockpitfs's built-in drain executor: the side effects the engine's pure drain
// steps leave to an executor, done by the daemon itself. It stops what a stack runs (the stop
// step: the processes listening on its leased ports and its holders' process groups), drains
// stale stacks (every holder dead or pid-less, every checkout gone: gc) and sweeps for them
// periodically. Every drain goes through the engine's use cases (reserve, start, outcome), so it
// is fenced and recorded as any executor's.
package executor

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine/listeners"
	"github.com/cockpitfs/cockpitfs/engine/liveness"
)

// Target is one process the stop step signals, and why it is the stack's.
type Target struct {
	PID     int
	UID     uint32 // its real uid
	Command string // its comm
	Why     []string
	// Kept says why the process, though the stack's, is never signalled ("": it may be).
	Kept  string
	start string // its start ticks when found: a pid reused since is not signalled
}

// Stopped is what the stop step did to one target.
type Stopped struct {
	Target
	// Result is "terminated" (it ended after SIGTERM), "killed" (after SIGKILL), "gone" (it ended
	// before any signal), "not signalled" (a requester may not signal it: Errno says why), "not
	// signalled: <why>" (it runs another stack too) or "survived SIGKILL".
	Result string
	Errno  string
	// DeniedTo is, with Errno EPERM, the requester that may not signal it.
	DeniedTo uint32
}

// String names the process and what became of it, for an events line.
func (s Stopped) String() string {
	text := fmt.Sprintf("%d %s (uid %d, %s): %s", s.PID, s.Command, s.UID, strings.Join(s.Why, ", "), s.Result)
	if s.Errno != "" {
		text += " (" + s.Errno + ")"
	}
	return text
}

// procStat is what the stop step reads of /proc/<pid>/stat.
type procStat struct {
	comm          string
	pgrp, session int
	start         string
}

// readStat reads /proc/<pid>/stat: the command name is in parentheses and may hold anything, so
// the fields are read after the last ')'; there index 0 is field 3 (state), field 5 (pgrp) index
// 2, field 6 (session) index 3 and field 22 (start time) index 19.
func readStat(pid int) (procStat, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	text := string(data)
	open, end := strings.IndexByte(text, '('), strings.LastIndexByte(text, ')')
	if open < 0 || end < open {
		return procStat{}, false
	}
	fields := strings.Fields(text[end+1:])
	if len(fields) < 20 {
		return procStat{}, false
	}
	pgrp, err1 := strconv.Atoi(fields[2])
	session, err2 := strconv.Atoi(fields[3])
	if err1 != nil || err2 != nil {
		return procStat{}, false
	}
	return procStat{comm: text[open+1 : end], pgrp: pgrp, session: session, start: fields[19]}, true
}

// realUID is the real uid of pid, from /proc/<pid>/status.
func realUID(pid int) (uint32, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				uid, err := strconv.ParseUint(f[0], 10, 32)
				return uint32(uid), err == nil
			}
		}
	}
	return 0, false
}

// listeningSocket is a TCP socket in LISTEN state on a wanted port.
type listeningSocket struct {
	port int
	uid  uint32 // the socket's owner, as the table says
}

// listeningSockets maps the inode of every listening TCP socket (IPv4 and IPv6) on one of ports
// to its port and owner (listeners.Sockets: never a client connected to the port).
func listeningSockets(ports []int) (map[string]listeningSocket, error) {
	sockets, err := listeners.Sockets(func(port int) bool { return slices.Contains(ports, port) })
	if err != nil {
		return nil, err
	}
	found := make(map[string]listeningSocket, len(sockets))
	for _, s := range sockets {
		found[s.Inode] = listeningSocket{port: s.Port, uid: s.UID}
	}
	return found, nil
}

// Group is a holder's process group, as Find looks for its members.
type Group struct {
	Holder string
	// Session, when not 0, is the session a member must be in: the one a dead holder led, so a
	// group whose id was the holder's pid but that a process reusing the pid made is not taken.
	Session int
}

// Find names the processes a stack runs: each process with a listening socket on one of ports
// (a daemonized server that leads its own session too), and each member of the process groups
// groups names (by process group id) but their session leaders (a terminal's shell, an agent's
// session: ending one closes the terminal); never a process exclude names. A process that also
// listens on a port of another stack's lease (others: port → its stack) runs that stack too: it
// is named, Kept saying why, and never signalled. A listening socket on one of ports whose
// process the daemon may not see (another user's, for a daemon that is not root) is a Target
// with PID 0, its uid the socket's.
func Find(ports []int, others map[int]string, groups map[int]Group, exclude map[int]bool) ([]Target, error) {
	sockets := map[string]listeningSocket{}
	if len(ports)+len(others) > 0 {
		var err error
		if sockets, err = listeningSockets(append(slices.Clone(ports), slices.Collect(maps.Keys(others))...)); err != nil {
			return nil, err
		}
	}
	seen := map[string]bool{}
	var out []Target
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 || exclude[pid] {
			continue
		}
		st, ok := readStat(pid)
		if !ok {
			continue // gone
		}
		var why []string
		if g, ok := groups[st.pgrp]; ok && st.session != pid && (g.Session == 0 || g.Session == st.session) {
			why = append(why, "in the process group of holder "+g.Holder)
		}
		var own, foreign []int
		if len(sockets) > 0 {
			fds, _ := os.ReadDir("/proc/" + e.Name() + "/fd")
			for _, fd := range fds {
				link, _ := os.Readlink("/proc/" + e.Name() + "/fd/" + fd.Name())
				inode, ok := strings.CutPrefix(link, "socket:[")
				inode = strings.TrimSuffix(inode, "]")
				s, listens := sockets[inode]
				switch {
				case !ok || !listens:
				case others[s.port] != "":
					foreign = appendPort(foreign, s.port)
				default:
					seen[inode] = true
					own = appendPort(own, s.port)
				}
			}
		}
		for _, p := range own {
			why = append(why, "listens on port "+strconv.Itoa(p))
		}
		if len(why) == 0 {
			continue
		}
		t := Target{PID: pid, Command: st.comm, Why: why, start: st.start}
		t.UID, _ = realUID(pid)
		if len(foreign) > 0 {
			t.Kept = fmt.Sprintf("it also listens on port %d of %s", foreign[0], others[foreign[0]])
		}
		out = append(out, t)
	}
	for inode, s := range sockets {
		if !seen[inode] && others[s.port] == "" {
			out = append(out, Target{UID: s.uid, Why: []string{"listens on port " + strconv.Itoa(s.port)}})
		}
	}
	slices.SortFunc(out, func(a, b Target) int { return a.PID - b.PID })
	return out, nil
}

// appendPort adds port to ports once, in order.
func appendPort(ports []int, port int) []int {
	if i, found := slices.BinarySearch(ports, port); !found {
		return slices.Insert(ports, i, port)
	}
	return ports
}

// killWait bounds the wait for a process to end after SIGKILL: only one in uninterruptible sleep
// (a hung disk or FUSE request) outlasts it.
const killWait = 2 * time.Second

// Stop ends targets as a process of each uid of requesters may (kill(2)'s rule: its own, or any
// for root): SIGTERM, then SIGKILL to those still running after grace. A target one of the
// requesters may not signal, or that the daemon cannot see, is not signalled. Each process is
// signalled through a pidfd opened while its start was the one Find saw, so a pid reused
// meanwhile is never signalled.
func Stop(targets []Target, requesters []uint32, grace time.Duration) []Stopped {
	out := make([]Stopped, len(targets))
	pidfds := make([]int, len(targets))
	for i, t := range targets {
		out[i], pidfds[i] = Stopped{Target: t}, -1
		if t.Kept != "" {
			out[i].Result = "not signalled: " + t.Kept
			continue
		}
		if denied, ok := deniedTo(t, requesters); ok {
			out[i].Result, out[i].Errno, out[i].DeniedTo = "not signalled", "EPERM", denied
			continue
		}
		fd, err := unix.PidfdOpen(t.PID, 0)
		if st, ok := readStat(t.PID); err != nil || !ok || st.start != t.start {
			if err == nil {
				unix.Close(fd)
			}
			out[i].Result = "gone"
			continue
		}
		if err := unix.PidfdSendSignal(fd, unix.SIGTERM, nil, 0); err != nil {
			unix.Close(fd)
			out[i].Result, out[i].Errno = "not signalled", errnoName(err)
			continue
		}
		pidfds[i], out[i].Result = fd, "terminated"
	}
	waitExit(pidfds, time.Now().Add(grace))
	for i, fd := range pidfds {
		if fd >= 0 {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			out[i].Result = "killed"
		}
	}
	waitExit(pidfds, time.Now().Add(killWait))
	for i, fd := range pidfds {
		if fd >= 0 {
			unix.Close(fd)
			out[i].Result = "survived SIGKILL"
		}
	}
	return out
}

// deniedTo is the first of requesters that may not signal t, if any. A process the daemon cannot
// see is signalled by none: the one named is then the first requester that is neither root nor
// its socket's uid, or else the first.
func deniedTo(t Target, requesters []uint32) (uint32, bool) {
	if len(requesters) == 0 {
		return 0, true // a stop acting for no one signals nothing
	}
	for _, uid := range requesters {
		if t.PID == 0 && uid != 0 && uid != t.UID || t.PID != 0 && !liveness.Signalable(uid, t.PID) {
			return uid, true
		}
	}
	if t.PID == 0 {
		return requesters[0], true
	}
	return 0, false
}

// waitExit waits until each pidfd's process has ended, or deadline; each that has is closed and
// set to -1. A pidfd polls readable once its process has exited.
func waitExit(pidfds []int, deadline time.Time) {
	for {
		var polled []unix.PollFd
		var index []int
		for i, fd := range pidfds {
			if fd >= 0 {
				polled = append(polled, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
				index = append(index, i)
			}
		}
		left := time.Until(deadline)
		if len(polled) == 0 || left <= 0 {
			return
		}
		n, err := unix.Poll(polled, int(min(left, time.Second)/time.Millisecond)+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		for j := 0; n > 0 && j < len(polled); j++ {
			if polled[j].Revents != 0 {
				unix.Close(pidfds[index[j]])
				pidfds[index[j]] = -1
			}
		}
	}
}

// errnoName is err's errno as C spells it (EPERM), or its text.
func errnoName(err error) string {
	var errno unix.Errno
	if errors.As(err, &errno) {
		if name := unix.ErrnoName(errno); name != "" {
			return name
		}
	}
	return err.Error()
}
