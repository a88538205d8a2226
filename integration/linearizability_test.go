package integration

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
	"golang.org/x/sys/unix"
)

// Linearizability: concurrent clients claim, release, read and drain one stack through the mount;
// porcupine checks the recorded history against a sequential model of the engine's rules for one
// stack. Operations a crash interrupted have unknown outcomes: the model lets them apply or not.

const (
	linClients = 4
	linOpsEach = 60
	// linOpsEachEtcd: each operation over etcd is several round trips to a cluster in the test
	// process, and two daemons' writers on one stack conflict.
	linOpsEachEtcd = 25
	linHTTPBase    = 37080 // the stack is the cockpit's only one, so its lease is always offset 0
	linCheckTime   = 20 * time.Second
)

// linState is one stack as the engine's rules see it: holder names (sorted, space-separated),
// whether the lease is active, the drain phase ("", "reserved", "attempt"), the revision and the
// revision the drain was planned from.
type linState struct {
	Holders  string
	Lease    bool
	Drain    string
	Revision int64
	Planned  int64
}

func (s linState) holders() []string { return strings.Fields(s.Holders) }

func (s linState) has(h string) bool {
	for _, x := range s.holders() {
		if x == h {
			return true
		}
	}
	return false
}

func (s linState) with(h string) linState {
	hs := append(s.holders(), h)
	sort.Strings(hs)
	s.Holders = strings.Join(hs, " ")
	return s
}

func (s linState) without(h string) linState {
	var hs []string
	for _, x := range s.holders() {
		if x != h {
			hs = append(hs, x)
		}
	}
	s.Holders = strings.Join(hs, " ")
	return s
}

// linInput is one operation: claim/release (Holder), readHolders, readRevision, readPort,
// reserve (Revision: the one the request was planned from), start, success.
type linInput struct {
	Kind     string
	Holder   string
	Revision int64
}

// linOutput is what the syscalls said: Err "" for success or the errno's name, Value what a read
// returned; Unknown when a crash interrupted the operation.
type linOutput struct {
	Err     string
	Value   string
	Unknown bool
}

type linStep struct {
	out  linOutput
	next linState
}

// linSteps lists every (output, next state) the engine may produce for in from s. Where the
// kernel's lookup before an unlink or create sees a moment other than the engine call, both
// answers are listed.
func linSteps(s linState, in linInput) []linStep {
	ok := func(next linState) linStep { return linStep{next: next} }
	refused := func(errno string) linStep { return linStep{out: linOutput{Err: errno}, next: s} }
	bump := func(next linState) linState { next.Revision++; return next }
	switch in.Kind {
	case "claim":
		if s.has(in.Holder) {
			// The lookup finds the holder and the open claims nothing; a create whose lookup
			// saw it absent reaches the engine, which refuses during a drain.
			if s.Drain != "" {
				return []linStep{ok(s), refused("EBUSY")}
			}
			return []linStep{ok(s)}
		}
		if s.Drain != "" {
			return []linStep{refused("EBUSY")}
		}
		next := s.with(in.Holder)
		next.Lease = true
		return []linStep{ok(bump(next))}
	case "release":
		if !s.has(in.Holder) {
			steps := []linStep{refused("ENOENT")}
			if s.Drain != "" {
				steps = append(steps, refused("EBUSY")) // the lookup saw it, the engine checks the drain first
			}
			return steps
		}
		if s.Drain != "" || len(s.holders()) == 1 {
			return []linStep{refused("EBUSY")}
		}
		return []linStep{ok(bump(s.without(in.Holder)))}
	case "readHolders":
		return []linStep{{out: linOutput{Value: s.Holders}, next: s}}
	case "readRevision":
		return []linStep{{out: linOutput{Value: strconv.FormatInt(s.Revision, 10)}, next: s}}
	case "readPort":
		if !s.Lease {
			return []linStep{refused("ENOENT")}
		}
		return []linStep{{out: linOutput{Value: strconv.Itoa(linHTTPBase)}, next: s}}
	case "reserve":
		switch {
		case s.Drain == "attempt":
			return []linStep{refused("ENOTRECOVERABLE")} // a resume never takes over an active attempt
		case s.Drain != "" && (in.Revision == s.Revision || in.Revision == s.Planned):
			return []linStep{ok(s)} // the same sleep drain: a resume
		case in.Revision != s.Revision:
			return []linStep{refused("ESTALE")}
		case !s.Lease || len(s.holders()) != 1:
			return []linStep{refused("EBUSY")}
		}
		next := s
		next.Drain, next.Planned = "reserved", s.Revision
		return []linStep{ok(bump(next))}
	case "start":
		switch s.Drain {
		case "":
			return []linStep{refused("ENOENT")}
		case "attempt":
			return []linStep{refused("EBUSY")}
		}
		next := s
		next.Drain = "attempt"
		return []linStep{ok(bump(next))}
	case "success":
		if s.Drain != "attempt" {
			return []linStep{refused("ESTALE")}
		}
		return []linStep{ok(bump(linState{Revision: s.Revision}))}
	}
	panic("unknown operation " + in.Kind)
}

