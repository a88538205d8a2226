package liveness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ProcessOf resolves a thread id (what FUSE reports as the caller) to its process id.
func ProcessOf(tid int) (int, error) {
	if tid > 0 {
		if pid, ok := threadGroups.get(tid); ok && inThreadGroup(pid, tid) {
			return pid, nil
		}
		if isProcess(tid) {
			return tid, nil
		}
		if pid, ok := threadGroupOf(tid); ok {
			threadGroups.put(tid, pid)
			return pid, nil
		}
	}
	status, err := readProc(procFile(tid, "status"))
	if err != nil {
		return 0, fmt.Errorf("process of thread %d: %w", tid, err)
	}
	pid, ok := parseTgid(string(status))
	if !ok {
		return 0, fmt.Errorf("process of thread %d: /proc/%d/status has no recognisable Tgid line", tid, tid)
	}
	if pid != tid {
		threadGroups.put(tid, pid)
	}
	return pid, nil
}

// threadGroups are the processes of threads that called before, hints only: inThreadGroup
// confirms one in a syscall, where finding it again takes three (pidfd_open, its information,
// close). A Go or Java client calls from many threads; a thread id reused by another process
// fails the check and is found again. Bounded: any one hint goes when it is full.
var threadGroups = threadGroupHints{m: map[int]int{}}

const maxThreadGroupHints = 256

type threadGroupHints struct {
	mu sync.Mutex  // guards m; a leaf
	m  map[int]int // thread id → process id
}

func (h *threadGroupHints) get(tid int) (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	pid, ok := h.m[tid]
	return pid, ok
}

func (h *threadGroupHints) put(tid, pid int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.m[tid]; !ok && len(h.m) >= maxThreadGroupHints {
		for other := range h.m {
			delete(h.m, other)
			break
		}
	}
	h.m[tid] = pid
}

// maxAncestry bounds the walk up the process tree; pid_max is 4 Mi but real trees are shallow.
const maxAncestry = 4096

// SessionHolder returns the process that stands for pid's session: its leader when the leader is
// visible and alive; otherwise (the leader is in another pid namespace, or exited and left its
// session's processes behind) the outermost ancestor of pid still in the same session, so the
// holder lives as long as what remains of the session rather than as long as one short command.
// A process found on the session id's pid is the leader itself: the kernel keeps that pid from
// being reused while any process of the session lives.
func SessionHolder(pid int) (int, error) {
	holder, _, _, err := sessionHolder(pid)
	return holder, err
}

// ObserveSessionHolder is SessionHolder with the holder's observation, as Observe reports it: the
// start is the one read while finding the holder, so its stat is not read a second time; its
// presence is probed as Observe probes it, or, for a session leader known from an earlier call,
// by the pidfd kept of it.
func ObserveSessionHolder(pid int) (int, Observation, error) {
	// A session leader held and running is the holder, whatever else pid's stat says: getsid
	// asks for the session alone, one syscall where reading the stat is three.
	if session, err := unix.Getsid(pid); err == nil && session > 0 {
		if start, held := leaders.running(session); held {
			return presentWith(session, start)
		}
	}
	holder, fields, held, err := sessionHolder(pid)
	if err != nil {
		return 0, Observation{}, err
	}
	if !held {
		switch presence(holder) {
		case probeGone:
			return holder, Observation{State: Absent}, nil
		case probeUnsure:
			return holder, unknown("the presence of process %d could not be confirmed", holder), nil
		}
	}
	return presentWith(holder, fields.startTicks)
}

// presentWith is the observation of holder as present, started at start (its stat's start ticks).
func presentWith(holder int, start string) (int, Observation, error) {
	bootID, err := currentBootID()
	if err != nil {
		return holder, unknown("%v", err), nil
	}
	return holder, Observation{State: Present, Start: "proc:" + bootID + ":" + start}, nil
}

// sessionHolder is SessionHolder with the holder's stat fields, as read while finding it; held
// says the holder is a session leader whose pidfd just showed it running (only its start is
// then known).
func sessionHolder(pid int) (holder int, fields statFields, held bool, err error) {
	own, err := readStat(pid)
	if err != nil {
		return 0, statFields{}, false, fmt.Errorf("session of process %d: %w", pid, err)
	}
	if own.session > 0 {
		if start, ok := leaders.running(own.session); ok {
			return own.session, statFields{session: own.session, startTicks: start}, true, nil
		}
		if leader, err := readStat(own.session); err == nil && leader.session == own.session {
			leaders.remember(own.session, leader.startTicks)
			return own.session, leader, false, nil
		}
	}
	holder, fields, parent := pid, own, own.ppid
	for range maxAncestry {
		if parent <= 0 {
			break
		}
		next, err := readStat(parent)
		if err != nil || next.session != own.session {
			break
		}
		holder, fields, parent = parent, next, next.ppid
	}
	return holder, fields, false, nil
}

