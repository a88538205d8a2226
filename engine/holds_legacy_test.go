package engine

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockpitfs/cockpitfs/engine/portlock"
	"github.com/cockpitfs/cockpitfs/internal/testtool"
	"golang.org/x/sys/unix"
)

// olderDaemon holds the legacy names of ports in space ("<space><port>"), as a daemon before the
// balanced names holds its leases' ports, until the test ends.
func olderDaemon(t *testing.T, space portlock.Space, ports ...int) *exec.Cmd {
	t.Helper()
	var names []string
	for _, port := range ports {
		names = append(names, string(space)+strconv.Itoa(port))
	}
	return testtool.HoldAbstract(t, names...)
}

// A daemon that starts beside an older daemon holds the legacy names of its leases' ports too, from
// its first hold, so the older daemon cannot take them; a port of its leases the older daemon
// holds is lost, naming it.
func TestHoldsBesideAnOlderDaemonAtStart(t *testing.T) {
	space := holdSpace(t)
	before := holdingEngine(t, space, "/before")
	newCockpit(t, before, "app", holdConfig, "s", "t")
	claim(t, before, "app", "s", "alice")
	claim(t, before, "app", "t", "bob")
	before.holds.releaseAll() // the daemon stopped
	older := olderDaemon(t, space, 41442)

	restarted := New(before.db)
	lost, err := restarted.HoldPorts(space, DaemonIdentity{PID: os.Getpid(), Data: "/restarted"})
	if err != nil || len(lost) != 1 || lost[0].Port != 41442 || lost[0].Holder.PID != older.Process.Pid || !space.Compat() {
		t.Fatalf("HoldPorts lost %+v, %v, want 41442 held by %d; compat %v", lost, err, older.Process.Pid, space.Compat())
	}
	events, _ := restarted.events("app", "t")
	if !strings.Contains(string(events), "port 41442 (DB) of this stack's lease is held by process "+strconv.Itoa(older.Process.Pid)) {
		t.Fatalf("events:\n%s", events)
	}
	for _, port := range []int{41080, 41432} {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: "@" + string(space) + strconv.Itoa(port)}); !errors.Is(err, unix.EADDRINUSE) {
			t.Fatalf("binding the legacy name of %d, held by the restarted engine: %v", port, err)
		}
	}
}

// An older daemon that started after this one saw none, and took a port this one holds (its legacy
// name was free), is found when a claim meets one of its holds: compat begins, the port shared is
// let go, and the stack's health names the older daemon and the remedy; the claim skips the
// older daemon's family.
func TestHoldsOlderDaemonStartedLaterIsReported(t *testing.T) {
	space := holdSpace(t)
	e := holdingEngine(t, space, "/d")
	newCockpit(t, e, "app", holdConfig, "s", "t")
	claim(t, e, "app", "s", "alice")
	if space.Compat() {
		t.Fatal("compat is on with no older daemon")
	}
	older := olderDaemon(t, space, 41432, 41090)
	claim(t, e, "app", "t", "bob")
	requirePorts(t, stackRecord(t, e, "app", "t"), map[string]int{"HTTP": 41100, "DB": 41452})
	events, _ := e.events("app", "t")
	if !strings.Contains(string(events), "skipped candidate families: port 41090 is held by process "+strconv.Itoa(older.Process.Pid)+" uid") {
		t.Fatalf("t's events:\n%s", events)
	}
	obs, err := e.Health("app", "s")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(obs, func(o Observation) bool { return o.Code == codePortFamily })
	if i < 0 || obs[i].Observed.Value == nil || *obs[i].Observed.Value ||
		!strings.Contains(obs[i].Observed.Reason, "port 41432 (DB) of this stack's lease is held by process "+strconv.Itoa(older.Process.Pid)) ||
		!strings.Contains(obs[i].Observed.Reason, "stop or upgrade the older daemon") {
		t.Fatalf("s's health: %+v", obs)
	}
	e.holds.mu.Lock()
	_, stillMine := e.holds.byPort[41432]
	_, kept := e.holds.byPort[41080]
	e.holds.mu.Unlock()
	if stillMine || !kept {
		t.Fatalf("after compat began, this engine holds 41432 %v, 41080 %v", stillMine, kept)
	}
}

// A claim under way when compat begins loses the port of its family that an older daemon holds
// too: if the claim commits the lease, the port is the stack's lost port, which health reports
// with the remedy; if it commits nothing, nothing of it stays.
func TestClaimUnderWayWhenCompatBeginsReportsTheLoss(t *testing.T) {
	for _, committed := range []bool{true, false} {
		space := holdSpace(t) // compat is a space's: each round starts without
		e := holdingEngine(t, space, "/d")
		newCockpit(t, e, "app", holdConfig, "s", "t")
		key, family := stackKey("app", "s"), map[string]int{"HTTP": 41080, "DB": 41432}
		if holder, port, _, err := e.holds.takeFamily(key, "app", "s", family); err != nil || holder != nil {
			t.Fatalf("taking s's family: %v %v at %d", err, holder, port)
		}
		older := olderDaemon(t, space, 41432, 41090)
		// Another stack's probe meets the older daemon's hold: compat begins, and 41432, whose
		// legacy name the older daemon holds, is let go.
		if holder, _, err := e.holds.take(stackKey("app", "t"), "app", "t", "HTTP", 41090, space.Take); err != nil || holder == nil {
			t.Fatalf("the older daemon's port was taken: %v %v", holder, err)
		}
		lease := &Lease{Ports: family}
		if !committed {
			lease = nil
		}
		e.holds.settle(key, committed, lease)
		e.holds.mu.Lock()
		lost := slices.Clone(e.holds.lost[key])
		_, held := e.holds.byPort[41080]
		e.holds.mu.Unlock()
		switch {
		case committed && (len(lost) != 1 || lost[0].Port != 41432 || lost[0].Holder.PID != older.Process.Pid || lost[0].Why != lostToOlder || !held):
			t.Fatalf("committed, s's lost ports are %+v; 41080 held %v", lost, held)
		case !committed && (len(lost) != 0 || held):
			t.Fatalf("nothing committed, s's lost ports are %+v; 41080 held %v", lost, held)
		}
		e.holds.releaseAll()
	}
}
