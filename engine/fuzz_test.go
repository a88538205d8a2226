package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
)

// renderHolderWrite writes w as the holder write that sets exactly it.
func renderHolderWrite(w holderWrite) string {
	var parts []string
	if w.setsPID {
		if w.PID == 0 {
			parts = append(parts, "pid=none")
		} else {
			parts = append(parts, "pid="+strconv.Itoa(w.PID))
		}
	}
	if w.CheckoutPath != "" {
		parts = append(parts, "checkout="+w.CheckoutPath)
	}
	return strings.Join(parts, " ")
}

// FuzzParseHolderWrite: any write parses or is refused as malformed, and what parses renders back
// to a write that parses to the same fields.
func FuzzParseHolderWrite(f *testing.F) {
	for _, seed := range []string{"", "pid=none", "pid=4242 checkout=/src/app", "checkout=/a/../b//c/", "pid=01", "checkout=/a=b pid=2147483647"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		w, err := parseHolderWrite("h", text)
		if err != nil {
			if AsRefusal(err).Code != StateRecordMalformed {
				t.Fatalf("refusal %v is not STATE_RECORD_MALFORMED", err)
			}
			return
		}
		if w.PID < 0 || w.PID > 2147483647 || w.PID != 0 && !w.setsPID {
			t.Fatalf("parseHolderWrite(%q) accepted pid %+v", text, w)
		}
		if w.CheckoutPath != "" && (w.CheckoutPath[0] != '/' || strings.ContainsRune(w.CheckoutPath, 0)) {
			t.Fatalf("parseHolderWrite(%q) accepted checkout %q", text, w.CheckoutPath)
		}
		rendered := renderHolderWrite(w)
		again, err := parseHolderWrite("h", rendered)
		if err != nil || again != w {
			t.Fatalf("parseHolderWrite(%q) = %+v renders to %q, which parses to %+v, %v", text, w, rendered, again, err)
		}
	})
}

// FuzzParseAttemptCommand: the executor pid is -1 (the writer), 0 (none) or a process id.
func FuzzParseAttemptCommand(f *testing.F) {
	for _, seed := range []string{"start", "start pid=none", "start pid=1", " start\tpid=2147483647\n", "start pid=2147483648", "start pid=-1"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		pid, err := ParseAttemptCommand(text)
		if err != nil {
			if AsRefusal(err).Code != StateRecordMalformed {
				t.Fatalf("refusal %v is not STATE_RECORD_MALFORMED", err)
			}
			return
		}
		if pid < -1 || pid > 2147483647 {
			t.Fatalf("ParseAttemptCommand(%q) = %d", text, pid)
		}
		if fields := strings.Fields(text); fields[0] != "start" || (pid == -1) != (len(fields) == 1) {
			t.Fatalf("ParseAttemptCommand(%q) = %d does not match its tokens", text, pid)
		}
	})
}

// FuzzParseOutcomeCommand: an accepted outcome names success or failure and an attempt id that is
// "" or 64 lower-case hex digits.
func FuzzParseOutcomeCommand(f *testing.F) {
	for _, seed := range []string{"success", "failure\n", "success attempt=" + strings.Repeat("ab", 32), "failure attempt=" + strings.Repeat("AB", 32), "success attempt="} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		o, err := ParseOutcomeCommand(text)
		success, attemptID := o.Success, o.AttemptID
		if err != nil {
			if AsRefusal(err).Code != StateRecordMalformed {
				t.Fatalf("refusal %v is not STATE_RECORD_MALFORMED", err)
			}
			return
		}
		if attemptID != "" && !sha256Hex.MatchString(attemptID) {
			t.Fatalf("ParseOutcomeCommand(%q) accepted attempt id %q", text, attemptID)
		}
		if want := strings.Fields(text)[0] == "success"; success != want {
			t.Fatalf("ParseOutcomeCommand(%q) = success %v", text, success)
		}
	})
}