// leaders are session leaders found before, each with a pidfd and its start. A running process
// keeps its pid and its start, and a session leader its session (setsid refuses it), so while the
// pidfd's process runs, a claim from its session need not read the leader's stat: one
// pidfd_send_signal replaces a read and Observe's two kill(0). An exited leader goes at its next
// lookup; the set is bounded, each entry holding a descriptor.
var leaders = leaderSet{m: map[int]heldLeader{}}

const maxLeaders = 64

type leaderSet struct {
	mu sync.Mutex // guards m and is held across the pidfd calls on its entries; a leaf
	m  map[int]heldLeader
}

type heldLeader struct {
	fd    int
	start string // startTicks
}

// running is the start of leader pid, held and still running.
func (s *leaderSet) running(pid int) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.m[pid]
	if !ok {
		return "", false
	}
	if !stillRunning(l.fd) {
		closeProcess(l.fd)
		delete(s.m, pid)
		return "", false
	}
	return l.start, true
}

// remember holds leader pid, whose stat read start as its start. The pidfd is taken after that
// read, so the stat is read again through it being held: a pid reused in between would show
// another start, and is not kept.
func (s *leaderSet) remember(pid int, start string) {
	fd, ok := openProcess(pid)
	if !ok {
		return
	}
	if again, err := readStat(pid); err != nil || again.startTicks != start || again.session != pid {
		closeProcess(fd)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.m[pid]; ok {
		closeProcess(old.fd)
		delete(s.m, pid)
	}
	if len(s.m) >= maxLeaders {
		for other, l := range s.m { // any one: a session that claims again is read again once
			closeProcess(l.fd)
			delete(s.m, other)
			break
		}
	}
	s.m[pid] = heldLeader{fd: fd, start: start}
}

func readStat(pid int) (statFields, error) {
	if pid <= 0 {
		return statFields{}, fmt.Errorf("no process %d", pid)
	}
	stat, err := readProc(procFile(pid, "stat"))
	if err != nil {
		return statFields{}, err
	}
	fields, ok := parseStat(string(stat))
	if !ok {
		return statFields{}, fmt.Errorf("/proc/%d/stat is unrecognised", pid)
	}
	return fields, nil
}

// readProc reads a process's stat or status file with open, read and close alone. os.ReadFile
// also offers the descriptor to the poller (four fcntl and an epoll_ctl, refused for /proc),
// fstats it and reads again for the end: ten syscalls instead of three, and a claim reads several
// such files. The kernel renders these files whole at the first read (seq_file's single_open), so
// a read that does not fill the buffer has read to the end.
func readProc(path string) ([]byte, error) { return readProcFrom(path, 4096) }

// readProcFrom is readProc starting with a buffer of size bytes, doubled while reads fill it.
func readProcFrom(path string, size int) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	for err == unix.EINTR {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, size)
	for {
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		buf = buf[:len(buf)+n]
		if len(buf) < cap(buf) {
			return buf, nil
		}
		buf = slices.Grow(buf, cap(buf))
	}
}

// RunningStart is when process pid started, in clock ticks since boot, while it runs; "" once it
// has exited: when it is gone, or a zombie nobody has reaped yet.
func RunningStart(pid int) string {
	stat, err := readProc(procFile(pid, "stat"))
	if err != nil {
		return ""
	}
	var fields [20]string // index 0 is the state, 19 the start time (see parseStat)
	if !statFieldsAfterName(string(stat), fields[:]) || fields[0] == "Z" {
		return ""
	}
	return fields[19]
}

// Cwd returns the process's working directory. A directory removed since reads with the kernel's
// " (deleted)" suffix.
func Cwd(pid int) (string, error) {
	dir, err := os.Readlink(procFile(pid, "cwd"))
	if err != nil {
		return "", fmt.Errorf("working directory of process %d: %w", pid, err)
	}
	return dir, nil
}

type statFields struct {
	ppid       int
	session    int
	startTicks string // kept as text: up to 20 digits, compared, never computed with
}

