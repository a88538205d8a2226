package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
	"golang.org/x/sys/unix"
)

// Seeing what is going on: the machine-wide port index, health, wait, events and verify (SPEC §2,
// §8, §9), through the mount and the CLI.

// observeCockpit makes a cockpit with one HTTP base (step 10, count 5) and the stacks.
func (m *mount) observeCockpit(name string, http int, stacks ...string) {
	m.t.Helper()
	// One write(2): bash's printf writes line by line, and each write re-applies the document.
	m.ok(fmt.Sprintf("mkdir $M/%s && cat > $M/%s/config <<'EOF'\n[ports]\nstep = 10\ncount = 5\n[ports.bases]\nHTTP = %d\nEOF", name, name, http))
	for _, s := range stacks {
		m.ok(fmt.Sprintf("mkdir $M/%s/stacks/%s", name, s))
	}
}

// observeSleepDrain runs a whole sleep drain on a stack with one holder: the lease is released.
func (m *mount) observeSleepDrain(stack string) {
	m.t.Helper()
	m.ok(fmt.Sprintf(`d=$M/%s/drain; echo sleep > $d/request && echo start > $d/attempt && echo success > $d/outcome`, stack))
}

func TestRootPortsIndexAcrossCockpits(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 30180, "DB": 30532}, "a", "b")
	m.observeCockpit("web", 31180, "x")
	m.ok("touch $M/app/stacks/a/holders/me $M/app/stacks/b/holders/me $M/web/stacks/x/holders/me")

	if got, want := m.ok("ls $M/ports"), "30180\n30190\n30532\n30542\n31180\n"; got != want {
		t.Fatalf("ls ports = %q, want %q", got, want)
	}
	for port, want := range map[string]string{
		"30180": "cockpit=app stack=a key=HTTP offset=0\n",
		"30542": "cockpit=app stack=b key=DB offset=10\n",
		"31180": "cockpit=web stack=x key=HTTP offset=0\n",
	} {
		if got := m.read("ports", port); got != want {
			t.Errorf("ports/%s = %q, want %q", port, got, want)
		}
	}

	// A drain releases b's lease: its ports leave the machine's index, the others stay.
	m.observeSleepDrain("app/stacks/b")
	if got, want := m.ok("ls $M/ports"), "30180\n30532\n31180\n"; got != want {
		t.Fatalf("ls ports after b's drain = %q, want %q", got, want)
	}
	m.refused("cat $M/ports/30190", syscall.ENOENT)
	if got := m.read("app/stacks/b/lease"); !strings.Contains(got, "released=true\n") {
		t.Fatalf("b's lease after the drain = %q", got)
	}
}

// observation is a health line as a reader decodes it.
type observation struct {
	Code     string `json:"code"`
	Owner    string `json:"owner"`
	StackID  string `json:"stackId"`
	Source   string `json:"source"`
	Target   string `json:"target"`
	Observed struct {
		State      string `json:"state"`
		Value      *bool  `json:"value"`
		Reason     string `json:"reason"`
		ObservedAt string `json:"observedAt"`
	} `json:"observed"`
	Expectation struct {
		Kind  string `json:"kind"`
		Value bool   `json:"value"`
	} `json:"expectation"`
	Remedy string `json:"remedy"`
}

// observeHealth reads a stack's health and indexes it by code and target.
func (m *mount) observeHealth(stack string) map[string]observation {
	m.t.Helper()
	out := map[string]observation{}
	for _, line := range strings.Split(strings.TrimSuffix(m.read(stack, "health"), "\n"), "\n") {
		var o observation
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			m.t.Fatalf("health line %q: %v", line, err)
		}
		if o.Expectation.Kind != "equal" || !o.Expectation.Value || o.Remedy == "" || o.Observed.ObservedAt == "" {
			m.t.Fatalf("health line out of the seeds' shape: %s", line)
		}
		out[o.Code+" "+o.Target] = o
	}
	return out
}

