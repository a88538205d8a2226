package integration

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Issue 34: no user pins, drains or spends the quota of a stack that is not theirs. Root runs
// the daemon with --allow-other; uid 4321 and nobody (65534) are two ordinary users.

const pinningUser = 4321

// asUID runs script with bash as uid (its gid the same, no other groups), from /, with $M set.
func asUID(m *mount, uid int, script string) result {
	m.t.Helper()
	id := strconv.Itoa(uid)
	return shIn(m.t, "/", `exec setpriv --reuid=`+id+` --regid=`+id+` --clear-groups bash -c "$S"`, "M="+m.Dir, "S="+script)
}

func asUIDOK(m *mount, uid int, script string) string {
	m.t.Helper()
	r := asUID(m, uid, script)
	if r.Code != 0 {
		m.t.Fatalf("as uid %d, script failed (exit %d):\n%s\nstdout: %s\nstderr: %s", uid, r.Code, script, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// asUIDRefused wants script, run as uid, to fail with errno's message, leaving the record of the
// stack at stack ("app/stacks/s/") as it was and a refused line of uid with errno and code last
// in its events.
func asUIDRefused(m *mount, uid int, stack, script string, errno syscall.Errno, code string) string {
	m.t.Helper()
	record := m.read(stack + "record")
	r := asUID(m, uid, script)
	if r.Code == 0 || !strings.Contains(strings.ToLower(r.Stderr), errno.Error()) {
		m.t.Fatalf("as uid %d, want refusal %q from:\n%s\ngot exit %d\nstdout: %s\nstderr: %s", uid, errno.Error(), script, r.Code, r.Stdout, r.Stderr)
	}
	if got := m.read(stack + "record"); got != record {
		m.t.Fatalf("%srecord changed by uid %d's refused %s:\nbefore %s\nafter  %s", stack, uid, script, record, got)
	}
	ev := m.lastEvent(stack + "events")
	for _, want := range []string{`"result":"refused"`, `"errno":"` + errnoName(errno) + `"`, `"code":"` + code + `"`, `"uid":` + strconv.Itoa(uid) + `,`} {
		if !strings.Contains(ev, want) {
			m.t.Fatalf("%sevents: want %s in %s", stack, want, ev)
		}
	}
	return ev
}

// A stack is closed to other users until its creator opens it: nobody's pin of uid 4321's stack
// is refused (EACCES) and changes nothing, nor may nobody open it. Once uid 4321 opens it with
// chmod o+w, nobody's pin is accepted, and uid 4321, the stack's creator, removes it and drains
// its stack; it drains a stack whose sole holder is nobody's too.
func TestCoUserCannotPinAStack(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	m.setupApp(20, map[string]int{"HTTP": 34500})
	asUIDOK(m, pinningUser, "mkdir $M/app/stacks/s && echo pid=none checkout=/srv/s > $M/app/stacks/s/holders/me")
	const s = "app/stacks/s/"

	ev := asUIDRefused(m, 65534, s, "echo pid=none checkout=/tmp > $M/app/stacks/s/holders/x", syscall.EACCES, "PERMISSION_DENIED")
	if !strings.Contains(ev, "stack app/s is uid 4321's and closed to uid 65534") || !strings.Contains(ev, "chmod o+w") {
		t.Errorf("the refusal does not say how the stack opens: %s", ev)
	}
	if got := m.ok("ls $M/app/stacks/s/holders"); got != "me\n" {
		t.Fatalf("holders after nobody's refused pin = %q", got)
	}
	if got := m.ok("stat -c '%a %u %g' $M/app/stacks/s"); got != "755 4321 4321\n" {
		t.Fatalf("mode, owner and group of uid 4321's new stack = %q", got)
	}
	asUIDRefused(m, 65534, s, "chmod o+w $M/app/stacks/s", syscall.EACCES, "PERMISSION_DENIED")
	// Only the join bits change: chmod 700 is refused whoever asks.
	asUIDRefused(m, pinningUser, s, "chmod 700 $M/app/stacks/s", syscall.EPERM, "UNSUPPORTED_OPERATION")

	// Its creator opens it to anyone: nobody's pin is accepted now.
	asUIDOK(m, pinningUser, "chmod o+w $M/app/stacks/s")
	if got := m.ok("stat -c %a $M/app/stacks/s"); got != "757\n" {
		t.Fatalf("mode after chmod o+w = %q", got)
	}
	asUIDOK(m, 65534, "echo pid=none checkout=/tmp > $M/app/stacks/s/holders/x")
	// A drain is refused while the pin stands; the creator removes it and drains.
	asUIDRefused(m, pinningUser, s, "echo sleep > $M/app/stacks/s/drain/request", syscall.EBUSY, "CLAIM_CO_TENANT")
	asUIDOK(m, pinningUser, "rm $M/app/stacks/s/holders/x")
	if ev := m.lastEvent(s + "events"); !strings.Contains(ev, `"result":"ok"`) || !strings.Contains(ev, `"uid":4321,`) || !strings.Contains(ev, `"op":"unlink"`) {
		t.Fatalf("the creator's removal of nobody's holder: %s", ev)
	}
	asUIDOK(m, pinningUser, `S=$M/app/stacks/s
		echo sleep > $S/drain/request && echo start pid=none > $S/drain/attempt && echo success > $S/drain/outcome`)
	if got := m.read(s + "lease"); !strings.Contains(got, "released=true") {
		t.Fatalf("the creator's drain did not complete: %s", got)
	}

	// A stack whose only holder is nobody's: its creator drains it all the same.
	asUIDOK(m, pinningUser, "mkdir $M/app/stacks/t && chmod o+w $M/app/stacks/t")
	asUIDOK(m, 65534, "echo pid=none checkout=/tmp > $M/app/stacks/t/holders/x")
	asUIDOK(m, pinningUser, `S=$M/app/stacks/t
		echo sleep > $S/drain/request && echo start pid=none > $S/drain/attempt && echo success > $S/drain/outcome`)
	if got := m.read("app/stacks/t/lease"); !strings.Contains(got, "released=true") {
		t.Fatalf("the creator's drain of nobody's sole holder did not complete: %s", got)
	}
	// Closed again, nobody cannot join; a third user cannot remove the creator's holder.
	asUIDOK(m, pinningUser, "chmod o-w $M/app/stacks/s && echo pid=none checkout=/srv/s > $M/app/stacks/s/holders/me")
	asUIDRefused(m, 65534, s, "touch $M/app/stacks/s/holders/x", syscall.EACCES, "PERMISSION_DENIED")
	asUIDRefused(m, 65534, s, "rm $M/app/stacks/s/holders/me", syscall.EACCES, "PERMISSION_DENIED")
}

// A stack open to its group (chmod g+w) lets in a member of the stack's group, by a
// supplementary group too, and no one else.
func TestCoUserJoinsAStackOpenToItsGroup(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	m.setupApp(20, map[string]int{"HTTP": 34600})
	asUIDOK(m, pinningUser, "mkdir $M/app/stacks/g && echo pid=none checkout=/srv/g > $M/app/stacks/g/holders/me && chmod g+w $M/app/stacks/g")
	const g = "app/stacks/g/"
	asUIDRefused(m, 65534, g, "echo pid=none checkout=/tmp > $M/app/stacks/g/holders/x", syscall.EACCES, "PERMISSION_DENIED")
	// nobody with group 4321 among its supplementary groups is a member.
	r := shIn(t, "/", `exec setpriv --reuid=65534 --regid=65534 --groups=4321 bash -c "$S"`, "M="+m.Dir,
		"S=echo pid=none checkout=/tmp > $M/app/stacks/g/holders/x")
	if r.Code != 0 {
		t.Fatalf("a member of the stack's group joining: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if got := m.ok("stat -c %u $M/app/stacks/g/holders/x"); got != "65534\n" {
		t.Fatalf("st_uid of the member's holder = %q", got)
	}
}

// A lease counts against the uid that holds it now. uid 4321's holder dies; nobody, at its bound
// of one lease, is refused the takeover (EDQUOT); once it drained its own, it takes the stack
// over, and the lease counts against nobody: uid 4321 leases again, nobody does not.
func TestCoUserTakeoverCountsAgainstTaker(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other", "--max-leases-per-uid", "1")
	m.setupApp(20, map[string]int{"HTTP": 34700})
	// uid 4321's holder is held by a process that then exits.
	asUIDOK(m, pinningUser, `mkdir $M/app/stacks/v && chmod o+w $M/app/stacks/v
		sleep 600 & P=$!
		echo pid=$P checkout=/srv/v > $M/app/stacks/v/holders/h
		kill $P; wait $P || true`)
	asUIDOK(m, 65534, "mkdir $M/app/stacks/n1 && echo pid=none checkout=/tmp > $M/app/stacks/n1/holders/n")

	const v = "app/stacks/v/"
	ev := asUIDRefused(m, 65534, v, "echo pid=none checkout=/tmp > $M/app/stacks/v/holders/t", syscall.EDQUOT, "PORT_LEASE_UID_LIMIT")
	if !strings.Contains(ev, "uid 65534 already holds 1 active leases") {
		t.Fatalf("the refused takeover does not say why: %s", ev)
	}
	asUIDOK(m, 65534, `S=$M/app/stacks/n1
		echo sleep > $S/drain/request && echo start pid=none > $S/drain/attempt && echo success > $S/drain/outcome
		echo pid=none checkout=/tmp > $M/app/stacks/v/holders/t`)
	if got := m.ok("ls $M/app/stacks/v/holders"); got != "t\n" {
		t.Fatalf("v's holders after nobody's takeover = %q", got)
	}
	// The victim leases again; the taker is at its bound.
	asUIDOK(m, pinningUser, "mkdir $M/app/stacks/w && echo pid=none checkout=/srv/w > $M/app/stacks/w/holders/h")
	asUIDOK(m, 65534, "mkdir $M/app/stacks/n2")
	asUIDRefused(m, 65534, "app/stacks/n2/", "echo pid=none checkout=/tmp > $M/app/stacks/n2/holders/n", syscall.EDQUOT, "PORT_LEASE_UID_LIMIT")
	m.Stop()
	if out, err := m.verify(); err != nil {
		t.Fatalf("verify after the takeover: %v\n%s", err, out)
	}
}
