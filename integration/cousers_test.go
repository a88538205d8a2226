package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
)

// A co-user (nobody) may name only a process it may signal in its own holder: pid=1 or root's
// process is refused (EACCES) and changes nothing; its own process is accepted. Junk written to
// another user's holder is refused for whose it is (EACCES), not for what it says, and the line
// it leaves quotes no 64 KiB.
func TestCoUserHolderPIDsAndJunk(t *testing.T) {
	m := ownershipMount(t, "--allow-other")
	m.setupApp(20, map[string]int{"HTTP": 33700}, "s1")
	m.ok("touch $M/app/stacks/s1/holders/rootholder && chmod o+w $M/app/stacks/s1")
	const stack = "app/stacks/s1/"
	ownershipNobodyOK(m, "touch $M/app/stacks/s1/holders/nob")

	for _, pid := range []string{"1", strconv.Itoa(m.cmd.Process.Pid)} { // init, and root's daemon
		record := m.read(stack + "record")
		ownershipNobodyRefused(m, "echo pid="+pid+" > $M/app/stacks/s1/holders/nob", syscall.EACCES)
		ownershipDenied(m, stack+"events")
		if ev := m.lastEvent(stack + "events"); !strings.Contains(ev, "may signal") {
			t.Errorf("the refusal does not say why: %s", ev)
		}
		if got := m.read(stack + "record"); got != record {
			t.Fatalf("record changed by a refused pid=%s:\nbefore %s\nafter  %s", pid, record, got)
		}
	}
	// Its own process is fine: the shell that writes it.
	ownershipNobodyOK(m, "echo pid=$$ > $M/app/stacks/s1/holders/nob")

	record := m.read(stack + "record")
	junk := "cat /dev/zero | head -c 65536 | tr '\\0' 'x' > $M/app/stacks/s1/holders/rootholder"
	ownershipNobodyRefused(m, junk, syscall.EACCES)
	ownershipDenied(m, stack+"events")
	if ev := m.lastEvent(stack + "events"); len(ev) > 2000 {
		t.Errorf("the refusal's line is %d bytes", len(ev))
	}
	if got := m.read(stack + "record"); got != record {
		t.Fatalf("record changed by nobody's junk:\nbefore %s\nafter  %s", record, got)
	}
}

// A stack is removed only by its creator or root, a cockpit only by its owner or root: another
// user's rmdir is refused (EACCES), the stack keeps its history, and the cockpit's events say
// who was refused. A stack's directory shows its creator.
func TestCoUserRemovesOnlyWhatIsTheirs(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	m.setupApp(20, map[string]int{"HTTP": 33800}, "rootstack")
	ownershipNobodyOK(m, "mkdir $M/app/stacks/nobstack")
	if got := m.ok("stat -c %u $M/app/stacks/rootstack $M/app/stacks/nobstack"); got != "0\n"+ownershipNobody+"\n" {
		t.Fatalf("st_uid of the stacks root and nobody made = %q", got)
	}

	history := m.read("app/stacks/rootstack/events")
	ownershipNobodyRefused(m, "rmdir $M/app/stacks/rootstack", syscall.EACCES)
	ownershipDenied(m, "app/events")
	if ev := m.lastEvent("app/events"); !strings.Contains(ev, "stack app/rootstack belongs to uid 0") {
		t.Errorf("the refusal does not name the owner: %s", ev)
	}
	if got := m.read("app/stacks/rootstack/events"); got != history {
		t.Fatalf("rootstack's history changed by nobody's refused rmdir:\nbefore %s\nafter  %s", history, got)
	}
	if got := m.ok("ls $M/app/stacks"); got != "nobstack\nrootstack\n" {
		t.Fatalf("stacks after nobody's refused rmdir = %q", got)
	}

	// Nor root's cockpit, once empty of others' stacks: ownership is checked before emptiness.
	ownershipNobodyRefused(m, "rmdir $M/app", syscall.EACCES)
	ownershipDenied(m, "app/events")

	// Its own stack nobody removes; root removes anyone's.
	ownershipNobodyOK(m, "rmdir $M/app/stacks/nobstack")
	ownershipNobodyOK(m, "mkdir $M/app/stacks/nobstack2")
	m.ok("rmdir $M/app/stacks/nobstack2 && rmdir $M/app/stacks/rootstack && rmdir $M/app")
}