func observeWant(t *testing.T, health map[string]observation, key string, want bool) {
	t.Helper()
	o, ok := health[key]
	if !ok {
		t.Fatalf("no %q observation in %+v", key, health)
	}
	if o.Observed.State != "available" || o.Observed.Value == nil || *o.Observed.Value != want {
		t.Fatalf("%s observed %+v, want available %t", key, o.Observed, want)
	}
}

func TestHealthOfAStackUpAndDown(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 24180, "DB": 24532}, "a")
	stack := "app/stacks/a"

	// Before a claim: the record is sound, there is no lease, so no listener is expected.
	before := m.observeHealth(stack)
	observeWant(t, before, "CLAIM_STATE_UNHEALTHY ", true)
	if o := before["PORT_FAMILY_COLLISION "]; o.Observed.State != "unavailable" || o.Observed.Reason != "the stack has no active port-family lease" {
		t.Fatalf("port-family before a claim: %+v", o.Observed)
	}
	if len(before) != 3 {
		t.Fatalf("health before a claim has %d observations, want claim-state, port-family, ephemeral", len(before))
	}

	m.ok("touch $M/app/stacks/a/holders/me")
	healthy := m.observeHealth(stack)
	observeWant(t, healthy, "CLAIM_STATE_UNHEALTHY ", true)
	observeWant(t, healthy, "PORT_FAMILY_COLLISION ", true)
	observeWant(t, healthy, "PORT_FAMILY_EPHEMERAL_OVERLAP ", true)
	// Nothing runs yet: both leased ports are silent.
	observeWant(t, healthy, "PORT_LISTENER_ABSENT HTTP=24180", false)
	observeWant(t, healthy, "PORT_LISTENER_ABSENT DB=24532", false)
	if o := healthy["CLAIM_STATE_UNHEALTHY "]; o.Owner != "environment-claims" || o.StackID != engine.StackID("app", "a") {
		t.Fatalf("claim-state names %s %s", o.Owner, o.StackID)
	}

	// The stack's web service comes up on its leased HTTP port.
	l, err := m.listen("tcp", "127.0.0.1:"+strings.TrimSpace(m.read(stack, "ports/HTTP")))
	if err != nil {
		t.Fatal(err)
	}
	up := m.observeHealth(stack)
	observeWant(t, up, "PORT_LISTENER_ABSENT HTTP=24180", true)
	observeWant(t, up, "PORT_LISTENER_ABSENT DB=24532", false)
	// st_size is what a read returns, though health is observed at each stat and open.
	if got := m.ok(`stat -c %s $M/app/stacks/a/health; wc -c < $M/app/stacks/a/health`); strings.Count(got, strings.Fields(got)[0]) != 2 {
		t.Fatalf("stat size and read length differ: %q", got)
	}

	// An open's fstat (which FUSE sends as a stat by path) is the size its reads return, though
	// the stack changed since the open; a stat by any other process observes now.
	runtime.LockOSThread()
	f, err := os.Open(filepath.Join(m.Dir, stack, "health"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	// And goes down again.
	l.Close()
	fresh := m.ok(`stat -c %s $M/app/stacks/a/health; wc -c < $M/app/stacks/a/health`)
	info, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	opened, err := io.ReadAll(f)
	runtime.UnlockOSThread()
	if err != nil || info.Size() != int64(len(opened)) || !strings.Contains(string(opened), `"value":true`) {
		t.Fatalf("fstat of an open reads size %d, the open read %d bytes (%v): %s", info.Size(), len(opened), err, opened)
	}
	if sizes := strings.Fields(fresh); len(sizes) != 2 || sizes[0] != sizes[1] || sizes[0] == strconv.Itoa(len(opened)) {
		t.Fatalf("a stat by another process while an open is held: %q, the open's %d bytes", fresh, len(opened))
	}
	observeWant(t, m.observeHealth(stack), "PORT_LISTENER_ABSENT HTTP=24180", false)
}

// Node's readFile opens on one thread of its pool, fstats on another, then reads exactly the size
// it was told: a stat by path from another thread of the process that has the file open once is
// answered from that open, so the size is what the open reads (a size observed anew truncated
// status.json for Node while stacks changed).
func TestFstatFromAnotherThreadIsTheOpensSize(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 24900}, "s")
	type opened struct {
		f   *os.File
		err error
	}
	openedCh, done := make(chan opened), make(chan struct{})
	go func() {
		runtime.LockOSThread() // the opening thread, kept until done and then ended
		f, err := os.Open(m.Path("status.json"))
		openedCh <- opened{f, err}
		<-done
	}()
	o := <-openedCh
	defer close(done)
	if o.err != nil {
		t.Fatal(o.err)
	}
	defer o.f.Close()
	m.ok("mkdir $M/app/stacks/grown && touch $M/app/stacks/grown/holders/me")
	sizeCh := make(chan int64)
	go func() {
		runtime.LockOSThread() // another thread of this process
		var st unix.Stat_t
		if err := unix.Fstat(int(o.f.Fd()), &st); err != nil {
			st.Size = -1
		}
		sizeCh <- st.Size
	}()
	size := <-sizeCh
	data, err := io.ReadAll(o.f)
	if err != nil || size != int64(len(data)) || !json.Valid(data) {
		t.Fatalf("fstat from another thread: size %d; the open read %d bytes (%v)", size, len(data), err)
	}
	if fresh := m.ok("stat -c %s $M/status.json"); fresh == strconv.Itoa(len(data)) {
		t.Fatalf("status.json did not change with the new stack (%s bytes): the test shows nothing", fresh)
	}
}