var linModel = porcupine.NondeterministicModel{
	Init: func() []interface{} { return []interface{}{linState{}} },
	Step: func(state, input, output interface{}) []interface{} {
		s, in, out := state.(linState), input.(linInput), output.(linOutput)
		var next []interface{}
		if out.Unknown || out.Err == "EAGAIN" {
			// Not applied: also what STATE_LOCKED says (contention outlasted the budget; over etcd
			// two daemons' writers conflict) of any operation.
			next = append(next, s)
		}
		for _, st := range linSteps(s, in) {
			if out.Unknown || st.out == out {
				next = append(next, st.next)
			}
		}
		return next
	},
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(linInput), output.(linOutput)
		arg := in.Holder
		if in.Kind == "reserve" {
			arg = "revision=" + strconv.FormatInt(in.Revision, 10)
		}
		res := out.Err
		switch {
		case out.Unknown:
			res = "unknown"
		case res == "":
			res = "ok " + out.Value
		}
		return fmt.Sprintf("%s(%s) -> %s", in.Kind, arg, res)
	},
	DescribeState: func(state interface{}) string {
		s := state.(linState)
		return fmt.Sprintf("rev %d holders [%s] lease=%t drain=%q", s.Revision, s.Holders, s.Lease, s.Drain)
	},
}

// linRun records one history on one stack, which client id reaches at dirs[id%len(dirs)]: the
// stack's directory on each mount serving it (one, or two daemons sharing an etcd prefix).
type linRun struct {
	dirs    []string
	opsEach int // per client and phase; 0: linOpsEach
	started time.Time
	mu      sync.Mutex
	history []porcupine.Operation
}

func (r *linRun) now() int64 { return int64(time.Since(r.started)) }

func linErrno(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return err.Error()
}

// do performs in through client id's mount and returns what it said.
func (r *linRun) do(id int, in linInput) (linOutput, error) {
	dir := r.dirs[id%len(r.dirs)]
	var value string
	var err error
	switch in.Kind {
	case "claim":
		var f *os.File
		if f, err = os.OpenFile(filepath.Join(dir, "holders", in.Holder), os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			f.Close()
		}
	case "release":
		err = os.Remove(filepath.Join(dir, "holders", in.Holder))
	case "readHolders":
		var es []os.DirEntry
		if es, err = os.ReadDir(filepath.Join(dir, "holders")); err == nil {
			names := make([]string, len(es))
			for i, e := range es {
				names[i] = e.Name()
			}
			sort.Strings(names)
			value = strings.Join(names, " ")
		}
	case "readRevision", "readPort":
		name := "revision"
		if in.Kind == "readPort" {
			name = filepath.Join("ports", "HTTP")
		}
		var data []byte
		if data, err = os.ReadFile(filepath.Join(dir, name)); err == nil {
			value = strings.TrimSpace(string(data))
		}
	case "reserve":
		err = crashWrite(filepath.Join(dir, "drain", "request"), fmt.Sprintf("sleep revision=%d\n", in.Revision))
	case "start":
		err = crashWrite(filepath.Join(dir, "drain", "attempt"), "start\n")
	case "success":
		err = crashWrite(filepath.Join(dir, "drain", "outcome"), "success\n")
	}
	switch {
	case err == nil:
		return linOutput{Value: value}, nil
	case crashInterrupted(err):
		return linOutput{Unknown: true}, err
	default:
		return linOutput{Err: linErrno(err)}, nil
	}
}

