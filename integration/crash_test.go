package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/portlock"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
)

// Crash safety: clients drive their own stacks through the mount while the daemon is killed with
// SIGKILL at random moments. After each kill the store must verify clean offline, and after the
// remount every acknowledged operation must still show its effect. Each client owns one stack and
// chooses its next operation from the state its acknowledged operations produced, so the expected
// state is always known; the one operation a crash interrupts may or may not have applied.

// crashCyclesDefault and crashCyclesEtcd keep the CI run short (a cycle over etcd also restarts a
// daemon that reconnects to the cluster); COCKPITFS_CRASH_CYCLES asks for a long run of either.
const (
	crashCyclesDefault = 12
	crashCyclesEtcd    = 3
)

// crashState is what a client's operations decide about its stack. Holders lists "name=pid" with
// pid "none" or "set", sorted; Drain is "", "reserved" or "attempt".
type crashState struct {
	Holders      string
	Lease        bool
	Drain        string
	LastReleased string
}

func (s crashState) holders() map[string]string {
	out := map[string]string{}
	for _, h := range strings.Fields(s.Holders) {
		name, pid, _ := strings.Cut(h, "=")
		out[name] = pid
	}
	return out
}

func crashHolders(m map[string]string) string {
	var hs []string
	for name, pid := range m {
		hs = append(hs, name+"="+pid)
	}
	sort.Strings(hs)
	return strings.Join(hs, " ")
}

// crashOp is one step of a client: claim, setpid (pid=none), release, reserve, start, success.
type crashOp struct {
	kind   string
	holder string
}

func (o crashOp) String() string { return strings.TrimSpace(o.kind + " " + o.holder) }

// next is the client's deterministic round: claim a, b, c (each then set pid=none), release b and
// c, then a full sleep drain by a, which releases the stack; and again.
func (s crashState) next() (crashOp, error) {
	hs := s.holders()
	switch s.Drain {
	case "attempt":
		return crashOp{kind: "success"}, nil
	case "reserved":
		return crashOp{kind: "start"}, nil
	}
	if len(hs) == 0 {
		return crashOp{kind: "claim", holder: "a"}, nil
	}
	for _, name := range []string{"a", "b", "c"} {
		if pid, ok := hs[name]; ok && pid != "none" {
			return crashOp{kind: "setpid", holder: name}, nil
		}
	}
	switch s.Holders {
	case "a=none":
		if s.LastReleased == "c" {
			return crashOp{kind: "reserve"}, nil
		}
		return crashOp{kind: "claim", holder: "b"}, nil
	case "a=none b=none":
		return crashOp{kind: "claim", holder: "c"}, nil
	case "a=none b=none c=none":
		return crashOp{kind: "release", holder: "b"}, nil
	case "a=none c=none":
		return crashOp{kind: "release", holder: "c"}, nil
	}
	return crashOp{}, fmt.Errorf("no step of the round leads on from %+v", s)
}

// apply is the state after o succeeded in s.
func (s crashState) apply(o crashOp) crashState {
	hs := s.holders()
	switch o.kind {
	case "claim":
		hs[o.holder] = "set"
		s.Lease = true
		if s.LastReleased == o.holder {
			s.LastReleased = ""
		}
	case "setpid":
		hs[o.holder] = "none"
	case "release":
		delete(hs, o.holder)
		s.LastReleased = o.holder
	case "reserve":
		s.Drain = "reserved"
	case "start":
		s.Drain = "attempt"
	case "success":
		hs = map[string]string{}
		s.Lease, s.Drain, s.LastReleased = false, "", "a"
	}
	s.Holders = crashHolders(hs)
	return s
}

// crashRecord is the part of a stack's record the checks read.
type crashRecord struct {
	Revision int64 `json:"revision"`
	Value    struct {
		Holders []struct {
			Name string `json:"name"`
			PID  int    `json:"pid"`
		} `json:"holders"`
		Lease *struct {
			Offset   int            `json:"offset"`
			Ports    map[string]int `json:"ports"`
			Released bool           `json:"released"`
		} `json:"lease"`
		LastReleasedHolder *string `json:"lastReleasedHolder"`
		Drain              *struct {
			Attempt *struct {
				Status string `json:"status"`
			} `json:"attempt"`
		} `json:"drain"`
	} `json:"value"`
}

func (r crashRecord) leaseActive() bool { return r.Value.Lease != nil && !r.Value.Lease.Released }

func crashReadRecord(path string) (crashRecord, error) {
	var r crashRecord
	data, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(data, &r)
}

// crashHolderID is SPEC §2's holder identity, to name the record's lastReleasedHolder.
func crashHolderID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "holder:" + hex.EncodeToString(sum[:]) + ":session"
}