// observeWaitOpen reports whether process pid has path open: the wait's revision is taken at
// open, so the change must come after it.
func observeWaitOpen(pid int, path string) bool {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && target == path {
			return true
		}
	}
	return false
}

func TestWaitReturnsOnACoTenantsClaim(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 25180}, "a")
	m.ok("touch $M/app/stacks/a/holders/me")
	wait := m.Path("app/stacks/a/wait")

	// Several waiters at once, each its own process; a safety timeout keeps a bug from hanging
	// the suite.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var cats []*exec.Cmd
	var outs []*strings.Builder
	for range 4 {
		cat := exec.CommandContext(ctx, "cat", wait)
		out := &strings.Builder{}
		cat.Stdout = out
		if err := cat.Start(); err != nil {
			t.Fatal(err)
		}
		cats, outs = append(cats, cat), append(outs, out)
	}
	for _, cat := range cats {
		for !observeWaitOpen(cat.Process.Pid, wait) {
			if ctx.Err() != nil {
				t.Fatal("cat never opened wait")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	m.ok("touch $M/app/stacks/a/holders/you")
	for i, cat := range cats {
		if err := cat.Wait(); err != nil {
			t.Fatalf("cat wait: %v", err)
		}
		if outs[i].String() != "2\n" {
			t.Fatalf("cat wait returned %q, want the co-tenant's revision 2", outs[i].String())
		}
	}
}

func TestWaitEndsOnInterrupt(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 25280}, "a")
	r := m.sh("timeout -s INT 1 cat $M/app/stacks/a/wait")
	if r.Code != 124 {
		t.Fatalf("timeout -s INT cat wait: exit %d, want 124 (the wait ended on SIGINT)\nstderr: %s", r.Code, r.Stderr)
	}
	// The daemon serves on, and a later change still wakes a new waiter.
	m.ok("touch $M/app/stacks/a/holders/me")
	if got := m.read("app/stacks/a/revision"); got != "1\n" {
		t.Fatalf("revision after the interrupted wait = %q", got)
	}
}

// event is an events line as a reader decodes it.
type event struct {
	Op       string `json:"op"`
	Path     string `json:"path"`
	PID      int    `json:"pid"`
	Result   string `json:"result"`
	Code     string `json:"code"`
	Errno    string `json:"errno"`
	Message  string `json:"message"`
	Fix      string `json:"fix"`
	Revision *int64 `json:"revision"`
	Warning  string `json:"warning"`
}