// A record written before creators were kept names none: its cockpit's owner stands in. Root's
// stack in nobody's cockpit is root's while its record says so, and nobody's once the record is
// of the old shape.
func TestCoUserStackWithoutCreator(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	ownershipNobodyOK(m, "mkdir $M/nobapp")
	m.ok("mkdir $M/nobapp/stacks/old")
	if got := m.ok("stat -c %u $M/nobapp/stacks/old"); got != "0\n" {
		t.Fatalf("st_uid of root's stack in nobody's cockpit = %q", got)
	}

	m.Stop()
	db, err := kv.Open(m.Data)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(context.Background(), func(tx storage.Txn) error {
		data, err := tx.Get("s/nobapp/old")
		if err != nil {
			return err
		}
		var record map[string]any
		if err := json.Unmarshal(data, &record); err != nil {
			return err
		}
		if record["creator"] != float64(0) {
			return fmt.Errorf("the record's creator is %v, want 0", record["creator"])
		}
		delete(record, "creator")
		if data, err = json.Marshal(record); err != nil {
			return err
		}
		// A store of that release counted no stack either: the next daemon counts it anew.
		for _, key := range []string{"t", "t/0"} {
			if err := tx.Delete(key); err != nil {
				return err
			}
		}
		return tx.Set("s/nobapp/old", data)
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	m.start("--allow-other")
	if got := m.ok("stat -c %u $M/nobapp/stacks/old"); got != ownershipNobody+"\n" {
		t.Fatalf("st_uid of a stack without a creator in nobody's cockpit = %q", got)
	}
	ownershipNobodyOK(m, "rmdir $M/nobapp/stacks/old")
}

// One uid's claims hold at most --max-leases-per-uid active leases, every cockpit counted: past
// it a claim is refused (EDQUOT, PORT_LEASE_UID_LIMIT) and changes nothing, while root still
// leases; a drain of one of the uid's stacks makes room again.
func TestCoUserLeaseBound(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other", "--max-leases-per-uid", "2")
	m.setupApp(20, map[string]int{"HTTP": 33900}, "root1")
	ownershipNobodyOK(m, `for s in n1 n2 n3; do mkdir $M/app/stacks/$s; done
		echo pid=none > $M/app/stacks/n1/holders/nob
		echo pid=none > $M/app/stacks/n2/holders/nob`)

	for _, refused := range []struct{ stack, script string }{
		{"app/stacks/n3/", "echo pid=none > $M/app/stacks/n3/holders/nob"},
		// Its own cockpit counts too: the bound is the machine's, not a cockpit's.
		{"nobapp/stacks/x/", "echo pid=none > $M/nobapp/stacks/x/holders/nob"},
	} {
		if refused.stack == "nobapp/stacks/x/" {
			ownershipNobodyOK(m, "mkdir $M/nobapp && printf '[ports]\\nstep = 10\\ncount = 5\\n[ports.bases]\\nHTTP = 34100\\n' > $M/nobapp/config && mkdir $M/nobapp/stacks/x")
		}
		record := m.read(refused.stack + "record")
		ownershipNobodyRefused(m, refused.script, syscall.EDQUOT)
		ev := m.lastEvent(refused.stack + "events")
		for _, want := range []string{`"result":"refused"`, `"code":"PORT_LEASE_UID_LIMIT"`, `"errno":"EDQUOT"`, `"uid":65534`, "uid 65534 already holds 2 active leases"} {
			if !strings.Contains(ev, want) {
				t.Errorf("%sevents: want %s in %s", refused.stack, want, ev)
			}
		}
		if got := m.read(refused.stack + "record"); got != record {
			t.Fatalf("record changed by a refused claim:\nbefore %s\nafter  %s", record, got)
		}
	}
	if got := m.ok("ls $M/ports"); got != "33900\n33910\n" {
		t.Fatalf("ports after nobody's refused claims = %q, want its two leases'", got)
	}

	// Root is not bounded, and finds the families nobody could not take.
	m.ok("touch $M/app/stacks/root1/holders/r && mkdir $M/app/stacks/root2 && touch $M/app/stacks/root2/holders/r && mkdir $M/app/stacks/root3 && touch $M/app/stacks/root3/holders/r")

	// A drained stack's lease no longer counts.
	ownershipNobodyOK(m, `S=$M/app/stacks/n1
		echo sleep > $S/drain/request && echo start pid=none > $S/drain/attempt && echo success > $S/drain/outcome
		echo pid=none > $M/app/stacks/n3/holders/nob`)
	if got := m.read("app/stacks/n3/ports/HTTP"); got != "33900\n" {
		t.Fatalf("n3's HTTP once n1 was drained = %q", got)
	}
}

// A cockpit's owner removes any idle stack of it, whoever made it, so that no other user can fill
// it with its 1024 stacks and leave the owner unable to make one; a stack with a holder stays
// (EBUSY), and a third user may not (EACCES). Each refusal changes nothing and leaves a line.
func TestCoUserCockpitOwnerRemovesOthersStacks(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	ownershipNobodyOK(m, `mkdir $M/nobapp && printf '[ports]\nstep = 10\ncount = 5\n[ports.bases]\nHTTP = 34200\n' > $M/nobapp/config`)
	asUIDOK(m, pinningUser, "mkdir $M/nobapp/stacks/a $M/nobapp/stacks/b $M/nobapp/stacks/held && echo pid=none > $M/nobapp/stacks/held/holders/h")

	r := asUID(m, 4322, "rmdir $M/nobapp/stacks/a") // a third user, who owns nothing here
	if r.Code == 0 || !strings.Contains(r.Stderr, "Permission denied") {
		t.Fatalf("a third user's rmdir: exit %d, %q", r.Code, r.Stderr)
	}
	if ev := m.lastEvent("nobapp/events"); !strings.Contains(ev, `"errno":"EACCES"`) || !strings.Contains(ev, "stack nobapp/a belongs to uid 4321, not 4322") || !strings.Contains(ev, "as its cockpit's owner (uid 65534)") {
		t.Fatalf("nobapp/events after the third user's rmdir: %s", ev)
	}

	record := m.read("nobapp/stacks/held/record")
	ownershipNobodyRefused(m, "rmdir $M/nobapp/stacks/held", syscall.EBUSY)
	if ev := m.lastEvent("nobapp/events"); !strings.Contains(ev, `"code":"CLAIM_CO_TENANT"`) || !strings.Contains(ev, `"uid":65534`) {
		t.Fatalf("nobapp/events after the owner's rmdir of a held stack: %s", ev)
	}
	if got := m.read("nobapp/stacks/held/record"); got != record {
		t.Fatalf("the held stack changed:\nbefore %s\nafter  %s", record, got)
	}
	ownershipNobodyOK(m, "rmdir $M/nobapp/stacks/a $M/nobapp/stacks/b")
	if got := m.ok("ls $M/nobapp/stacks"); got != "held\n" {
		t.Fatalf("stacks after the owner's rmdir = %q", got)
	}
}

// One uid may have made at most --max-stacks-per-uid stacks that exist, every cockpit counted:
// past it mkdir is refused (EDQUOT, STACK_UID_LIMIT in the cockpit's events) and changes
// nothing, while root still makes stacks; an rmdir of one of the uid's makes room, and the count
// is kept across a restart.
func TestCoUserStackBound(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other", "--max-stacks-per-uid", "2")
	m.setupApp(20, map[string]int{"HTTP": 34400})
	ownershipNobodyOK(m, "mkdir $M/nob $M/app/stacks/n1 $M/nob/stacks/n2")
	before := m.ok("ls $M/app/stacks $M/nob/stacks")
	ownershipNobodyRefused(m, "mkdir $M/app/stacks/n3", syscall.EDQUOT)
	if got := m.ok("ls $M/app/stacks $M/nob/stacks"); got != before {
		t.Fatalf("stacks after a refused mkdir:\n%s\nbefore:\n%s", got, before)
	}
	ev := m.lastEvent("app/events")
	for _, want := range []string{`"op":"mkdir"`, `"uid":65534`, `"result":"refused"`, `"code":"STACK_UID_LIMIT"`, `"errno":"EDQUOT"`, "uid 65534 already made 2 stacks"} {
		if !strings.Contains(ev, want) {
			t.Fatalf("app/events: want %s in %s", want, ev)
		}
	}
	m.ok("mkdir $M/app/stacks/r1 $M/app/stacks/r2 $M/app/stacks/r3") // root is not bounded
	m.Stop()
	m.start(m.args...)
	ownershipNobodyRefused(m, "mkdir $M/nob/stacks/n3", syscall.EDQUOT)
	ownershipNobodyOK(m, "rmdir $M/app/stacks/n1 && mkdir $M/nob/stacks/n3")
	m.Stop()
	if out, err := m.verify(); err != nil {
		t.Fatalf("verify: %v\n%s", err, out)
	}
}

// One uid may have made at most --max-cockpits-per-uid cockpits that exist: past it mkdir is
// refused (EDQUOT, COCKPIT_UID_LIMIT in the daemon's log, at most 10 lines a minute: no cockpit's
// events take it) and changes nothing, while root still makes cockpits; an rmdir of one of the
// uid's makes room.
func TestCoUserCockpitBound(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other", "--max-cockpits-per-uid", "2")
	ownershipNobodyOK(m, "mkdir $M/n1 $M/n2")
	before, logged := m.ok("ls $M"), len(m.log.String())
	ownershipNobodyRefused(m, "mkdir $M/n3", syscall.EDQUOT)
	if got := m.ok("ls $M"); got != before {
		t.Fatalf("the root after a refused mkdir:\n%s\nbefore:\n%s", got, before)
	}
	line := m.log.String()[logged:]
	for _, want := range []string{"mkdir n3: EDQUOT", "COCKPIT_UID_LIMIT", "uid 65534 already has 2 cockpits", "--max-cockpits-per-uid"} {
		if !strings.Contains(line, want) {
			t.Errorf("the daemon's log: want %q in %q", want, line)
		}
	}
	// A loop of refused mkdirs logs at most 10 lines a minute (the log is in the data
	// directory, beside the store): the rest are counted, not written.
	logged = len(m.log.String())
	ownershipNobodyOK(m, "for i in $(seq 300); do mkdir $M/flood$i 2>/dev/null; done; true")
	if n := strings.Count(m.log.String()[logged:], "COCKPIT_UID_LIMIT"); n > 9 {
		t.Errorf("300 refused mkdirs logged %d lines of 10 a minute (one taken before)", n)
	}
	if got := m.ok("ls $M"); got != before {
		t.Fatalf("the root after refused mkdirs:\n%s\nbefore:\n%s", got, before)
	}
	m.ok("mkdir $M/r1 $M/r2 $M/r3") // root is not bounded
	ownershipNobodyOK(m, "rmdir $M/n1 && mkdir $M/n3")
	m.Stop()
	if out, err := m.verify(); err != nil {
		t.Fatalf("verify: %v\n%s", err, out)
	}
}

// Another uid's refusals keep a window of their own (its last refusalsKept lines), and past its
// budget of lines (fs's eventBudget) are counted instead: 300 of them in a loop, each refused,
// leave the owner's history and the owner's own refusal in the stack's events; the last of them
// has its line, saying how many before it have none, so that each is a line or counted in the
// next; and a tail -f that followed throughout read every line it was shown once, in order,
// ending with the owner's next change.
func TestCoUserRefusalsKeepOwnersHistory(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	m.setupApp(20, map[string]int{"HTTP": 34300}, "s")
	const events = "app/stacks/s/events"
	m.ok("touch $M/app/stacks/s/holders/a && touch $M/app/stacks/s/holders/b && echo pid=none > $M/app/stacks/s/holders/a && rm $M/app/stacks/s/holders/b")
	m.refused("rm $M/app/stacks/s/holders/a", syscall.EBUSY) // root's own refusal: the final holder
	before := strings.Split(strings.TrimSuffix(m.read(events), "\n"), "\n")
	if len(before) != 5 {
		t.Fatalf("the owner's events: %d lines, want 5:\n%s", len(before), strings.Join(before, "\n"))
	}
	record := m.read("app/stacks/s/record")
	follower := startReader(t, m, "tail -n +1 -f $M/"+events)
	waitFor(t, func() string { return "tail to show the history: " + follower.output() }, func() bool { return strings.Count(follower.output(), "\n") == 5 })

	r := ownershipAsNobody(m, `for i in {1..300}; do : > $M/app/stacks/s/x$i; done 2>&1 | grep -c "Operation not permitted"`)
	if r.Code != 0 || strings.TrimSpace(r.Stdout) != "300" {
		t.Fatalf("nobody's writes: exit %d, %s of 300 refused EPERM: %s", r.Code, strings.TrimSpace(r.Stdout), r.Stderr)
	}
	lastIs := func(name string) func() bool {
		return func() bool { return strings.Contains(m.lastEvent(events), "/"+name+`"`) }
	}
	waitFor(t, func() string { return "the line of nobody's last refusal: " + m.lastEvent(events) }, lastIs("x300"))
	ownershipNobodyRefused(m, ": > $M/app/stacks/s/x301", syscall.EPERM)
	waitFor(t, func() string { return "the line of nobody's next refusal: " + m.lastEvent(events) }, lastIs("x301"))
	if got := m.read("app/stacks/s/record"); got != record {
		t.Fatalf("nobody's refusals changed the record:\n%s\nbefore:\n%s", got, record)
	}
	m.ok("touch $M/app/stacks/s/holders/c") // the owner's next change

	after := strings.Split(strings.TrimSuffix(m.read(events), "\n"), "\n")
	if got := strings.Join(after[:5], "\n"); got != strings.Join(before, "\n") {
		t.Fatalf("the owner's history changed:\nbefore\n%s\nafter\n%s", strings.Join(before, "\n"), got)
	}
	last := after[len(after)-1]
	if !strings.Contains(last, `"result":"ok"`) || !strings.Contains(last, "holders/c") {
		t.Fatalf("events end %s, want the owner's change", last)
	}
	// Nobody's lines: at most its window, in order, each saying how many refusals since the one
	// before it have no line (x300's some: the loop outran the budget; x301's none).
	nobodys := after[5 : len(after)-1]
	if len(nobodys) > refusalsKept {
		t.Fatalf("nobody's refusals kept: %d lines, want at most %d", len(nobodys), refusalsKept)
	}
	prev := 0
	for i, line := range nobodys {
		var ev struct {
			Path, Result, Errno string
			UID, Unshown        int
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatal(err)
		}
		x := xNumber(ev.Path[strings.LastIndexByte(ev.Path, '/')+1:])
		if ev.UID != 65534 || ev.Result != "refused" || ev.Errno != "EPERM" || (i > 0 && x != prev+1+ev.Unshown) {
			t.Fatalf("nobody's line after x%d: %s", prev, line)
		}
		if x == 300 && ev.Unshown == 0 {
			t.Fatalf("300 refusals in a loop, each a line of its own: %s", line)
		}
		prev = x
	}
	if prev != 301 || strings.Contains(nobodys[len(nobodys)-1], "unshown") {
		t.Fatalf("nobody's last line %s, want x301's with no count", nobodys[len(nobodys)-1])
	}

	waitFor(t, func() string { return "tail to show the owner's next change: " + follower.output() }, func() bool { return strings.Contains(follower.output(), "holders/c") })
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSuffix(follower.output(), "\n"), "\n") {
		var ev struct{ At, Path string }
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("tail -f read a broken line %q: %v", line, err)
		}
		if seen[ev.At+ev.Path] {
			t.Fatalf("tail -f read %s twice", line)
		}
		seen[ev.At+ev.Path] = true
	}
	if x := followedNames(follower.output(), "x"); !sort.SliceIsSorted(x, func(i, j int) bool { return xNumber(x[i]) < xNumber(x[j]) }) || len(x) == 0 || x[len(x)-1] != "x301" {
		t.Fatalf("tail -f showed nobody's refusals out of order or without the last: %v", x)
	}
}

// refusalsKept is how many refusals of one uid an events file keeps (engine's refusalsKept).
const refusalsKept = 32

func xNumber(name string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(name, "x"))
	return n
}