// state reads the record as a crashState.
func (r crashRecord) state() crashState {
	hs := map[string]string{}
	for _, h := range r.Value.Holders {
		hs[h.Name] = "set"
		if h.PID == 0 {
			hs[h.Name] = "none"
		}
	}
	s := crashState{Holders: crashHolders(hs), Lease: r.leaseActive()}
	if d := r.Value.Drain; d != nil {
		s.Drain = "reserved"
		if d.Attempt != nil && d.Attempt.Status == "active" {
			s.Drain = "attempt"
		}
	}
	if id := r.Value.LastReleasedHolder; id != nil {
		s.LastReleased = *id
		for _, name := range []string{"a", "b", "c"} {
			if crashHolderID(name) == *id {
				s.LastReleased = name
			}
		}
	}
	return s
}

// crashOutcome classifies an operation's result.
type crashOutcome int

const (
	crashAcked   crashOutcome = iota // the syscall returned success
	crashUnknown                     // interrupted by the crash: it may or may not have applied
	crashLocked                      // STATE_LOCKED (EAGAIN): contention outlasted the budget, nothing applied
	crashRefused                     // refused while the daemon served: the round is wrong or the daemon is
)

// crashInterrupted reports whether err is what a dying daemon makes a syscall return.
func crashInterrupted(err error) bool {
	return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, syscall.EIO) || errors.Is(err, syscall.EINTR)
}

// crashClient drives one stack; shell clients run each step as a bash command, the others as Go
// file operations.
type crashClient struct {
	stackDir string
	shell    bool
	state    crashState // after the last acknowledged operation
	pending  *crashOp   // interrupted by the last crash
	acked    int
	unknown  int
	locked   int
	failure  string // a refusal while serving, reported by the test
	// diagnose describes the daemon's state; a refusal's failure carries what it said at once,
	// while the daemon that refused still runs.
	diagnose func() string
}

func (c *crashClient) run(stop *atomic.Bool) {
	for !stop.Load() {
		op, err := c.state.next()
		if err != nil {
			c.failure = err.Error()
			return
		}
		switch outcome, detail := c.do(op); outcome {
		case crashAcked:
			c.state = c.state.apply(op)
			c.acked++
		case crashUnknown:
			c.pending = &op
			c.unknown++
			return
		case crashLocked:
			// Over etcd two daemons' claims meet on the cockpit's keys; a user tries again, as
			// this does (the same step: nothing changed).
			c.locked++
			time.Sleep(20 * time.Millisecond)
		default:
			// Every step of the round is valid in the state it is chosen from.
			c.failure = fmt.Sprintf("%s refused in state %+v: %s", op, c.state, detail)
			if c.diagnose != nil {
				c.failure += "\n" + c.diagnose()
			}
			return
		}
	}
}

func (c *crashClient) do(op crashOp) (crashOutcome, string) {
	if c.shell {
		return c.doShell(op)
	}
	holder := filepath.Join(c.stackDir, "holders", op.holder)
	var err error
	switch op.kind {
	case "claim":
		var f *os.File
		if f, err = os.OpenFile(holder, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			f.Close()
		}
	case "setpid":
		err = crashWrite(holder, "pid=none\n")
	case "release":
		err = os.Remove(holder)
	case "reserve":
		err = crashWrite(filepath.Join(c.stackDir, "drain", "request"), "sleep\n")
	case "start":
		err = crashWrite(filepath.Join(c.stackDir, "drain", "attempt"), "start\n")
	case "success":
		err = crashWrite(filepath.Join(c.stackDir, "drain", "outcome"), "success\n")
	}
	switch {
	case err == nil:
		return crashAcked, ""
	case crashInterrupted(err):
		return crashUnknown, err.Error()
	case errors.Is(err, syscall.EAGAIN):
		return crashLocked, err.Error()
	default:
		return crashRefused, err.Error()
	}
}

// crashWrite is one control command: its write(2) decides, whatever close says afterwards.
func crashWrite(path, command string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(command)
	return err
}

func (c *crashClient) doShell(op crashOp) (crashOutcome, string) {
	script := map[string]string{
		"claim":   `touch "$S/holders/$H"`,
		"setpid":  `echo pid=none > "$S/holders/$H"`,
		"release": `rm "$S/holders/$H"`,
		"reserve": `echo sleep > "$S/drain/request"`,
		"start":   `echo start > "$S/drain/attempt"`,
		"success": `echo success > "$S/drain/outcome"`,
	}[op.kind]
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = "/" // never the mount: a dead mount would fail the chdir, not the operation
	cmd.Env = append(os.Environ(), "S="+c.stackDir, "H="+op.holder)
	out, err := cmd.CombinedOutput()
	if err == nil {
		return crashAcked, ""
	}
	text := string(out)
	for _, m := range []string{"not connected", "connection abort", "Input/output error", "Interrupted system call"} {
		if strings.Contains(text, m) {
			return crashUnknown, text
		}
	}
	if strings.Contains(text, "Resource temporarily unavailable") {
		return crashLocked, text
	}
	return crashRefused, fmt.Sprintf("%v: %s", err, text)
}