// FuzzParseRepairCommand: only `terminated`, with any white space around it, is accepted.
func FuzzParseRepairCommand(f *testing.F) {
	for _, seed := range []string{"terminated", " terminated\n", "terminated now", "Terminated"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		err := ParseRepairCommand(text)
		if want := strings.TrimSpace(text) == "terminated" && len(strings.Fields(text)) == 1; (err == nil) != want {
			t.Fatalf("ParseRepairCommand(%q) = %v", text, err)
		}
		if err != nil && AsRefusal(err).Code != StateRecordMalformed {
			t.Fatalf("refusal %v is not STATE_RECORD_MALFORMED", err)
		}
	})
}

// specName is the name grammar as SPEC states it.
var (
	specName  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)
	sha256Hex = regexp.MustCompile(`^[a-f0-9]{64}$`)
)

// FuzzValidName: ValidName is the spec's regular expression; a cockpit name also is not README or
// ports.
func FuzzValidName(f *testing.F) {
	for _, seed := range []string{"app", "_x", ".hidden", "-x", "a/b", "README", "ports", "a\x00", strings.Repeat("a", 128), strings.Repeat("a", 129), "caf\xc3\xa9", "\xff"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want := specName.MatchString(s)
		if got := ValidName(s); got != want {
			t.Fatalf("ValidName(%q) = %v, the spec says %v", s, got, want)
		}
		if got := ValidCockpitName(s); got != (want && s != "README" && s != "ports" && s != "status" && s != "status.json" && s != "gc") {
			t.Fatalf("ValidCockpitName(%q) = %v", s, got)
		}
	})
}

// Two declarations the sequence fuzzer alternates between: both have room for two stacks, and
// the second overlaps the first's ports, so leases taken under different declarations compete
// for the same port numbers.
var sequenceConfigs = []string{
	"[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 47180\nDB = 47200\n",
	"[ports]\nstep = 5\ncount = 2\n[ports.bases]\nHTTP = 47185\nDB = 47205\n",
}

var (
	sequenceStacks    = []string{"s", "t", "u"}
	sequenceHolders   = []string{"ann", "bob", "cy"}
	sequenceCheckouts = []string{"/src/one", "/src/two"}
	sequenceTargets   = []string{"volume:db", "volume:cache", "image:app"}
)

// maxSequenceOps bounds one input's sequence: each op is a store transaction plus a full verify.
const maxSequenceOps = 40

// sequenceInput hands out the fuzzer's bytes, zeros once they run out.
type sequenceInput struct{ data []byte }

func (in *sequenceInput) byte() byte {
	if len(in.data) == 0 {
		return 0
	}
	b := in.data[0]
	in.data = in.data[1:]
	return b
}

func (in *sequenceInput) pick(n int) int { return int(in.byte()) % n }

// sequenceRig is one fuzz input's engine: cockpit app with stacks s and t on an emptied store,
// and a clock only the sequence moves.
type sequenceRig struct {
	t       *testing.T
	db      *kv.DB
	e       *Engine
	clock   *testClock
	ctx     context.Context
	config  int
	otherID uint32 // a uid that owns nothing it did not create
}