// digits says s is 1 to most decimal digits: a check every claim makes of several stat fields,
// without a regexp.
func digits(s string, most int) bool {
	if len(s) == 0 || len(s) > most {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// statFieldsAfterName fills fields with the fields of /proc/<pid>/stat that follow the command
// name, the one reading of that line: the name, in parentheses, may itself hold spaces,
// parentheses and newlines, so the fields start after the last ')', where index 0 is field 3
// (state). Only as many fields as asked for are split; false if the line has fewer.
func statFieldsAfterName(text string, fields []string) bool {
	end := strings.LastIndexByte(text, ')')
	if end < 0 || !strings.HasPrefix(text[end+1:], " ") {
		return false
	}
	rest := strings.TrimSuffix(text[end+2:], "\n")
	for i := range fields {
		field, after, more := strings.Cut(rest, " ")
		if !more && i < len(fields)-1 {
			return false
		}
		fields[i], rest = field, after
	}
	return true
}

// parseStat reads the fields of /proc/<pid>/stat a process's identity needs: field 4 (ppid,
// index 1), field 6 (session, index 3) and field 22 (start time, index 19).
func parseStat(text string) (statFields, bool) {
	var fields [20]string
	if !statFieldsAfterName(text, fields[:]) {
		return statFields{}, false
	}
	if !digits(fields[1], 10) || !digits(fields[3], 10) || !digits(fields[19], 20) {
		return statFields{}, false
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil || ppid > maxPid {
		return statFields{}, false
	}
	session, err := strconv.Atoi(fields[3])
	if err != nil || session > maxPid {
		return statFields{}, false
	}
	return statFields{ppid: ppid, session: session, startTicks: fields[19]}, true
}

// isBootID says s is a boot ID as the kernel prints it: a UUID in lower-case hex, 8-4-4-4-12.
// Checked by hand, not by a regexp: every commit checks its new holder's start, which holds one,
// and cold, the regexp's match cost a claim through the mount tens of microseconds.
func isBootID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// procFile is /proc/<pid>/<name>. Not by fmt: a claim reads several, and a cold Sprintf costs
// more than the concatenation.
func procFile(pid int, name string) string { return "/proc/" + strconv.Itoa(pid) + "/" + name }

// parseBootID reads /proc/sys/kernel/random/boot_id, which ends in a newline.
func parseBootID(text string) (string, bool) {
	id := strings.TrimSpace(text)
	return id, isBootID(id)
}

// parseTgid finds the process id in /proc/<tid>/status.
func parseTgid(text string) (int, bool) {
	for line := range strings.Lines(text) {
		value, found := strings.CutPrefix(line, "Tgid:")
		if !found {
			continue
		}
		value = strings.TrimSpace(value)
		if !digits(value, 10) {
			return 0, false
		}
		pid, err := strconv.Atoi(value)
		if err != nil || pid < 1 || pid > maxPid {
			return 0, false
		}
		return pid, true
	}
	return 0, false
}

// Groups returns process pid's supplementary groups, as /proc/<pid>/status lists them.
func Groups(pid int) ([]uint32, error) {
	status, err := readProc(procFile(pid, "status"))
	if err != nil {
		return nil, err
	}
	return parseGroups(string(status)), nil
}

// parseGroups reads the Groups line of /proc/<pid>/status; a field that is no gid is skipped.
func parseGroups(text string) []uint32 {
	var groups []uint32
	for line := range strings.Lines(text) {
		if rest, ok := strings.CutPrefix(line, "Groups:"); ok {
			for _, f := range strings.Fields(rest) {
				if g, err := strconv.ParseUint(f, 10, 32); err == nil {
					groups = append(groups, uint32(g))
				}
			}
		}
	}
	return groups
}

var psLstart = regexp.MustCompile(`^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +([0-9]{1,2}) ([0-9]{2}):([0-9]{2}):([0-9]{2}) ([0-9]{4})$`)

// parseLstart turns what `ps -o lstart=` prints under LC_ALL=C TZ=UTC0 ("Sun Nov 29 19:00:00
// 2026") into an lstart identity. The weekday is not checked against the date; a date or time
// that does not exist (Feb 30, 24:00) is refused rather than rolled over.
func parseLstart(text string) (string, bool) {
	m := psLstart.FindStringSubmatch(strings.TrimSpace(text))
	if m == nil {
		return "", false
	}
	t, err := time.Parse("Jan 2 15:04:05 2006", fmt.Sprintf("%s %s %s:%s:%s %s", m[1], m[2], m[3], m[4], m[5], m[6]))
	if err != nil {
		return "", false
	}
	return "lstart:" + t.Format(isoMillis), true
}

// psStart runs `ps -o lstart= -p <pid>` under a fixed locale and zone, bounded in time.
func psStart(pid int) (string, error) {
	ps := ""
	for _, candidate := range psPaths {
		if info, err := os.Stat(candidate); err == nil && info.Mode().IsRegular() {
			ps = candidate
			break
		}
	}
	if ps == "" {
		return "", fmt.Errorf("ps is not installed at %s", strings.Join(psPaths, " or "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), psTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, ps, "-o", "lstart=", "-p", strconv.Itoa(pid))
	cmd.Env = []string{"LC_ALL=C", "TZ=UTC0"}
	cmd.Dir = "/"
	cmd.WaitDelay = time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("ps timed out after %v", psTimeout)
		}
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return "", fmt.Errorf("ps exited %d: %s", exit.ExitCode(), strings.TrimSpace(stderr.String()))
		}
		return "", err
	}
	return string(out), nil
}

// Signalable reports whether a process of uid may signal pid (kill(2)'s rule: root, or uid is
// the target's real or saved uid). A process that is gone or unreadable is not.
func Signalable(uid uint32, pid int) bool {
	if uid == 0 {
		return true
	}
	status, err := readProc(procFile(pid, "status"))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			ids := strings.Fields(rest) // real, effective, saved, filesystem
			want := strconv.FormatUint(uint64(uid), 10)
			return len(ids) >= 3 && (ids[0] == want || ids[2] == want)
		}
	}
	return false
}