// crashVerify runs `cockpitfs verify` on the store of a stopped daemon, in its network namespace.
func crashVerify(m *mount) error {
	m.t.Helper()
	out, err := m.verify()
	if err != nil {
		return fmt.Errorf("cockpitfs verify: %v\n%s", err, out)
	}
	return nil
}

// crashPortsOnce checks that no port is in two active leases, reading every stack's record, and
// that MOUNTPOINT/ports lists exactly those ports, each for its owner.
func crashPortsOnce(m *mount, stacks []string) error {
	owner := map[int]string{}
	for _, s := range stacks {
		r, err := crashReadRecord(m.Path("app", "stacks", s, "record"))
		if err != nil {
			return err
		}
		if !r.leaseActive() {
			continue
		}
		for _, port := range r.Value.Lease.Ports {
			if other, ok := owner[port]; ok {
				return fmt.Errorf("port %d is leased by %s and %s", port, other, s)
			}
			owner[port] = s
		}
	}
	listed, err := os.ReadDir(m.Path("ports"))
	if err != nil {
		return err
	}
	if len(listed) != len(owner) {
		return fmt.Errorf("ports/ lists %d ports, the active leases hold %d", len(listed), len(owner))
	}
	for _, e := range listed {
		port, _ := strconv.Atoi(e.Name())
		data, err := os.ReadFile(m.Path("ports", e.Name()))
		if err != nil {
			return err
		}
		if s, ok := owner[port]; !ok || !strings.Contains(string(data), " stack="+s+" ") {
			return fmt.Errorf("ports/%s says %q; the records say %q", e.Name(), data, owner[port])
		}
	}
	return nil
}

// crashDiagnose is what explains a refusal: each stack's lease and last events, MOUNTPOINT/ports,
// and who holds each port held in the daemon's network namespace (its answer names the lease).
func crashDiagnose(m *mount, stacks []string) string {
	var b strings.Builder
	m.ns.Do(func() error {
		held, err := portlock.Machine.Held()
		if err != nil {
			fmt.Fprintf(&b, "holds: %v\n", err)
		}
		for _, port := range held {
			holder, _, err := portlock.Machine.Ask(port)
			fmt.Fprintf(&b, "hold %d: %s %v\n", port, holder, err)
		}
		return nil
	})
	listed, err := os.ReadDir(m.Path("ports"))
	fmt.Fprintf(&b, "ports/: %v %v\n", err, listed)
	for _, s := range stacks {
		lease, err := os.ReadFile(m.Path("app", "stacks", s, "lease"))
		fmt.Fprintf(&b, "%s lease: %q %v\n", s, lease, err)
		events, err := os.ReadFile(m.Path("app", "stacks", s, "events"))
		lines := strings.Split(strings.TrimSpace(string(events)), "\n")
		fmt.Fprintf(&b, "%s events (%v):\n  %s\n", s, err, strings.Join(lines[max(0, len(lines)-6):], "\n  "))
	}
	return b.String()
}

func crashCycles(t *testing.T, cycles int) int {
	if v := os.Getenv("COCKPITFS_CRASH_CYCLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("COCKPITFS_CRASH_CYCLES=%q is not a positive number", v)
		}
		return n
	}
	return cycles
}

func TestCrashSafety(t *testing.T) {
	t.Parallel()
	crashSuite(t, []*mount{newMount(t)}, crashCycles(t, crashCyclesDefault), 20*time.Millisecond)
}

// Over etcd: two daemons serve one prefix, the clients split between them, and each cycle kills
// one of them in turn. Right after the kill, and before the killed daemon is back, the other
// daemon must show every operation acknowledged through either; then the restarted daemon must
// too. Throughout, no port is in two active leases on any etcd snapshot (watchPorts).
func TestCrashSafetyEtcd(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 3)
	store := cluster.URL("crash")
	a, b := newEtcdMount(t, store), newEtcdMount(t, store)
	ports := watchPorts(t, cluster, "crash")
	// An operation over etcd takes a few round trips to a cluster in the test process: the
	// clients run longer before each kill.
	crashSuite(t, []*mount{a, b}, crashCycles(t, crashCyclesEtcd), 500*time.Millisecond)
	ports.finish(t)
}

