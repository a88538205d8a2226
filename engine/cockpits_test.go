package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
)

func callerAs(uid uint32, op, path string) Caller {
	return Caller{PID: os.Getpid(), UID: uid, Op: op, Path: path}
}

func eventLines(t *testing.T, e *Engine, cockpit, stack string) []event {
	t.Helper()
	data, err := e.events(cockpit, stack)
	if err != nil {
		t.Fatal(err)
	}
	var out []event
	for _, line := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatalf("events line %q: %v", line, err)
		}
		out = append(out, ev)
	}
	return out
}

func TestRemoveStackAndCockpit(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "main", "idle")
	claim(t, e, "app", "main", "alice")
	refusedUnchanged(t, e, "app", "main", ClaimCoTenant, func() error {
		return e.RemoveStack(ctx, me("rmdir", "app/stacks/main"), "app", "main")
	})
	requireCode(t, e.RemoveCockpit(ctx, me("rmdir", "app"), "app"), NotEmpty)
	if err := e.RemoveStack(ctx, me("rmdir", "app/stacks/idle"), "app", "idle"); err != nil {
		t.Fatal(err)
	}
	if stacks, err := e.Stacks("app"); err != nil || !reflect.DeepEqual(stacks, []string{"main"}) {
		t.Fatalf("stacks %v %v, want [main]", stacks, err)
	}
	requireCode(t, e.RemoveCockpit(ctx, me("rmdir", "app"), "app"), NotEmpty)

	// An empty cockpit goes, and its name can be used again from scratch.
	newCockpit(t, e, "empty", "", "s")
	if err := e.RemoveStack(ctx, me("rmdir", "empty/stacks/s"), "empty", "s"); err != nil {
		t.Fatal(err)
	}
	if err := e.RemoveCockpit(ctx, me("rmdir", "empty"), "empty"); err != nil {
		t.Fatal(err)
	}
	requireCode(t, func() error { _, err := e.Cockpit("empty"); return err }(), NotFound)
	newCockpit(t, e, "empty", "", "s")
	if r := stackRecord(t, e, "empty", "s"); r.Revision != 0 {
		t.Fatalf("a recreated stack starts at revision %d", r.Revision)
	}
	if evs := eventLines(t, e, "empty", "s"); len(evs) != 0 {
		t.Fatalf("a recreated stack inherited %d events", len(evs))
	}
}

func TestCreateExistingCockpitOrStack(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "main")
	requireCode(t, e.CreateCockpit(ctx, me("mkdir", "app"), "app"), Exists)
	refusedUnchanged(t, e, "app", "main", Exists, func() error {
		return e.CreateStack(ctx, me("mkdir", "app/stacks/main"), "app", "main")
	})
	requireCode(t, e.CreateStack(ctx, me("mkdir", "nope/stacks/main"), "nope", "main"), NotFound)
}

func TestCockpitStackHolderNames(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "main")
	invalid := []string{"", ".x", "-x", "a/b", strings.Repeat("a", 129), "a b", "é", "a\x00"}
	for _, name := range invalid {
		requireCode(t, e.CreateCockpit(ctx, me("mkdir", name), name), StateRecordMalformed)
		requireCode(t, e.CreateStack(ctx, me("mkdir", "app/stacks/"+name), "app", name), StateRecordMalformed)
		refusedUnchanged(t, e, "app", "main", StateRecordMalformed, func() error { return claimErr(e, "app", "main", name) })
	}
	for _, reserved := range []string{"README", "ports"} {
		requireCode(t, e.CreateCockpit(ctx, me("mkdir", reserved), reserved), StateRecordMalformed)
		// Only the root directory reserves them.
		if err := e.CreateStack(ctx, me("mkdir", "app/stacks/"+reserved), "app", reserved); err != nil {
			t.Fatalf("stack %s: %v", reserved, err)
		}
	}
	longest := strings.Repeat("a", 128)
	newCockpit(t, e, longest, exampleConfig, "x.y_z-1")
	claim(t, e, longest, "x.y_z-1", "A.b-c_9")
	if cockpits, err := e.Cockpits(); err != nil || len(cockpits) != 2 {
		t.Fatalf("cockpits %v %v", cockpits, err)
	}
}