// client runs ops random operations as client id, stopping at the first interrupted one (which
// it records with an open end). A reservation is planned from a revision read just before it, and
// a client whose reservation succeeded carries its drain through, so drains do complete.
func (r *linRun) client(id int, rng *rand.Rand, ops int, stop *atomic.Bool) {
	own := fmt.Sprintf("h%d", id%linClients)
	var revision int64
	next := ""
	for i := 0; i < ops && !stop.Load(); i++ {
		var in linInput
		switch p := rng.Intn(100); {
		case next != "":
			in = linInput{Kind: next}
		case p < 15:
			in = linInput{Kind: "claim", Holder: own}
		case p < 45:
			in = linInput{Kind: "release", Holder: fmt.Sprintf("h%d", rng.Intn(linClients))}
		case p < 55:
			in = linInput{Kind: "readHolders"}
		case p < 63:
			in = linInput{Kind: "readPort"}
		case p < 68:
			in = linInput{Kind: "start"}
		case p < 72:
			in = linInput{Kind: "success"}
		default:
			in = linInput{Kind: "readRevision"}
			next = "reserve"
		}
		if in.Kind == "reserve" {
			in.Revision = revision
		}
		out, ok := r.record(id, in)
		if !ok {
			return
		}
		switch {
		case in.Kind == "readRevision" && out.Err == "":
			revision, _ = strconv.ParseInt(out.Value, 10, 64)
		case in.Kind == "reserve" && out.Err == "":
			next = "start"
		case in.Kind == "start" && (out.Err == "" || out.Err == "EBUSY"):
			next = "success"
		case in.Kind == next || in.Kind == "readRevision":
			next = ""
		}
	}
}

// record performs in and appends it to the history; false when a crash interrupted it, its
// return left open.
func (r *linRun) record(id int, in linInput) (linOutput, bool) {
	call := r.now()
	out, err := r.do(id, in)
	ret := r.now()
	if out.Unknown {
		ret = -1 // open-ended: fixed to the end of the history once it is known
	}
	r.mu.Lock()
	r.history = append(r.history, porcupine.Operation{ClientId: id, Input: in, Call: call, Output: out, Return: ret})
	r.mu.Unlock()
	return out, err == nil
}

// phase runs every client concurrently; unless victim is nil, that daemon is killed with SIGKILL
// after a random delay while they run, and every client stops after its operation under way.
func (r *linRun) phase(victim *mount, rng *rand.Rand, firstClient int) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := 0; i < linClients; i++ {
		wg.Add(1)
		clientRng := rand.New(rand.NewSource(rng.Int63()))
		ops := cmp.Or(r.opsEach, linOpsEach)
		go func() { defer wg.Done(); r.client(firstClient+i, clientRng, ops, &stop) }()
	}
	if victim != nil {
		time.Sleep(time.Duration(50+rng.Intn(250)) * time.Millisecond)
		victim.Kill()
		stop.Store(true)
	}
	wg.Wait()
}

// check closes the history's open ends and runs porcupine; on failure the visualisation is
// saved and its path logged.
func (r *linRun) check(t *testing.T, name string) bool {
	t.Helper()
	end := r.now() + 1
	for i := range r.history {
		if r.history[i].Return < 0 {
			r.history[i].Return = end
		}
	}
	model := linModel.ToModel()
	result, info := porcupine.CheckOperationsVerbose(model, r.history, linCheckTime)
	if result == porcupine.Ok {
		return true
	}
	// Not in t.TempDir, which goes with the test: the file is for reading after it.
	dir, err := os.MkdirTemp("", "cockpitfs-lin-")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		t.Errorf("%s: saving the visualisation: %v", name, err)
	}
	t.Errorf("%s: history of %d operations is %s; visualisation: %s", name, len(r.history), result, path)
	return false
}

// linSetup makes a cockpit whose only stack is app/stacks/lin.
func linSetup(m *mount) string {
	m.setupApp(4, map[string]int{"HTTP": linHTTPBase})
	m.ok("mkdir $M/app/stacks/lin")
	return m.Path("app", "stacks", "lin")
}

// linSummary counts what a history did, so a run that never reached a drain is noticed.
func linSummary(history []porcupine.Operation) map[string]int {
	n := map[string]int{}
	for _, op := range history {
		out := op.Output.(linOutput)
		switch {
		case out.Unknown:
			n["unknown"]++
		case out.Err == "EAGAIN":
			n["EAGAIN"]++
		case out.Err == "":
			n[op.Input.(linInput).Kind+" ok"]++
		}
	}
	return n
}

func linSeed(t *testing.T) int64 {
	seed := time.Now().UnixNano()
	if v := os.Getenv("COCKPITFS_LIN_SEED"); v != "" {
		seed, _ = strconv.ParseInt(v, 10, 64)
	}
	t.Logf("seed %d (COCKPITFS_LIN_SEED reproduces the operation choices)", seed)
	return seed
}

func TestLinearizability(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewSource(linSeed(t)))
	passed, drains := 0, 0
	for run := 0; run < 4; run++ {
		m := newMount(t)
		r := &linRun{dirs: []string{linSetup(m)}, started: time.Now()}
		r.phase(nil, rng, 0)
		n := linSummary(r.history)
		drains += n["success ok"]
		if r.check(t, fmt.Sprintf("run%d", run)) {
			passed++
		}
		t.Logf("run %d: %d operations, %v", run, len(r.history), n)
		m.Stop()
	}
	t.Logf("linearizability checks passed: %d; drains completed: %d", passed, drains)
	if drains == 0 {
		t.Errorf("no drain completed in 4 histories: the workload did not exercise drains")
	}
}

