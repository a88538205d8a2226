package integration

import (
	"strconv"
	"strings"
	"testing"
)

// blockedWaits is a bash script's part that starts n reads of $S/wait in the background and
// prints "<label> blocked" once each is blocked in the kernel waiting for the daemon's answer.
func blockedWaits(n int, label string) string {
	return `pids=()
		for i in $(seq ` + strconv.Itoa(n) + `); do cat $S/wait & pids+=($!); done
		for p in "${pids[@]}"; do
			until [ "$(cat /proc/$p/wchan 2>/dev/null)" = request_wait_answer ]; do sleep 0.01; done
		done
		echo "` + label + ` blocked"
		`
}

// One user's reads waiting in wait files are bounded (--max-waits-per-uid): past the bound the
// read is refused with ENOMEM and a WAIT_UID_LIMIT line in the stack's events, and changes
// nothing; another user, and root (the daemon's user here) past the bound, wait on regardless;
// every wait returns at the next commit, and the user waits again once its reads have returned.
// Unbounded, 3,000 of one user's blocked reads grew the daemon by 28 MiB.
func TestCoUserWaitsAreBounded(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other", "--max-waits-per-uid", "3")
	m.setupApp(20, map[string]int{"HTTP": 35100})
	asUIDOK(m, 65534, "mkdir $M/app/stacks/n")
	const stack = "app/stacks/n/"
	record := m.read(stack + "record")
	// start runs script with bash as uid, $S the stack's directory.
	start := func(uid int, script string) *reader {
		t.Helper()
		id := strconv.Itoa(uid)
		return startReader(t, m, `exec setpriv --reuid=`+id+` --regid=`+id+` --clear-groups bash -c "$X"`,
			"S="+m.Dir+"/app/stacks/n", "X="+script)
	}
	nobody := start(65534, blockedWaits(3, "nobody")+`if cat $S/wait; then echo "fourth returned"; else echo "fourth refused"; fi
		wait; echo done`)
	waitFor(t, func() string { return "nobody's waits: " + nobody.output() }, func() bool {
		return strings.Contains(nobody.output(), "fourth") || nobody.done()
	})
	if out := nobody.output(); !strings.Contains(out, "fourth refused") || !strings.Contains(out, "Cannot allocate memory") {
		t.Fatalf("nobody's fourth wait beside three blocked: %s", out)
	}
	ev := m.lastEvent(stack + "events")
	for _, want := range []string{`"result":"refused"`, `"code":"WAIT_UID_LIMIT"`, `"errno":"ENOMEM"`, `"uid":65534,`, `"op":"read"`,
		"uid 65534 already has 3 reads waiting in wait files"} {
		if !strings.Contains(ev, want) {
			t.Fatalf("events: want %s in %s", want, ev)
		}
	}
	if got := m.read(stack + "record"); got != record {
		t.Fatalf("the record changed by a refused wait:\nbefore %s\nafter  %s", record, got)
	}

	// Another user, and root past nobody's bound, wait beside nobody's three.
	other := start(pinningUser, blockedWaits(1, "4321")+"wait; echo done")
	root := start(0, blockedWaits(4, "root")+"wait; echo done")
	waitFor(t, func() string { return "the others' waits: " + other.output() + root.output() }, func() bool {
		return strings.Contains(other.output(), "blocked") && strings.Contains(root.output(), "blocked") || other.done() || root.done()
	})
	m.ok("touch $M/app/stacks/n/holders/r")
	for name, r := range map[string]*reader{"nobody": nobody, "4321": other, "root": root} {
		// Each read returns the revision the commit made: the first past 0, the stack's at open.
		out := r.wait(t)
		if want := map[string]int{"nobody": 3, "4321": 1, "root": 4}[name]; countLines(out, "1") != want || !strings.HasSuffix(out, "done\n") {
			t.Fatalf("%s's waits after the commit, want %d lines of revision 1:\n%s", name, want, out)
		}
	}
	// Its reads returned, nobody waits again: this read blocks, refused it would end at once.
	if r := asUID(m, 65534, "timeout 1 cat $M/app/stacks/n/wait"); r.Code != 124 {
		t.Fatalf("nobody's wait once its reads returned: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

// countLines is how many of out's lines are line.
func countLines(out, line string) int {
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if l == line {
			n++
		}
	}
	return n
}