func TestOwnershipOfCockpitsAndHolders(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	const owner, stranger = 1000, 1001
	if err := e.CreateCockpit(ctx, callerAs(owner, "mkdir", "app"), "app"); err != nil {
		t.Fatal(err)
	}
	if info, err := e.Cockpit("app"); err != nil || info.UID != owner {
		t.Fatalf("cockpit %+v %v, want uid %d", info, err, owner)
	}
	requireCode(t, e.SetConfig(ctx, callerAs(stranger, "write", "app/config"), "app", []byte(exampleConfig)), PermissionDenied)
	if info, _ := e.Cockpit("app"); info.Config != "" {
		t.Fatalf("a refused config was stored: %q", info.Config)
	}
	if err := e.SetConfig(ctx, callerAs(rootUID, "write", "app/config"), "app", []byte(exampleConfig)); err != nil {
		t.Fatalf("root writes any config: %v", err)
	}
	if err := e.SetConfig(ctx, callerAs(owner, "write", "app/config"), "app", []byte(exampleConfig+"\n")); err != nil {
		t.Fatalf("the owner writes its config: %v", err)
	}
	if err := e.CreateStack(ctx, callerAs(owner, "mkdir", "app/stacks/main"), "app", "main"); err != nil {
		t.Fatal(err)
	}
	// Closed until its creator opens it.
	refusedUnchanged(t, e, "app", "main", PermissionDenied, func() error {
		return e.Claim(ctx, callerAs(stranger, "create", "h"), "app", "main", "eve", untracked("eve"))
	})
	if err := e.ChmodStack(ctx, callerAs(owner, "chmod", "app/stacks/main"), "app", "main", 0o757); err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct {
		name string
		uid  uint32
	}{{"alice", owner}, {"bob", owner}, {"eve", stranger}} {
		if err := e.Claim(ctx, callerAs(h.uid, "create", "h"), "app", "main", h.name, untracked(h.name)); err != nil {
			t.Fatal(err)
		}
	}
	if r := stackRecord(t, e, "app", "main"); func() bool { h, _ := r.Value.Holder("eve"); return h.UID != stranger }() {
		t.Fatalf("eve does not record uid %d", stranger)
	}
	pidNone := "pid=none"
	mine := "pid=" + strconv.Itoa(processOfUID(t, owner))
	// Naming a process one may not signal (here root's own) would pin the holder beyond reach.
	refusedUnchanged(t, e, "app", "main", PermissionDenied, func() error {
		return e.SetHolder(ctx, callerAs(owner, "write", "h"), "app", "main", "bob", "pid="+strconv.Itoa(os.Getpid()), false)
	})
	refusedUnchanged(t, e, "app", "main", PermissionDenied, func() error {
		return e.SetHolder(ctx, callerAs(stranger, "write", "h"), "app", "main", "eve", "pid=1", false)
	})
	refusedUnchanged(t, e, "app", "main", PermissionDenied, func() error {
		return e.Release(ctx, callerAs(stranger, "unlink", "h"), "app", "main", "bob")
	})
	refusedUnchanged(t, e, "app", "main", PermissionDenied, func() error {
		return e.SetHolder(ctx, callerAs(stranger, "write", "h"), "app", "main", "bob", mine, false)
	})
	refusedUnchanged(t, e, "app", "main", PermissionDenied, func() error {
		return e.RemoveCockpit(ctx, callerAs(stranger, "rmdir", "app"), "app")
	})
	if err := e.SetHolder(ctx, callerAs(owner, "write", "h"), "app", "main", "bob", mine, false); err != nil {
		t.Fatalf("the owner sets its holder: %v", err)
	}
	if err := e.SetHolder(ctx, callerAs(rootUID, "write", "h"), "app", "main", "bob", pidNone, false); err != nil {
		t.Fatalf("root sets any holder: %v", err)
	}
	if err := e.Release(ctx, callerAs(rootUID, "unlink", "h"), "app", "main", "bob"); err != nil {
		t.Fatalf("root releases any holder: %v", err)
	}
	if err := e.Release(ctx, callerAs(stranger, "unlink", "h"), "app", "main", "eve"); err != nil {
		t.Fatalf("a stranger releases its own holder: %v", err)
	}
	if names := holderNames(stackRecord(t, e, "app", "main").Value); !reflect.DeepEqual(names, []string{"alice"}) {
		t.Fatalf("holders %v, want [alice]", names)
	}
}

