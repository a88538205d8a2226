// Package liveness tells whether a process still exists and which process a pid names, so a holder
// whose session died, or whose pid now belongs to a stranger, can be found dead (SPEC §5). A
// process's start identity is read from /proc on Linux and from ps elsewhere; anything that cannot
// be confirmed reads as Unknown, and Unknown is never dead. It also resolves the facts the
// filesystem needs about a caller: its process, its session leader and its working directory.
package liveness

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// State is what an observation could establish about a pid.
type State int

const (
	Unknown State = iota // could not be confirmed; unknown is never dead
	Absent               // no such process
	Present              // exists, with Start
)

// Observation is one reading of a pid.
type Observation struct {
	State  State
	Start  string // Present only: "proc:<boot id>:<start ticks>" on Linux, "lstart:<YYYY-MM-DDTHH:MM:SS.000Z>" elsewhere
	Reason string // Unknown only: why
}

const maxPid = 2147483647

// ValidPID reports whether pid is in the range of process ids (1 to 2^31-1), the one check of it.
func ValidPID(pid int) bool { return pid >= 1 && pid <= maxPid }

// Observe reports whether pid exists and, if it does, its start identity. A session leader a
// claim found is known by its pidfd while it runs (see leaders): its start is not read again.
func Observe(pid int) Observation {
	if !ValidPID(pid) {
		return unknown("process id %d is invalid", pid)
	}
	if start, held := leaders.running(pid); held {
		if bootID, err := currentBootID(); err == nil {
			return Observation{State: Present, Start: "proc:" + bootID + ":" + start}
		}
	}
	switch presence(pid) {
	case probeGone:
		return Observation{State: Absent}
	case probeUnsure:
		return unknown("the presence of process %d could not be confirmed", pid)
	}
	if runtime.GOOS == "linux" {
		return observeProc(pid)
	}
	return observeLstart(pid)
}

func unknown(format string, args ...any) Observation {
	return Observation{State: Unknown, Reason: fmt.Sprintf(format, args...)}
}

type probe int

const (
	probeUnsure probe = iota
	probeLive
	probeGone
)

// presence asks twice, so an answer that flips between the two reads as unsure.
func presence(pid int) probe {
	first := classifySignal(unix.Kill(pid, 0))
	second := classifySignal(unix.Kill(pid, 0))
	if first != second {
		return probeUnsure
	}
	return first
}

// classifySignal reads the result of a signal-0 probe. EPERM means the process exists but belongs
// to another user: treating it as dead has deleted other people's data.
func classifySignal(err error) probe {
	switch {
	case err == nil, errors.Is(err, unix.EPERM):
		return probeLive
	case errors.Is(err, unix.ESRCH):
		return probeGone
	default:
		return probeUnsure
	}
}

// observeProc reads the Linux identity: the start in clock ticks since boot, with the boot's ID.
// ps's wall-clock start is derived from the boot time, which moves whenever the clock is stepped
// (NTP, a resumed VM), so a running process would read as a stranger.
func observeProc(pid int) Observation {
	stat, err := readProc(procFile(pid, "stat"))
	if err != nil {
		// Signal 0 just found it, so a missing entry means it exited since, unless this /proc is
		// not this pid namespace's (a chroot or sandbox); only a second probe decides.
		if errors.Is(err, fs.ErrNotExist) && presence(pid) == probeGone {
			return Observation{State: Absent}
		}
		return unknown("/proc/%d/stat could not be read (%v)", pid, err)
	}
	bootID, err := currentBootID()
	if err != nil {
		return unknown("%v", err)
	}
	fields, statOK := parseStat(string(stat))
	if !statOK {
		return unknown("/proc reported an unrecognised start for process %d", pid)
	}
	return Observation{State: Present, Start: "proc:" + bootID + ":" + fields.startTicks}
}

// bootID is read once: it names this boot, so it cannot change while we run, and every
// observation would otherwise read it again. Its mutex guards id and is held across the read (a
// leaf of engine's LOCK ORDERING).
var bootID struct {
	sync.Mutex
	id string
}

// TestBootIDEnv names a boot id that replaces this machine's, for tests only: it makes a daemon
// act as another machine's (two daemons on one test machine then share an etcd prefix as two
// machines would). Nothing but a test sets it.
const TestBootIDEnv = "COCKPITFS_TEST_BOOT_ID"

// BootID names this boot of this machine.
func BootID() (string, error) { return currentBootID() }

// BootOf returns the boot a Linux start identity, proc:<boot ID>:<start ticks>, names (ok=false
// for any other identity).
func BootOf(start string) (string, bool) {
	rest, ok := strings.CutPrefix(start, "proc:")
	if !ok {
		return "", false
	}
	boot, ticks, ok := strings.Cut(rest, ":")
	if !ok || !isBootID(boot) || !digits(ticks, 20) {
		return "", false
	}
	return boot, true
}

func currentBootID() (string, error) {
	bootID.Lock()
	defer bootID.Unlock()
	if bootID.id != "" {
		return bootID.id, nil
	}
	if fake := os.Getenv(TestBootIDEnv); fake != "" {
		if !isBootID(fake) {
			return "", fmt.Errorf("%s=%q is not a boot ID", TestBootIDEnv, fake)
		}
		bootID.id = fake
		return fake, nil
	}
	data, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("the boot ID could not be read (%v)", err)
	}
	id, ok := parseBootID(string(data))
	if !ok {
		return "", fmt.Errorf("the boot ID %q is not one", data)
	}
	bootID.id = id
	return id, nil
}

var psPaths = []string{"/bin/ps", "/usr/bin/ps"}

const psTimeout = 5 * time.Second

// observeLstart reads the identity where there is no /proc: the wall-clock start that the kernel
// records once, printed by ps to the second under a fixed locale and zone.
func observeLstart(pid int) Observation {
	text, err := psStart(pid)
	if err != nil {
		return unknown("ps did not report when process %d started (%v)", pid, err)
	}
	start, ok := parseLstart(text)
	if !ok {
		return unknown("ps reported an unrecognised start time for process %d", pid)
	}
	return Observation{State: Present, Start: start}
}

var lstartStart = regexp.MustCompile(`^lstart:([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z)$`)

const isoMillis = "2006-01-02T15:04:05.000Z"

// IsStart reports whether s is a well-formed start identity as Observe reports it.
func IsStart(s string) bool {
	if _, ok := BootOf(s); ok {
		return true
	}
	m := lstartStart.FindStringSubmatch(s)
	if m == nil {
		return false
	}
	// Round-tripping rejects dates that match the shape but do not exist (Feb 30, 25:00).
	t, err := time.Parse(isoMillis, m[1])
	return err == nil && t.Format(isoMillis) == m[1]
}

// Gone reports whether obs proves dead the process recorded with start. An absent pid proves it
// whether or not a start was recorded, since reuse can only make a dead process look alive; a
// start identity decides only against one read the same way.
func Gone(start string, obs Observation) bool {
	switch obs.State {
	case Absent:
		return true
	case Present:
		recorded, okRecorded := startKind(start)
		observed, okObserved := startKind(obs.Start)
		return okRecorded && okObserved && recorded == observed && obs.Start != start
	default:
		return false
	}
}

// startKind is how an identity was read: the prefix before its first ':'.
func startKind(start string) (string, bool) {
	kind, _, found := strings.Cut(start, ":")
	return kind, found && kind != ""
}