// pfExiting is the kernel's PF_EXITING task flag (include/linux/sched.h): the task is in do_exit.
const pfExiting = 0x4

// KilledBy says whether thread tid is exiting because a signal killed it, and which: the kernel
// sets an exiting task's exit code (the signal's number in its low 7 bits, or the exit status
// shifted left by 8) before it closes the task's files, so a FUSE FLUSH sent by that close sees
// it in /proc/<tid>/stat (field 9, the flags, and field 52, the exit code). The exit code reads
// 0 to a reader without ptrace access to the task (another user's, for a daemon that is not
// root): then, as for any task not exiting, false.
func KilledBy(tid int) (unix.Signal, bool) {
	stat, err := readProc(procFile(tid, "stat"))
	if err != nil {
		return 0, false
	}
	return parseKilledBy(string(stat))
}

// parseKilledBy reads KilledBy's answer from a /proc/<tid>/stat line: the flags (field 9) are
// index 6 after the name, the exit code (field 52, the last) index 49.
func parseKilledBy(text string) (unix.Signal, bool) {
	var fields [50]string
	if !statFieldsAfterName(text, fields[:]) {
		return 0, false
	}
	flags, err := strconv.ParseUint(fields[6], 10, 64)
	if err != nil || flags&pfExiting == 0 {
		return 0, false
	}
	code, err := strconv.Atoi(fields[49])
	if err != nil || code&0x7f == 0 {
		return 0, false
	}
	return unix.Signal(code & 0x7f), true
}

// HoldsOpen says whether thread tid's process has a descriptor open on path, as the links of
// /proc/<tid>/fd name their files (a readlink: no request to the file's own file system).
func HoldsOpen(tid int, path string) bool { return holdsOpen(tid, path, false) }

// HoldsOpenForWriting is HoldsOpen counting only descriptors open for writing, by the access
// mode /proc/<tid>/fdinfo shows: a duplicate of a write open is one, a read of the same file
// beside it (`with open(p) as r: … open(p, "w")`) is not.
func HoldsOpenForWriting(tid int, path string) bool { return holdsOpen(tid, path, true) }

func holdsOpen(tid int, path string, writing bool) bool {
	dir := procFile(tid, "fd")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if link, err := os.Readlink(dir + "/" + e.Name()); err != nil || link != path {
			continue
		}
		if !writing {
			return true
		}
		info, err := readProc(procFile(tid, "fdinfo/"+e.Name()))
		if err != nil {
			continue // closed since
		}
		if flags, ok := parseFdinfoFlags(string(info)); ok && flags&unix.O_ACCMODE != unix.O_RDONLY {
			return true
		}
	}
	return false
}

// Name is process pid's name as the kernel keeps it (comm: its executable's base name, or what it
// set, up to 15 bytes), as ps shows it without -f; "" when it cannot be read. It is a field of the
// task, printed without a look at the process's memory: unlike its command line, no process can
// make reading it wait.
func Name(pid int) string {
	data, err := readProc(procFile(pid, "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

// parseFdinfoFlags reads the flags of a /proc/<pid>/fdinfo/<fd> file: its "flags:" line, octal.
func parseFdinfoFlags(text string) (int, bool) {
	for line := range strings.Lines(text) {
		if value, found := strings.CutPrefix(line, "flags:"); found {
			flags, err := strconv.ParseUint(strings.TrimSpace(value), 8, 32)
			return int(flags), err == nil
		}
	}
	return 0, false
}