// processOfUID starts a process running as uid (setpriv) for the test's length and returns its pid.
func processOfUID(t *testing.T, uid uint32) int {
	t.Helper()
	id := strconv.FormatUint(uint64(uid), 10)
	cmd := exec.Command("setpriv", "--reuid="+id, "--regid="+id, "--clear-groups", "sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatalf("a process of uid %d: %v", uid, err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// Until setpriv has switched, the child is still root's.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
		if strings.Contains(string(status), "\nUid:\t"+id+"\t") {
			return cmd.Process.Pid
		}
	}
	t.Fatalf("process %d never became uid %d", cmd.Process.Pid, uid)
	return 0
}

// deadPID returns the pid of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func TestSetHolder(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "main")
	claim(t, e, "app", "main", "alice")
	c := me("write", "app/stacks/main/holders/alice")
	set := func(text string, createdHere bool) error {
		return e.SetHolder(ctx, c, "app", "main", "alice", text, createdHere)
	}
	alice := func() Holder {
		h, ok := stackRecord(t, e, "app", "main").Value.Holder("alice")
		if !ok {
			t.Fatal("alice is gone")
		}
		return h
	}

	if err := set("pid="+strconv.Itoa(os.Getpid()), false); err != nil {
		t.Fatal(err)
	}
	if h := alice(); h.PID != os.Getpid() || h.ProcessStart == "" || e.HolderState(h) != "live" {
		t.Fatalf("after pid=%d: %+v state %s", os.Getpid(), h, e.HolderState(h))
	}
	if err := set("pid=none", false); err != nil {
		t.Fatal(err)
	}
	if h := alice(); h.PID != 0 || h.ProcessStart != "" || e.HolderState(h) != "untracked" {
		t.Fatalf("after pid=none: %+v", h)
	}
	revision := stackRecord(t, e, "app", "main").Revision
	if err := set("pid=none", false); err != nil {
		t.Fatal(err)
	}
	if r := stackRecord(t, e, "app", "main"); r.Revision != revision {
		t.Fatalf("a write that changes nothing moved the revision to %d", r.Revision)
	}
	refusedUnchanged(t, e, "app", "main", StateRecordMalformed, func() error {
		return set("pid="+strconv.Itoa(deadPID(t)), false)
	})
	refusedUnchanged(t, e, "app", "main", StateRecordMalformed, func() error {
		return set("checkout=/src/other", false)
	})
	refusedUnchanged(t, e, "app", "main", NotFound, func() error {
		return e.SetHolder(ctx, c, "app", "main", "nobody", "pid=none", false)
	})
	// The same checkout is no change, whoever writes it.
	if err := set("checkout=/src/alice", false); err != nil {
		t.Fatal(err)
	}
	if err := set("checkout=/src/other", true); err != nil {
		t.Fatal(err)
	}
	if h := alice(); h.CheckoutPath != "/src/other" || h.CheckoutID != checkoutID("/src/other") {
		t.Fatalf("checkout not moved on the creating open: %+v", h)
	}
}

