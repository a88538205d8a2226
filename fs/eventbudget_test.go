package fs

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/kv"
)

// A uid's events lines: eventLinesBurst at once, then eventLinesPerSecond; past them a refusal is
// counted and held (the latest one), one flush scheduled for it; the flush writes it once the
// budget allows, saying how many before it have no line, unless a line written first said so.
// Another uid has a budget of its own, and a bucket full again and holding nothing is let go.
func TestEventBudgetCountsWhatItHolds(t *testing.T) {
	var b eventBudget
	start := time.Unix(1000, 0)
	line := func(uid uint32, n int) refusalLine {
		return refusalLine{c: engine.Caller{UID: uid, Path: fmt.Sprintf("x%d", n)}}
	}
	for i := range eventLinesBurst {
		if unshown, write, arm := b.take(start, line(7, i)); !write || unshown != 0 || arm != 0 {
			t.Fatalf("line %d of the burst: %d unshown, write %v, arm %v", i, unshown, write, arm)
		}
	}
	const next = time.Second / eventLinesPerSecond
	if _, write, arm := b.take(start, line(7, 100)); write || arm != next {
		t.Fatalf("past the burst: write %v, arm %v; want false, %v", write, arm, next)
	}
	for i := 101; i < 105; i++ {
		if _, write, arm := b.take(start, line(7, i)); write || arm != 0 {
			t.Fatalf("x%d: write %v, arm %v: want it counted, the flush already armed", i, write, arm)
		}
	}
	if unshown, write, _ := b.take(start, line(8, 0)); !write || unshown != 0 {
		t.Fatalf("another uid: %d unshown, write %v", unshown, write)
	}
	if held, _, again := b.flush(7, start); held != nil || again != next {
		t.Fatalf("a flush before the budget allows: %v, again in %v; want nil, %v", held, again, next)
	}
	held, unshown, again := b.flush(7, start.Add(next))
	if held == nil || held.c.Path != "x104" || unshown != 4 || again != 0 {
		t.Fatalf("the flush: %v, %d unshown, again %v; want x104, 4, 0", held, unshown, again)
	}
	if held, _, again := b.flush(7, start.Add(next)); held != nil || again != 0 {
		t.Fatalf("nothing held: %v, again in %v", held, again)
	}
	if _, write, arm := b.take(start.Add(next), line(7, 200)); write || arm != next {
		t.Fatalf("past the budget again: write %v, arm %v", write, arm)
	}
	if unshown, write, _ := b.take(start.Add(3*next), line(7, 201)); !write || unshown != 1 {
		t.Fatalf("the next line: %d unshown, write %v; want 1, true", unshown, write)
	}
	if held, _, again := b.flush(7, start.Add(3*next)); held != nil || again != 0 {
		t.Fatalf("the flush after a line said the count: %v, again in %v", held, again)
	}
	b.take(start.Add(2*time.Minute), line(9, 0))
	if len(b.by) != 1 || b.by[9] == nil {
		t.Fatalf("buckets kept after two idle minutes: %v", b.by)
	}
}

// 300 refusals of one uid (not root, not the daemon's) on one stack: each returns its errno and
// changes nothing, but they take at most the budget's commits, not one each; the last refusal's
// line follows, saying how many have none, so that every refusal is a line or counted in one.
// Root's and the daemon's own user's refusals are each a line, there when the errno returns.
func TestCoUserRefusalFloodIsBudgeted(t *testing.T) {
	db, err := kv.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	eng := engine.New(db)
	ctx := context.Background()
	root := func(op, path string) engine.Caller { return engine.Caller{PID: 1, UID: 0, Op: op, Path: path} }
	if err := eng.CreateCockpit(ctx, root("mkdir", "app"), "app"); err != nil {
		t.Fatal(err)
	}
	if err := eng.CreateStack(ctx, root("mkdir", "app/stacks/s"), "app", "s"); err != nil {
		t.Fatal(err)
	}
	before, err := eng.Stack("app", "s")
	if err != nil {
		t.Fatal(err)
	}
	const daemonUID, nobody = 1000, 65534
	f := &FS{eng: eng, started: time.Now(), uid: daemonUID, log: log.New(&logBuffer{}, "", 0)}
	refusal := &engine.Refusal{Code: engine.PermissionDenied, Message: "holder me belongs to uid 0, not 65534", Fix: "run it as uid 0 (or root)"}
	appended := func() uint64 { // lines ever appended to the stack's events
		_, _, seqs, err := eng.EventsWindow("app", "s")
		if err != nil {
			t.Fatal(err)
		}
		if len(seqs) == 0 {
			return 0
		}
		return seqs[len(seqs)-1] + 1
	}
	refuse := func(uid uint32, n int) syscall.Errno {
		return f.fail(engine.Caller{PID: 4242, UID: uid, Op: "write", Path: fmt.Sprintf("app/stacks/s/holders/x%d", n)}, "app", "s", refusal)
	}

	lines0, syncs0, start := appended(), db.Syncs(), time.Now()
	const n = 300
	for i := 1; i <= n; i++ {
		if errno := refuse(nobody, i); errno != syscall.EACCES {
			t.Fatalf("refusal %d: %v, want EACCES", i, errno)
		}
	}
	bound := uint64(eventLinesBurst + int(time.Since(start).Seconds()*eventLinesPerSecond) + 1)
	if syncs := db.Syncs() - syncs0; syncs > bound {
		t.Fatalf("%d refusals of one uid made %d commits, want at most %d (its budget)", n, syncs, bound)
	}
	var last struct {
		Path, Result, Errno string
		UID, Unshown        int
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		window, _, _, err := eng.EventsWindow("app", "s")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(string(window), "\n"), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
			t.Fatal(err)
		}
		if last.Path == fmt.Sprintf("app/stacks/s/holders/x%d", n) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last refusal's line never came; the last line: %s", lines[len(lines)-1])
		}
	}
	if last.Result != "refused" || last.Errno != "EACCES" || last.UID != nobody || last.Unshown == 0 {
		t.Fatalf("the last refusal's line: %+v, want nobody's EACCES saying how many have no line", last)
	}
	// Every refusal is a line, or counted in the unshown of a line after it: the lines the window
	// let go are the burst's first, which count none.
	window, _, _, err := eng.EventsWindow("app", "s")
	if err != nil {
		t.Fatal(err)
	}
	written := appended() - lines0
	kept, counted := 0, 0
	for _, l := range strings.Split(strings.TrimSuffix(string(window), "\n"), "\n") {
		var ev struct{ UID, Unshown int }
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.UID == nobody {
			kept++
			counted += 1 + ev.Unshown
		}
	}
	if total := int(written) - kept + counted; total != n || written > bound+1 {
		t.Fatalf("%d lines written (%d kept) account for %d refusals, want %d in at most %d lines", written, kept, total, n, bound+1)
	}
	after, err := eng.Stack("app", "s")
	if err != nil {
		t.Fatal(err)
	}
	if after.Revision != before.Revision {
		t.Fatalf("refusals moved the stack from revision %d to %d", before.Revision, after.Revision)
	}

	for _, uid := range []uint32{0, daemonUID} {
		for i := 1; i <= 2*eventLinesBurst; i++ {
			lines := appended()
			if errno := refuse(uid, i); errno != syscall.EACCES {
				t.Fatalf("uid %d's refusal %d: %v", uid, i, errno)
			}
			if appended() != lines+1 {
				t.Fatalf("uid %d's refusal %d has no line when its errno returns", uid, i)
			}
		}
	}
}