// The daemon is killed mid-history and restarted; what the kill interrupted may or may not have
// applied, and the history across the restart must still be one linearizable history.
func TestLinearizabilityCrash(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewSource(linSeed(t)))
	passed := 0
	for run := 0; run < 2; run++ {
		m := newMount(t)
		r := &linRun{dirs: []string{linSetup(m)}, started: time.Now()}
		r.phase(m, rng, 0)
		detach(m.Dir) // stale-mount clearing is TestLifecycleKillRestartClearsStaleMount's subject
		m.start()
		r.phase(nil, rng, linClients) // new client ids: the old ones may still be open-ended
		if r.check(t, fmt.Sprintf("crash%d", run)) {
			passed++
		}
		t.Logf("crash run %d: %d operations, %v", run, len(r.history), linSummary(r.history))
		m.Stop()
	}
	t.Logf("linearizability checks passed with a crash: %d", passed)
}

// A claim racing a release of the same holder must either claim (the holder is absent at its
// moment) or find the holder there; "no such file" is never an answer to creating a holder.
// Each round starts with the holder present, so the claim's lookup can see it just before the
// release removes it.
func TestLinearizabilityClaimRacingRelease(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	dir := linSetup(m)
	m.ok("touch $M/app/stacks/lin/holders/keeper") // a co-tenant, so releasing x is never the last
	x := filepath.Join(dir, "holders", "x")
	claim := func() error {
		f, err := os.OpenFile(x, os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			f.Close()
		}
		return err
	}
	var failures []string
	const rounds = 200
	for i := 0; i < rounds; i++ {
		if err := claim(); err != nil {
			t.Fatalf("round %d: claim with no race: %v", i, err)
		}
		var wg sync.WaitGroup
		var claimErr, releaseErr error
		wg.Add(2)
		go func() { defer wg.Done(); claimErr = claim() }()
		go func() { defer wg.Done(); releaseErr = os.Remove(x) }()
		wg.Wait()
		if releaseErr != nil {
			t.Fatalf("round %d: release of a present co-tenant: %v", i, releaseErr)
		}
		if claimErr != nil {
			_, statErr := os.Stat(x)
			failures = append(failures, fmt.Sprintf("round %d: %v (afterwards the holder is present: %t)", i, claimErr, statErr == nil))
		}
	}
	if len(failures) > 0 {
		t.Errorf("%d of %d claims racing a release failed; the first:\n%s", len(failures), rounds, strings.Join(failures[:min(5, len(failures))], "\n"))
	}
}

// Over etcd: two daemons mount one prefix and the clients of one stack are split between them
// (even ids on the first mount, odd on the second). The whole history — one phase, one in which a
// daemon is killed with SIGKILL and restarted, and one after — must be linearizable across both
// mounts, and no port may be in two active leases at any moment (watchPorts checks while the
// clients run). One history in the suite, ten in scripts/long (COCKPITFS_LONG=1).
func TestLinearizabilityEtcd(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewSource(linSeed(t)))
	cluster := etcdtest.Start(t, 3)
	runs := 1
	if os.Getenv("COCKPITFS_LONG") != "" {
		runs = 10
	}
	passed, drains := 0, 0
	for run := range runs {
		prefix := fmt.Sprintf("lin%d", run)
		a, b := newEtcdMount(t, cluster.URL(prefix)), newEtcdMount(t, cluster.URL(prefix))
		linSetup(a)
		stack := []string{"app", "stacks", "lin"}
		r := &linRun{dirs: []string{a.Path(stack...), b.Path(stack...)}, opsEach: linOpsEachEtcd, started: time.Now()}
		ports := watchPorts(t, cluster, prefix)
		victim := []*mount{a, b}[rng.Intn(2)]
		r.phase(nil, rng, 0)
		r.phase(victim, rng, linClients)
		victim.restart()
		r.phase(nil, rng, 2*linClients) // new client ids: the killed ones may still be open-ended
		ports.finish(t)
		n := linSummary(r.history)
		drains += n["success ok"]
		if r.check(t, fmt.Sprintf("etcd%d", run)) {
			passed++
		}
		t.Logf("etcd run %d: %d operations, %v", run, len(r.history), n)
		a.Stop()
		b.Stop()
	}
	t.Logf("linearizability checks passed over etcd: %d of %d; drains completed: %d", passed, runs, drains)
}