func TestParseHolderWrite(t *testing.T) {
	w := func(pid int, setsPID bool, checkout string) holderWrite {
		return holderWrite{Holder: Holder{Name: "h", PID: pid, CheckoutPath: checkout}, setsPID: setsPID}
	}
	cases := []struct {
		text string
		want holderWrite
		ok   bool
	}{
		{"", w(0, false, ""), true},
		{"pid=none", w(0, true, ""), true},
		{"pid=42 checkout=/a/b/../c", w(42, true, "/a/c"), true},
		{"checkout=/x\npid=7", w(7, true, "/x"), true},
		{"pid=0", holderWrite{}, false},
		{"pid=-1", holderWrite{}, false},
		{"pid=007", holderWrite{}, false},
		{"pid=2147483648", holderWrite{}, false},
		{"pid=1 pid=2", holderWrite{}, false},
		{"checkout=relative", holderWrite{}, false},
		{"color=red", holderWrite{}, false},
		{"pid", holderWrite{}, false},
	}
	for _, tc := range cases {
		got, err := parseHolderWrite("h", tc.text)
		if !tc.ok {
			if AsRefusal(err).Code != StateRecordMalformed || err == nil {
				t.Errorf("%q: got %v, want STATE_RECORD_MALFORMED", tc.text, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %+v %v, want %+v", tc.text, got, err, tc.want)
		}
	}
}

func TestEventsAfterEachChange(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	claim(t, e, "app", "main", "alice")
	evs := eventLines(t, e, "app", "main")
	if len(evs) != 1 || evs[0].Result != "ok" || evs[0].Revision == nil || *evs[0].Revision != 1 ||
		evs[0].Op != "create" || evs[0].Path != "app/stacks/main/holders/alice" || evs[0].PID != os.Getpid() {
		t.Fatalf("events after the claim: %+v", evs)
	}
	cockpitEvents := eventLines(t, e, "app", "")
	if len(cockpitEvents) != 3 { // mkdir, config, mkdir stack
		t.Fatalf("cockpit events %+v, want 3 lines", cockpitEvents)
	}
}

func TestEventsKeepTheLast256(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "main")
	claim(t, e, "app", "main", "alice")
	c := me("write", "app/stacks/main/holders/alice")
	for i := range 300 {
		text := "pid=none"
		if i%2 == 0 {
			text = "pid=" + strconv.Itoa(os.Getpid())
		}
		if err := e.SetHolder(ctx, c, "app", "main", "alice", text, false); err != nil {
			t.Fatal(err)
		}
	}
	r := stackRecord(t, e, "app", "main")
	if r.Revision != 301 {
		t.Fatalf("revision %d, want 301", r.Revision)
	}
	evs := eventLines(t, e, "app", "main")
	if len(evs) != eventsKept {
		t.Fatalf("%d events lines, want %d", len(evs), eventsKept)
	}
	for i, ev := range evs {
		if want := r.Revision - int64(eventsKept-1-i); ev.Revision == nil || *ev.Revision != want {
			t.Fatalf("line %d has revision %v, want %d", i, ev.Revision, want)
		}
	}
}

func TestEventsLogRefusal(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	err := claimErr(e, "app", "main", ".bad")
	c := me("create", "app/stacks/main/holders/.bad")
	if err := e.LogRefusal(c, "app", "main", AsRefusal(err), "EINVAL", 0); err != nil {
		t.Fatal(err)
	}
	evs := eventLines(t, e, "app", "main")
	if len(evs) != 1 {
		t.Fatalf("events %+v, want one line", evs)
	}
	ev := evs[0]
	if ev.Result != "refused" || ev.Code != StateRecordMalformed || ev.Errno != "EINVAL" || ev.Path != c.Path ||
		ev.Message == "" || ev.Fix == "" || ev.Revision != nil {
		t.Fatalf("refused line %+v", ev)
	}
	if r := stackRecord(t, e, "app", "main"); r.Revision != 0 {
		t.Fatalf("logging a refusal moved the revision to %d", r.Revision)
	}
	// Cockpit level, saying how many refusals before it have no line; and a cockpit that does
	// not exist records nothing.
	before := len(eventLines(t, e, "app", ""))
	r := &Refusal{Code: PermissionDenied, Message: "no", Fix: "ask"}
	if err := e.LogRefusal(me("write", "app/config"), "app", "", r, "EACCES", 7); err != nil {
		t.Fatal(err)
	}
	if evs := eventLines(t, e, "app", ""); len(evs) != before+1 || evs[len(evs)-1].Errno != "EACCES" || evs[len(evs)-1].Unshown != 7 {
		t.Fatalf("cockpit events %+v", evs)
	}
	if err := e.LogRefusal(me("mkdir", "nope/stacks/x"), "nope", "x", r, "EACCES", 0); err != nil {
		t.Fatal(err)
	}
	if evs := eventLines(t, e, "nope", "x"); len(evs) != 0 {
		t.Fatalf("a missing stack got events %+v", evs)
	}
}

func TestWait(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	got := make(chan int64, 1)
	go func() {
		rev, err := e.Wait(context.Background(), "app", "main", 0)
		if err != nil {
			t.Error(err)
		}
		got <- rev
	}()
	select {
	case rev := <-got:
		t.Fatalf("Wait returned %d before any change", rev)
	case <-time.After(100 * time.Millisecond):
	}
	claim(t, e, "app", "main", "alice")
	select {
	case rev := <-got:
		if rev != 1 {
			t.Fatalf("Wait returned %d, want 1", rev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after a claim")
	}
	// A stale seen revision returns at once.
	if rev, err := e.Wait(context.Background(), "app", "main", 0); err != nil || rev != 1 {
		t.Fatalf("Wait(seen 0) = %d %v", rev, err)
	}
}

func TestWaitCancelled(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := e.Wait(ctx, "app", "main", 0)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait returned %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return on cancel")
	}
	_, err := e.Wait(context.Background(), "app", "missing", 0)
	requireCode(t, err, NotFound)
}

func TestSetConfig(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", "")
	requireCode(t, e.SetConfig(ctx, me("write", "app/config"), "app", []byte("[ports]\nstep = 0\n")), PortFamilyOutOfRange)
	requireCode(t, e.SetConfig(ctx, me("write", "nope/config"), "nope", []byte(exampleConfig)), NotFound)
	if info, err := e.Cockpit("app"); err != nil || info.Config != "" {
		t.Fatalf("an invalid config was stored: %+v %v", info, err)
	}
	if err := e.SetConfig(ctx, me("write", "app/config"), "app", []byte(exampleConfig)); err != nil {
		t.Fatal(err)
	}
	lines := len(eventLines(t, e, "app", ""))
	if err := e.SetConfig(ctx, me("write", "app/config"), "app", []byte(exampleConfig)); err != nil {
		t.Fatal(err)
	}
	if got := len(eventLines(t, e, "app", "")); got != lines {
		t.Fatalf("an unchanged config added %d events lines", got-lines)
	}
	if info, _ := e.Cockpit("app"); info.Config != exampleConfig {
		t.Fatalf("config %q", info.Config)
	}
}

// One uid may have made at most BoundCockpits cockpits that exist: past it mkdir is refused
// (COCKPIT_UID_LIMIT) and changes nothing, root and the unbounded uids are not bounded, removing
// one makes room, and a cockpit made before cockpits were counted counts against no one.
func TestCockpitBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEngine(t)
	const alice, daemon = 1001, 1002
	e.BoundCockpits(2, daemon)
	// A cockpit of an earlier release: no count, not counted.
	if err := e.db.Update(ctx, func(tx storage.Txn) error {
		return setJSON(tx, cockpitKey("old"), cockpitMeta{Name: "old", ID: cockpitID("old"), UID: alice})
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a1", "a2"} {
		if err := e.CreateCockpit(ctx, callerAs(alice, "mkdir", name), name); err != nil {
			t.Fatal(err)
		}
	}
	before := storeDump(t, e)
	err := e.CreateCockpit(ctx, callerAs(alice, "mkdir", "a3"), "a3")
	requireCode(t, err, CockpitUIDLimit)
	if !strings.Contains(err.Error(), "uid 1001 already has 2 cockpits") {
		t.Errorf("refusal says %q", err)
	}
	if after := storeDump(t, e); after != before {
		t.Fatalf("a refused mkdir changed the store:\nbefore %s\nafter  %s", before, after)
	}
	for _, c := range []Caller{callerAs(0, "mkdir", "r1"), callerAs(daemon, "mkdir", "d1"), callerAs(daemon, "mkdir", "d2"), callerAs(daemon, "mkdir", "d3")} {
		if err := e.CreateCockpit(ctx, c, c.Path); err != nil {
			t.Fatalf("%s by uid %d: %v", c.Path, c.UID, err)
		}
	}
	// The uncounted cockpit's removal makes no room; a counted one's does.
	if err := e.RemoveCockpit(ctx, callerAs(alice, "rmdir", "old"), "old"); err != nil {
		t.Fatal(err)
	}
	requireCode(t, e.CreateCockpit(ctx, callerAs(alice, "mkdir", "a3"), "a3"), CockpitUIDLimit)
	if err := e.RemoveCockpit(ctx, callerAs(alice, "rmdir", "a1"), "a1"); err != nil {
		t.Fatal(err)
	}
	if err := e.CreateCockpit(ctx, callerAs(alice, "mkdir", "a3"), "a3"); err != nil {
		t.Fatal(err)
	}
	if violations, _, err := Verify(e.db); err != nil || len(violations) != 0 {
		t.Fatalf("verify: %v %v", violations, err)
	}
	// Every cockpit gone, no count is left behind.
	for _, c := range []Caller{callerAs(alice, "rmdir", "a2"), callerAs(alice, "rmdir", "a3"), callerAs(0, "rmdir", "r1"), callerAs(daemon, "rmdir", "d1"), callerAs(daemon, "rmdir", "d2"), callerAs(daemon, "rmdir", "d3")} {
		if err := e.RemoveCockpit(ctx, c, c.Path); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.db.View(func(tx storage.Txn) error {
		return tx.Scan(uidCockpitsPrefix, func(key string, _ []byte) error { return fmt.Errorf("%s is left", key) })
	}); err != nil {
		t.Fatal(err)
	}
}

// storeDump is every key of e's store and its value, one per line.
func storeDump(t *testing.T, e *Engine) string {
	t.Helper()
	var b strings.Builder
	if err := e.db.View(func(tx storage.Txn) error {
		return tx.Scan("", func(k string, v []byte) error {
			fmt.Fprintf(&b, "%s=%s\n", k, v)
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// Once counted (CountStacks), one uid may have made at most its bound of stacks that exist, every
// cockpit counted: past it mkdir is refused (STACK_UID_LIMIT) and changes nothing; root and the
// unbounded uids are not bounded; removing one makes room. A store's stacks made before it was
// counted are counted when it first is, from their records' creators.
func TestStackBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEngine(t)
	const alice, daemon = 1001, 1002
	newCockpit(t, e, "app", exampleConfig)
	newCockpit(t, e, "web", exampleConfig)
	mkdir := func(uid uint32, cockpit, stack string) error {
		return e.CreateStack(ctx, callerAs(uid, "mkdir", cockpit+"/stacks/"+stack), cockpit, stack)
	}
	for _, s := range []string{"a1", "a2"} { // before the store is counted
		if err := mkdir(alice, "app", s); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.CountStacks(ctx, 3, daemon); err != nil {
		t.Fatal(err)
	}
	if err := mkdir(alice, "web", "a3"); err != nil {
		t.Fatal(err)
	}
	before := storeDump(t, e)
	err := mkdir(alice, "web", "a4")
	requireCode(t, err, StackUIDLimit)
	if !strings.Contains(err.Error(), "uid 1001 already made 3 stacks") {
		t.Errorf("refusal says %q", err)
	}
	if after := storeDump(t, e); after != before {
		t.Fatalf("a refused mkdir changed the store:\nbefore %s\nafter  %s", before, after)
	}
	for i := range 4 {
		for _, uid := range []uint32{0, daemon} {
			if err := mkdir(uid, "app", fmt.Sprintf("u%d-%d", uid, i)); err != nil {
				t.Fatalf("uid %d's stack %d: %v", uid, i, err)
			}
		}
	}
	if err := e.RemoveStack(ctx, callerAs(alice, "rmdir", "app/stacks/a1"), "app", "a1"); err != nil {
		t.Fatal(err)
	}
	if err := mkdir(alice, "web", "a4"); err != nil {
		t.Fatal(err)
	}
	if violations, _, err := Verify(e.db); err != nil || len(violations) != 0 {
		t.Fatalf("verify: %v %v", violations, err)
	}
}