func (m *mount) observeEvents(parts ...string) []event {
	m.t.Helper()
	var out []event
	for _, line := range strings.Split(strings.TrimSuffix(m.read(parts...), "\n"), "\n") {
		var e event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			m.t.Fatalf("events line %q: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

func TestEventsExplainRefusalsAndChanges(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 26180}, "a")
	h := "$M/app/stacks/a/holders"
	record := func() string { return m.read("app/stacks/a/record") }

	m.ok("touch " + h + "/me")
	before := record()
	m.refused("rm "+h+"/me", syscall.EBUSY)
	m.refused("echo colour=blue > "+h+"/me", syscall.EINVAL)
	m.refused("echo pid=2147483646 > "+h+"/me", syscall.EINVAL)
	if record() != before {
		t.Fatal("a refusal changed the record")
	}
	m.ok("touch " + h + "/you")
	before = record()
	m.refused("echo sleep > $M/app/stacks/a/drain/request", syscall.EBUSY)
	if record() != before {
		t.Fatal("a refused drain request changed the record")
	}

	want := []struct{ result, code, errno string }{
		{"ok", "", ""},
		{"refused", "CLAIM_CO_TENANT", "EBUSY"},
		{"refused", "STATE_RECORD_MALFORMED", "EINVAL"},
		{"refused", "STATE_RECORD_MALFORMED", "EINVAL"},
		{"ok", "", ""},
		{"refused", "CLAIM_CO_TENANT", "EBUSY"},
	}
	got := m.observeEvents("app/stacks/a/events")
	if len(got) != len(want) {
		t.Fatalf("events has %d lines, want %d: %+v", len(got), len(want), got)
	}
	revision := int64(0)
	for i, w := range want {
		e := got[i]
		if e.Result != w.result || e.Code != w.code || e.Errno != w.errno || e.Op == "" || e.Path == "" || e.PID <= 0 {
			t.Fatalf("line %d = %+v, want %+v", i, e, w)
		}
		if w.result == "ok" {
			revision++
			if e.Revision == nil || *e.Revision != revision {
				t.Fatalf("ok line %d names revision %v, want %d", i, e.Revision, revision)
			}
		} else if e.Message == "" || e.Fix == "" || e.Revision != nil {
			t.Fatalf("refused line %d has no message or fix, or a revision: %+v", i, e)
		}
	}

	// At the cockpit level: an invalid config is refused and explained; the config stays.
	config := m.read("app/config")
	m.refused("cat > $M/app/config <<'EOF'\n[ports]\nstep = 0\ncount = 5\n[ports.bases]\nHTTP = 26180\nEOF", syscall.EINVAL)
	if m.read("app/config") != config {
		t.Fatal("a refused config changed the config")
	}
	if e := m.observeEvents("app/events"); e[len(e)-1].Code != "PORT_FAMILY_OUT_OF_RANGE" || e[len(e)-1].Errno != "EINVAL" || !strings.Contains(e[len(e)-1].Message, "ports.step") {
		t.Fatalf("cockpit events end with %+v", e[len(e)-1])
	}
}

func TestEventsKeepTheLast256(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 26280}, "a")
	m.ok("touch $M/app/stacks/a/holders/me")
	// 300 changes: each write alternates the holder's pid.
	m.ok(`h=$M/app/stacks/a/holders/me; for i in $(seq 150); do echo pid=none > $h; echo pid=$$ > $h; done`)
	revision, err := strconv.ParseInt(strings.TrimSpace(m.read("app/stacks/a/revision")), 10, 64)
	if err != nil || revision != 301 {
		t.Fatalf("revision = %d (%v), want 301", revision, err)
	}
	events := m.observeEvents("app/stacks/a/events")
	if len(events) != 256 {
		t.Fatalf("events keeps %d lines, want 256", len(events))
	}
	for i, e := range events {
		if want := revision - 255 + int64(i); e.Result != "ok" || e.Revision == nil || *e.Revision != want {
			t.Fatalf("line %d = %+v, want ok revision %d: the most recent 256, in order", i, e, want)
		}
	}
}