// newSequenceRig empties db first: one store serves every input of a fuzz process, because
// opening one costs as much as a whole sequence.
func newSequenceRig(t *testing.T, db *kv.DB) *sequenceRig {
	err := db.Update(context.Background(), func(tx storage.Txn) error {
		var keys []string
		if err := tx.Scan("", func(k string, _ []byte) error {
			keys = append(keys, k)
			return nil
		}); err != nil {
			return err
		}
		for _, k := range keys {
			if err := tx.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rig := &sequenceRig{t: t, db: db, e: New(db), clock: &testClock{t: time.Date(2030, 1, 2, 3, 4, 5, 6_000_000, time.UTC)}, ctx: context.Background(), otherID: uint32(os.Getuid()) + 4242}
	rig.e.now = rig.clock.now
	newCockpit(t, rig.e, "app", sequenceConfigs[0], "s", "t")
	return rig
}

// caller is the test process, or another uid when the input says so.
func (rig *sequenceRig) caller(in *sequenceInput, op, path string) Caller {
	uid := uint32(os.Getuid())
	if in.pick(4) == 3 {
		uid = rig.otherID
	}
	return Caller{PID: os.Getpid(), UID: uid, Op: op, Path: path}
}

// snapshot is every key of the store and its value.
func (rig *sequenceRig) snapshot() map[string]string {
	out := map[string]string{}
	err := rig.db.View(func(tx storage.Txn) error {
		return tx.Scan("", func(k string, v []byte) error {
			out[k] = string(v)
			return nil
		})
	})
	if err != nil {
		rig.t.Fatal(err)
	}
	return out
}

func (rig *sequenceRig) revision(stack string) (int64, bool) {
	r, err := rig.e.Stack("app", stack)
	if err != nil {
		return 0, false
	}
	return r.Revision, true
}

// step applies the next op of in and returns its description and result.
func (rig *sequenceRig) step(in *sequenceInput) (string, string, error) {
	e, ctx := rig.e, rig.ctx
	stack := sequenceStacks[in.pick(len(sequenceStacks))]
	path := "app/stacks/" + stack
	switch op := in.pick(12); op {
	case 0:
		c := rig.caller(in, "mkdir", path)
		return fmt.Sprintf("create stack %s as uid %d", stack, c.UID), stack, e.CreateStack(ctx, c, "app", stack)
	case 1:
		c := rig.caller(in, "rmdir", path)
		return fmt.Sprintf("remove stack %s as uid %d", stack, c.UID), stack, e.RemoveStack(ctx, c, "app", stack)
	case 2:
		holder, checkout := sequenceHolders[in.pick(len(sequenceHolders))], sequenceCheckouts[in.pick(len(sequenceCheckouts))]
		c := rig.caller(in, "create", path+"/holders/"+holder)
		return fmt.Sprintf("claim %s by %s at %s as uid %d", stack, holder, checkout, c.UID), stack,
			e.Claim(ctx, c, "app", stack, holder, &Holder{CheckoutPath: checkout})
	case 3:
		holder := sequenceHolders[in.pick(len(sequenceHolders))]
		var text string
		switch in.pick(3) {
		case 0:
			text = "pid=none"
		case 1:
			text = "checkout=" + sequenceCheckouts[in.pick(len(sequenceCheckouts))]
		default:
			text = "pid=none checkout=" + sequenceCheckouts[in.pick(len(sequenceCheckouts))]
		}
		createdHere := in.pick(2) == 0
		c := rig.caller(in, "write", path+"/holders/"+holder)
		return fmt.Sprintf("set holder %s/%s %q createdHere=%v as uid %d", stack, holder, text, createdHere, c.UID), stack,
			e.SetHolder(ctx, c, "app", stack, holder, text, createdHere)
	case 4:
		holder := sequenceHolders[in.pick(len(sequenceHolders))]
		c := rig.caller(in, "unlink", path+"/holders/"+holder)
		return fmt.Sprintf("release %s/%s as uid %d", stack, holder, c.UID), stack, e.Release(ctx, c, "app", stack, holder)
	case 5:
		return rig.reserve(in, stack, path)
	case 6:
		// pid=none, or the default executor from a caller whose pid could not be resolved.
		pid, c := 0, rig.caller(in, "write", path+"/drain/attempt")
		if in.pick(4) == 3 {
			pid, c.PID = -1, 0
		}
		return fmt.Sprintf("start attempt on %s pid %d as uid %d", stack, pid, c.UID), stack, e.StartAttempt(ctx, c, "app", stack, pid)
	case 7:
		success := in.pick(2) == 0
		attemptID := ""
		switch in.pick(3) {
		case 1:
			if r, err := e.Stack("app", stack); err == nil && r.Value.Drain != nil && r.Value.Drain.Attempt != nil {
				attemptID = r.Value.Drain.Attempt.AttemptID
			}
		case 2:
			attemptID = strings.Repeat("0", 64)
		}
		c := rig.caller(in, "write", path+"/drain/outcome")
		return fmt.Sprintf("outcome on %s success=%v attempt=%q as uid %d", stack, success, attemptID, c.UID), stack,
			e.PublishOutcome(ctx, c, "app", stack, Outcome{Success: success, AttemptID: attemptID})
	case 8:
		c := rig.caller(in, "write", path+"/drain/repair")
		return fmt.Sprintf("repair %s as uid %d", stack, c.UID), stack, e.Repair(ctx, c, "app", stack)
	case 9:
		c := rig.caller(in, "unlink", path+"/drain/request")
		return fmt.Sprintf("cancel drain of %s as uid %d", stack, c.UID), stack, e.CancelDrain(ctx, c, "app", stack)
	case 10:
		next := 1 - rig.config
		c := rig.caller(in, "write", "app/config")
		err := e.SetConfig(ctx, c, "app", []byte(sequenceConfigs[next]))
		if err == nil {
			rig.config = next
		}
		return fmt.Sprintf("set config %d as uid %d", next, c.UID), "", err
	default:
		// Mostly forward, sometimes a step back as when the host clock is adjusted.
		ms := time.Duration(in.byte()) * 10 * time.Millisecond
		if in.pick(8) == 7 {
			ms = -ms
		}
		rig.clock.advance(ms)
		return fmt.Sprintf("advance clock %v", ms), "", nil
	}
}

// reserve writes a drain request as text, through the parser, at the current or a stale revision.
func (rig *sequenceRig) reserve(in *sequenceInput, stack, path string) (string, string, error) {
	words := []string{[]string{"sleep", "down", "reset"}[in.pick(3)]}
	for mask, i := in.byte(), 0; i < len(sequenceTargets); i++ {
		if mask&(1<<i) != 0 {
			words = append(words, sequenceTargets[i])
		}
	}
	if h := in.pick(len(sequenceHolders) + 1); h < len(sequenceHolders) {
		words = append(words, "holder="+sequenceHolders[h])
	}
	if v := []string{"", "1", "50", "1000"}[in.pick(4)]; v != "" {
		words = append(words, "valid_for="+v)
	}
	current, _ := rig.revision(stack)
	openedAt := current
	switch in.pick(4) {
	case 1:
		openedAt = current - 1
	case 2:
		words = append(words, "revision="+strconv.FormatInt(current, 10))
	case 3:
		words = append(words, "revision="+strconv.FormatInt(current+1, 10))
	}
	text := strings.Join(words, " ")
	c := rig.caller(in, "write", path+"/drain/request")
	what := fmt.Sprintf("reserve %s %q openedAt %d as uid %d", stack, text, openedAt, c.UID)
	q, err := ParseDrainRequest(text)
	if err != nil {
		return what, stack, err
	}
	return what, stack, rig.e.ReserveDrain(rig.ctx, c, "app", stack, q, openedAt)
}

// check asserts what holds after every op: each record keeps its invariants, the store verifies,
// and no port is leased to two stacks.
func (rig *sequenceRig) check(history []string) {
	t := rig.t
	violations, _, err := Verify(rig.db)
	if err != nil || len(violations) > 0 {
		t.Fatalf("after\n  %s\nverify: %v %v", strings.Join(history, "\n  "), violations, err)
	}
	stacks, err := rig.e.Stacks("app")
	if err != nil {
		t.Fatal(err)
	}
	leasedBy := map[int]string{}
	for _, s := range stacks {
		r, err := rig.e.Stack("app", s)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkRecord(r); err != nil {
			t.Fatalf("after\n  %s\nstack %s: %v", strings.Join(history, "\n  "), s, err)
		}
		if !r.Value.Lease.Active() {
			continue
		}
		for _, port := range r.Value.Lease.Ports {
			if other, ok := leasedBy[port]; ok {
				t.Fatalf("after\n  %s\nport %d is leased to %s and %s", strings.Join(history, "\n  "), port, other, s)
			}
			leasedBy[port] = s
		}
	}
}

// FuzzEngineSequence drives a random sequence of operations on one cockpit over a real store.
// After each: a refused operation changed no key of the store, an accepted one moved its stack by
// at most one revision, and every invariant holds.
func FuzzEngineSequence(f *testing.F) {
	// Each op is [stack, op, args...]; see step. Zero arguments mean: first holder, first
	// checkout, the test's own uid, default validity, current revision.
	// claim s, reserve sleep, start, succeed: the stack drains and frees its ports.
	f.Add([]byte{0, 2, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0})
	// s and t claimed, u refused for exhaustion, config flipped, a claim on s refused for it.
	f.Add([]byte{0, 2, 0, 0, 0, 1, 2, 1, 1, 0, 2, 0, 0, 2, 2, 2, 0, 0, 0, 10, 0, 0, 2, 1, 1, 0})
	// down volume:db valid 1 ms: start, late success refused, repair, retry, finish both actions.
	f.Add([]byte{0, 2, 0, 0, 0, 0, 5, 1, 1, 0, 1, 0, 0, 0, 6, 0, 0, 0, 11, 50, 0, 0, 7, 0, 0, 0,
		0, 8, 0, 0, 6, 0, 0, 0, 7, 0, 1, 0, 0, 6, 0, 0, 0, 7, 1, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0})
	// a stale reservation, then one valid 50 ms with the clock stepped back before its attempt.
	f.Add([]byte{0, 2, 0, 0, 0, 0, 5, 0, 0, 0, 0, 1, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0, 11, 20, 7, 0, 6, 0, 0, 0, 7, 1, 0, 0})
	// another uid claims beside the test's: pid=none, a refused checkout change, a refused and an
	// accepted release by the other uid.
	f.Add([]byte{0, 2, 0, 0, 3, 0, 2, 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 3, 0, 1, 1, 1, 0, 0, 4, 1, 3, 0, 4, 0, 3})
	db, err := kv.Open(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	f.Fuzz(func(t *testing.T, data []byte) {
		rig := newSequenceRig(t, db)
		in := &sequenceInput{data: data}
		var history []string
		rig.check(history)
		for i := 0; i < maxSequenceOps && len(in.data) > 0; i++ {
			before := rig.snapshot()
			what, stack, err := rig.step(in)
			history = append(history, fmt.Sprintf("%s: %v", what, err))
			after := rig.snapshot()
			if err != nil {
				if r := (*Refusal)(nil); !errors.As(err, &r) || r.Code == StateLocked {
					t.Fatalf("after\n  %s\nnot a refusal: %v", strings.Join(history, "\n  "), err)
				}
				if !maps.Equal(before, after) {
					t.Fatalf("after\n  %s\nthe refusal changed the store:\n%s", strings.Join(history, "\n  "), diffSnapshots(before, after))
				}
			} else if stack != "" {
				was, okBefore := snapshotRevision(t, before, stack)
				is, okAfter := snapshotRevision(t, after, stack)
				if okBefore && okAfter && is != was && is != was+1 {
					t.Fatalf("after\n  %s\nrevision of %s went from %d to %d", strings.Join(history, "\n  "), stack, was, is)
				}
			}
			rig.check(history)
		}
	})
}

// snapshotRevision is the revision of stack in a snapshot, if it exists there.
func snapshotRevision(t *testing.T, snapshot map[string]string, stack string) (int64, bool) {
	data, ok := snapshot[stackKey("app", stack)]
	if !ok {
		return 0, false
	}
	r, err := decodeHead([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return r.Revision, true
}

// diffSnapshots lists the keys whose values differ between two snapshots.
func diffSnapshots(before, after map[string]string) string {
	var lines []string
	for k, v := range before {
		if w, ok := after[k]; !ok {
			lines = append(lines, "- "+k)
		} else if w != v {
			lines = append(lines, fmt.Sprintf("~ %s\n    %s\n    %s", k, v, w))
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			lines = append(lines, "+ "+k)
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