// crashSuite runs cycles of the clients on six stacks, client i on mounts[i%len(mounts)], killing
// mounts[cycle%len(mounts)] in each at least minRun after the clients start, and checks what the
// store shows after each kill: on every other mount at once, then on the killed one restarted.
func crashSuite(t *testing.T, mounts []*mount, cycles int, minRun time.Duration) {
	t.Helper()
	seed := time.Now().UnixNano()
	if v := os.Getenv("COCKPITFS_CRASH_SEED"); v != "" {
		seed, _ = strconv.ParseInt(v, 10, 64)
	}
	t.Logf("seed %d (COCKPITFS_CRASH_SEED reproduces the kill timings)", seed)
	rng := rand.New(rand.NewSource(seed))

	// Six stacks in a cockpit of count 6: every stack can hold a lease at once, and a port
	// leased twice would show up as two stacks on one family.
	mounts[0].setupApp(6, map[string]int{"HTTP": 36080, "DB": 36432})
	var clients []*crashClient
	var stacks []string
	for i := 0; i < 6; i++ {
		s := fmt.Sprintf("s%d", i)
		mounts[0].ok("mkdir $M/app/stacks/" + s)
		stacks = append(stacks, s)
		clients = append(clients, &crashClient{stackDir: mounts[i%len(mounts)].Path("app", "stacks", s), shell: i >= 4})
	}
	// A client diagnosing holds off the kill: the daemon that refused is the one to ask.
	var diagnosing sync.RWMutex
	for i, c := range clients {
		m := mounts[i%len(mounts)]
		c.diagnose = func() string {
			diagnosing.RLock()
			defer diagnosing.RUnlock()
			return crashDiagnose(m, stacks)
		}
	}

	var acked, unknown, locked, lost int
	// check reads every stack through m and compares it with what its client was acknowledged;
	// the interrupted operation stays pending (it may still apply) unless m shows it applied.
	check := func(cycle int, m *mount, who string) {
		t.Helper()
		for i, c := range clients {
			r, err := crashReadRecord(m.Path("app", "stacks", stacks[i], "record"))
			if err != nil {
				t.Fatalf("cycle %d: %s: stack %s: %v", cycle, who, stacks[i], err)
			}
			got := r.state()
			switch {
			case got == c.state:
			case c.pending != nil && got == c.state.apply(*c.pending):
				c.state, c.pending = got, nil
			default:
				lost++
				pending := "none"
				if c.pending != nil {
					pending = c.pending.String()
				}
				t.Errorf("cycle %d: %s: stack %s lost an acknowledged operation: acknowledged state %+v, interrupted %s, record says %+v",
					cycle, who, stacks[i], c.state, pending, got)
				c.state, c.pending = got, nil
			}
		}
	}
	for cycle := 1; cycle <= cycles; cycle++ {
		victim := mounts[cycle%len(mounts)]
		var stop atomic.Bool
		var wg sync.WaitGroup
		for _, c := range clients {
			wg.Add(1)
			go func() { defer wg.Done(); c.run(&stop) }()
		}
		time.Sleep(minRun + time.Duration(rng.Intn(280))*time.Millisecond)
		diagnosing.Lock()
		victim.Kill()
		diagnosing.Unlock()
		stop.Store(true)
		wg.Wait()
		for i, c := range clients {
			if c.failure != "" {
				t.Fatalf("cycle %d: client %d: %s", cycle, i, c.failure)
			}
		}
		if err := crashVerify(victim); err != nil {
			t.Fatalf("cycle %d: the store after SIGKILL: %v", cycle, err)
		}
		for _, m := range mounts {
			if m != victim {
				check(cycle, m, "the other daemon")
			}
		}
		victim.restart()
		check(cycle, victim, "the restarted daemon")
		// Go on from what the store says: an interrupted operation not applied by now never will
		// be (its daemon is gone, and etcd decided its commit long since).
		for _, c := range clients {
			c.pending = nil
		}
		if err := crashPortsOnce(victim, stacks); err != nil {
			t.Errorf("cycle %d: %v", cycle, err)
		}
	}
	for _, c := range clients {
		acked += c.acked
		unknown += c.unknown
		locked += c.locked
	}
	for _, m := range mounts {
		m.Stop()
	}
	if err := crashVerify(mounts[0]); err != nil {
		t.Errorf("the store after the last clean stop: %v", err)
	}
	t.Logf("crash figures: cycles=%d acknowledged=%d lost=%d unknown-outcome=%d locked-and-retried=%d", cycles, acked, lost, unknown, locked)
	if acked < cycles {
		t.Errorf("only %d operations were acknowledged in %d cycles: the clients hardly ran", acked, cycles)
	}
}