// A config whose candidates the kernel may hand to outgoing connections is accepted with a warning.
func TestEventsWarnOfEphemeralCandidates(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skipf("no ephemeral port range on this host: %v", err)
	}
	low, _ := strconv.Atoi(strings.Fields(string(text))[0])
	m := newMount(t)
	m.observeCockpit("web", low)
	warning := m.observeEvents("web/events")[1].Warning
	if !strings.Contains(warning, fmt.Sprintf("candidate ports %d,", low)) || !strings.Contains(warning, "overlap the kernel's ephemeral port range") {
		t.Fatalf("config events line warning = %q", warning)
	}
	m.ok("mkdir $M/web/stacks/x")
	o := m.observeHealth("web/stacks/x")["PORT_FAMILY_EPHEMERAL_OVERLAP "]
	if o.Observed.Value == nil || *o.Observed.Value || !strings.Contains(o.Observed.Reason, "ephemeral port range") {
		t.Fatalf("health's ephemeral observation = %+v", o.Observed)
	}
}

// observeVerify runs `cockpitfs verify` on the mount's store.
func (m *mount) observeVerify() (string, int) {
	m.t.Helper()
	out, err := m.verify()
	if exit, ok := err.(*exec.ExitError); ok {
		return out, exit.ExitCode()
	} else if err != nil {
		m.t.Fatal(err)
	}
	return out, 0
}

func TestVerifyAfterOperationsAndOnACorruptStore(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 27180, "DB": 27532}, "a", "b", "c")
	m.observeCockpit("web", 29180, "x")
	m.ok(`cd $M/app/stacks
touch a/holders/me a/holders/you b/holders/me ../../web/stacks/x/holders/me
echo pid=none > a/holders/you
rm a/holders/you
rm a/holders/me || true
echo sleep > b/drain/request && echo start > b/drain/attempt && echo success > b/drain/outcome
rmdir b c`)

	// While the daemon holds the store, verify refuses and names it.
	if out, code := m.observeVerify(); code == 0 || !strings.Contains(out, "in use by cockpitfs process") {
		t.Fatalf("verify on a served store: exit %d\n%s", code, out)
	}
	m.Stop()
	out, code := m.observeVerify()
	if code != 0 || !strings.Contains(out, "2 records clean") {
		t.Fatalf("verify after the operations: exit %d\n%s", code, out)
	}

	// Corrupt the stopped store as a bug or a hand edit would: a holder on x's record with no
	// lease, and an index entry for a port no lease holds.
	m.corrupted = true
	db, err := kv.Open(m.Data)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(context.Background(), func(tx storage.Txn) error {
		data, err := tx.Get("s/web/x")
		if err != nil {
			return err
		}
		var record map[string]any
		if err := json.Unmarshal(data, &record); err != nil {
			return err
		}
		record["value"].(map[string]any)["lease"] = nil
		if data, err = json.Marshal(record); err != nil {
			return err
		}
		if err := tx.Set("s/web/x", data); err != nil {
			return err
		}
		return tx.Set("p/27190", []byte(`{"port":27190,"cockpit":"app","stack":"b","key":"HTTP","offset":10}`))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	out, code = m.observeVerify()
	for _, want := range []string{"s/web/x: ", "holders but no active lease", "p/27190: ", "p/29180: ", "n/web: "} {
		if !strings.Contains(out, want) {
			t.Errorf("verify output lacks %q", want)
		}
	}
	if code == 0 {
		t.Errorf("verify on a corrupt store exits 0")
	}
	if t.Failed() {
		t.Logf("verify output:\n%s", out)
	}
}

// observeCorrupt changes a stopped daemon's store as a bug or a hand edit would, then serves it
// again.
func (m *mount) observeCorrupt(change func(tx storage.Txn) error) {
	m.t.Helper()
	m.Stop()
	m.corrupted = true
	db, err := kv.Open(m.Data)
	if err != nil {
		m.t.Fatal(err)
	}
	err = db.Update(context.Background(), change)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		m.t.Fatal(err)
	}
	m.start()
}

