package executor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/kv"
)

// gcFixture is an engine over a real badger store with cockpit app, and a mount point for the
// executor that no stack's checkout may be below.
type gcFixture struct {
	t     *testing.T
	eng   *engine.Engine
	x     *Executor
	mount string
}

func newGCFixture(t *testing.T) *gcFixture {
	t.Helper()
	db, err := kv.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	eng := engine.New(db)
	f := &gcFixture{t: t, eng: eng, mount: filepath.Join(t.TempDir(), "mnt")}
	f.x = New(eng, f.mount)
	ctx := context.Background()
	if err := eng.CreateCockpit(ctx, f.caller(), "app"); err != nil {
		t.Fatal(err)
	}
	if err := eng.SetConfig(ctx, f.caller(), "app", []byte("[ports]\nstep = 10\ncount = 20\n[ports.bases]\nHTTP = 49610\n")); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *gcFixture) caller() engine.Caller {
	return engine.Caller{PID: os.Getpid(), UID: uint32(os.Getuid()), Op: "test"}
}

// claim makes stack and claims it for holder me with pid (0: none) and checkout.
func (f *gcFixture) claim(stack string, pid int, checkout string) {
	f.t.Helper()
	ctx := context.Background()
	if err := f.eng.CreateStack(ctx, f.caller(), "app", stack); err != nil {
		f.t.Fatal(err)
	}
	if err := f.eng.Claim(ctx, f.caller(), "app", stack, "me", &engine.Holder{PID: pid, CheckoutPath: checkout}); err != nil {
		f.t.Fatal(err)
	}
}

// verdicts are the lines Survey gives, by stack.
func (f *gcFixture) verdicts() map[string]string {
	f.t.Helper()
	vs, err := f.x.Survey()
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]string{}
	for _, v := range vs {
		out[v.Stack] = v.Line()
	}
	return out
}

// deadProcess is the pid of a process that ran and was reaped, claimed while it ran.
func deadProcess(t *testing.T, claim func(pid int)) int {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	claim(cmd.Process.Pid)
	cmd.Process.Kill()
	cmd.Wait()
	return cmd.Process.Pid
}

// Each rule of gc's verdict: only every holder dead or pid-less with its checkout gone drains.
func TestJudge(t *testing.T) {
	f := newGCFixture(t)
	gone := filepath.Join(t.TempDir(), "gone")
	exists := t.TempDir()
	f.claim("pidless-gone", 0, gone)
	f.claim("pidless-exists", 0, exists)
	f.claim("in-mount", 0, filepath.Join(f.mount, "app"))
	f.claim("live-gone", os.Getpid(), gone)
	dead := deadProcess(t, func(pid int) { f.claim("dead-gone", pid, gone) })
	deadProcess(t, func(pid int) { f.claim("dead-exists", pid, exists) })
	f.claim("reclaim-left", 0, gone)
	req, err := engine.ParseDrainRequest("down volume:db")
	if err != nil {
		t.Fatal(err)
	}
	r, _ := f.eng.Stack("app", "reclaim-left")
	if err := f.eng.ReserveDrain(context.Background(), f.caller(), "app", "reclaim-left", req, r.Revision); err != nil {
		t.Fatal(err)
	}

	want := map[string]string{
		"pidless-gone":   "drain app/stacks/pidless-gone: holders me (pid-less); checkouts gone: " + gone,
		"pidless-exists": "keep app/stacks/pidless-exists: holder me's checkout " + exists + " exists",
		"in-mount":       "keep app/stacks/in-mount: holder me's checkout " + f.mount + "/app is inside the mount",
		"live-gone":      "keep app/stacks/live-gone: holder me is live (process ",
		"dead-gone":      "drain app/stacks/dead-gone: holders me (dead, process " + strconv.Itoa(dead) + "); checkouts gone: " + gone,
		"dead-exists":    "keep app/stacks/dead-exists: holder me's checkout " + exists + " exists",
		"reclaim-left":   "keep app/stacks/reclaim-left: a down drain by holder me is reserved",
	}
	got := f.verdicts()
	for stack, line := range want {
		if !strings.HasPrefix(got[stack], line) {
			t.Errorf("%s: %q, want %q", stack, got[stack], line)
		}
	}
	if len(got) != len(want) {
		t.Errorf("verdicts %v, want one for each of %d stacks", got, len(want))
	}

	// Collect drains the two stale stacks, and nothing else changes.
	before := map[string]int64{}
	for stack := range want {
		r, _ := f.eng.Stack("app", stack)
		before[stack] = r.Revision
	}
	drained, err := f.x.Collect(context.Background(), f.caller())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range drained {
		if d.Err != nil {
			t.Errorf("%s: %v", d.Stack, d.Err)
		}
	}
	for stack := range want {
		r, _ := f.eng.Stack("app", stack)
		stale := strings.HasPrefix(want[stack], "drain ")
		if released := !r.Value.Lease.Active(); released != stale {
			t.Errorf("%s: lease released %v, want %v", stack, released, stale)
		}
		if !stale && r.Revision != before[stack] {
			t.Errorf("%s: revision %d -> %d", stack, before[stack], r.Revision)
		}
	}
}