// Health judges the inventory around a stack as the seeds' observations do: port-family is false
// while any two active leases on the machine share a port, even two other stacks'; claim-state
// fails while any record of the cockpit is broken.
func TestHealthObservesTheInventory(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 24680}, "a", "b", "c", "d")
	m.ok("touch $M/app/stacks/a/holders/me $M/app/stacks/b/holders/me")
	healthy := m.observeHealth("app/stacks/a")
	observeWant(t, healthy, "CLAIM_STATE_UNHEALTHY ", true)
	observeWant(t, healthy, "PORT_FAMILY_COLLISION ", true)

	// c's record takes b's lease: a's own port is clear, the machine's leases are not.
	m.observeCorrupt(func(tx storage.Txn) error {
		data, err := tx.Get("s/app/b")
		if err != nil {
			return err
		}
		var b map[string]any
		if err := json.Unmarshal(data, &b); err != nil {
			return err
		}
		if data, err = tx.Get("s/app/c"); err != nil {
			return err
		}
		var c map[string]any
		if err := json.Unmarshal(data, &c); err != nil {
			return err
		}
		value := c["value"].(map[string]any)
		value["lease"] = b["value"].(map[string]any)["lease"]
		// b's holder is stored under a key of its own; c, with no holder, names it released.
		if err := tx.Scan("h/app/b/", func(key string, _ []byte) error {
			value["lastReleasedHolder"] = strings.TrimPrefix(key, "h/app/b/")
			return nil
		}); err != nil {
			return err
		}
		if data, err = json.Marshal(c); err != nil {
			return err
		}
		return tx.Set("s/app/c", data)
	})
	collided := m.observeHealth("app/stacks/a")
	observeWant(t, collided, "PORT_FAMILY_COLLISION ", false)
	if reason := collided["PORT_FAMILY_COLLISION "].Observed.Reason; !strings.Contains(reason, "port 24690 (HTTP) is leased by app/b and app/c") {
		t.Fatalf("port-family reason %q", reason)
	}
	observeWant(t, collided, "CLAIM_STATE_UNHEALTHY ", true)

	// d's record is not JSON: every stack of the cockpit reports it.
	m.observeCorrupt(func(tx storage.Txn) error { return tx.Set("s/app/d", []byte("{")) })
	broken := m.observeHealth("app/stacks/a")
	if o := broken["CLAIM_STATE_UNHEALTHY "].Observed; o.State != "failed" || !strings.Contains(o.Reason, "app/d") {
		t.Fatalf("claim-state beside a broken record: %+v", o)
	}
	if o := broken["PORT_FAMILY_COLLISION "].Observed; o.State != "failed" {
		t.Fatalf("port-family beside a broken record: %+v", o)
	}
}

// A refusal code per cause, through the mount: the 1025th stack of a cockpit is
// STATE_INVENTORY_LIMIT (ENOSPC); a stored record that does not decode answers EIO.
func TestRefusalCodesOfLimitsAndBrokenRecords(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 24780}, "a", "b")
	m.observeCorrupt(func(tx storage.Txn) error {
		data, err := tx.Get("c/app")
		if err != nil {
			return err
		}
		var meta map[string]any
		if err := json.Unmarshal(data, &meta); err != nil {
			return err
		}
		meta["stacks"] = engine.MaxStacks // as if 1022 more stacks were there
		if data, err = json.Marshal(meta); err != nil {
			return err
		}
		if err := tx.Set("c/app", data); err != nil {
			return err
		}
		return tx.Set("s/app/b", []byte("{"))
	})
	m.refused("mkdir $M/app/stacks/late", syscall.ENOSPC)
	if ev := m.lastEvent("app/events"); !strings.Contains(ev, `"code":"STATE_INVENTORY_LIMIT"`) || !strings.Contains(ev, `"errno":"ENOSPC"`) {
		t.Fatalf("cockpit events after the 1025th mkdir: %s", ev)
	}
	if r := m.sh("stat $M/app/stacks/late"); r.Code == 0 {
		t.Fatal("the refused stack exists")
	}
	// A stack whose record does not decode cannot even be looked up: EIO, the cause in the
	// daemon's log (the engine's tests show its code, STATE_RECORD_MALFORMED).
	m.refused("touch $M/app/stacks/b/holders/me", syscall.EIO)
}
