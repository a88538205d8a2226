package integration

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Issue 34: one user's open files cannot exhaust the daemon's memory. Opens of one content of a
// file share one snapshot, counted once; past --max-open-bytes-per-uid of distinct snapshots a
// uid's open is refused (ENOMEM, OPEN_SNAPSHOT_LIMIT) while another uid opens the same file; once
// the opens close, the uid opens again.
func TestCoUserOpensAreBounded(t *testing.T) {
	t.Parallel()
	// 200 opens of 512 bytes each (what the daemon keeps of an open) and a record of a few
	// hundred, then room for about twenty more.
	const limit = 120000
	m := ownershipMount(t, "--allow-other", "--max-open-bytes-per-uid", strconv.Itoa(limit))
	m.setupApp(20, map[string]int{"HTTP": 34800})
	asUIDOK(m, 65534, "mkdir $M/app/stacks/n && echo pid=none checkout=/srv/n > $M/app/stacks/n/holders/h")

	// nobody holds 200 opens of one revision of its stack's record, then one open of each new
	// revision (a holder added or removed between them) until one is refused, and keeps them
	// until its input closes. Its sizes are read through the descriptors it holds: no other open
	// of nobody's is in flight.
	script := `S=$M/app/stacks/n
		for i in $(seq 200); do exec {fd}<$S/record || exit 1; done
		held=$(wc -c <&$fd)
		for i in $(seq 100); do
			if (( i % 2 )); then echo pid=none checkout=/tmp/b > $S/holders/b; else rm $S/holders/b; fi || exit 1
			if ! exec {fd}<$S/record; then echo "refused held=$held opens=$((199 + i))"; read -r; exit 0; fi
			held=$((held + $(wc -c <&$fd)))
		done
		echo "never refused held=$held"`
	nobody, release := startAsNobody(m, "bash", "-c", script)
	defer release.Close()
	waitFor(t, func() string { return "nobody's opens: " + nobody.output() }, func() bool {
		return strings.Contains(nobody.output(), "refused") || nobody.done()
	})
	out := nobody.output()
	found := regexp.MustCompile(`(?m)^refused held=(\d+) opens=(\d+)$`).FindStringSubmatch(out)
	if found == nil || !strings.Contains(out, "Cannot allocate memory") {
		t.Fatalf("nobody's opens were never refused ENOMEM:\n%s", out)
	}
	held, _ := strconv.Atoi(found[1])
	opens, _ := strconv.Atoi(found[2])
	if held+opens*512 > limit {
		t.Fatalf("nobody's opens held %d bytes before the refusal, past the bound of %d", held, limit)
	}

	// The daemon counted what nobody held as nobody did: 200 opens of one revision once, and
	// 512 bytes for each open.
	const stack = "app/stacks/n/"
	ev := m.lastEvent(stack + "events")
	for _, want := range []string{`"result":"refused"`, `"code":"OPEN_SNAPSHOT_LIMIT"`, `"errno":"ENOMEM"`, `"uid":65534,`, `"op":"open"`,
		"uid 65534's open files already hold " + strconv.Itoa(held+opens*512) + " bytes (the contents they saw, what they wrote and the directories they list); this open would take"} {
		if !strings.Contains(ev, want) {
			t.Fatalf("events: want %s in %s", want, ev)
		}
	}
	record := m.read(stack + "record")
	// Another uid is unaffected: uid 4321 and root read the record nobody may not open again.
	if got := asUIDOK(m, pinningUser, "cat $M/app/stacks/n/record"); got != record {
		t.Fatalf("uid 4321 reads %q, root %q", got, record)
	}
	if r := asUID(m, 65534, "cat $M/app/stacks/n/record"); r.Code == 0 || !strings.Contains(r.Stderr, "Cannot allocate memory") {
		t.Fatalf("nobody's next open at its bound: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if got := m.read(stack + "record"); got != record {
		t.Fatalf("the record changed by refused opens:\nbefore %s\nafter  %s", record, got)
	}

	// Closed, they hold nothing: nobody opens again once the kernel has released them.
	release.Close()
	nobody.wait(t)
	waitFor(t, func() string { return "nobody's open after its opens closed" }, func() bool {
		return asUID(m, 65534, "cat $M/app/stacks/n/record >/dev/null").Code == 0
	})
}

// What an open writes counts with what its uid's opens hold: one user's write opens of a config,
// each holding a 60 KB document, are refused past --max-open-bytes-per-uid (ENOMEM,
// OPEN_SNAPSHOT_LIMIT in the cockpit's events), the refused open's document is never applied, and
// once they close the user writes again. Uncounted, 3,000 such opens held 245 MiB of the daemon.
func TestCoUserWritesAreBounded(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other", "--max-open-bytes-per-uid", "200000")
	asUIDOK(m, 65534, `mkdir $M/nob && printf '[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 34900\n' > $M/nob/config`)
	config := m.read("nob/config")
	// Open i writes a document of its own (HTTP = 3490i) and stays open: the first three fit in
	// 200,000 bytes, the fourth's write is refused; all close as the script exits.
	out := asUIDOK(m, 65534, `pad=$(head -c 60000 /dev/zero | tr '\0' x)
		for i in 1 2 3 4 5; do
			exec {fd}>$M/nob/config || exit 1
			if ! printf '[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 3490%d\n#%s\n' $i "$pad" >&$fd; then
				echo "refused at $i"; cat $M/nob/config; exit 0
			fi
		done
		echo never refused`)
	if !strings.HasPrefix(out, "refused at 4\n") {
		t.Fatalf("nobody's write opens: %q, want the fourth refused", out)
	}
	if got := strings.TrimPrefix(out, "refused at 4\n"); got != config {
		t.Fatalf("config while the opens were held: %q, want %q", got, config)
	}
	// Its line comes before the accepted documents' own, applied as the opens closed.
	var refusals []string
	for _, line := range strings.Split(m.read("nob/events"), "\n") {
		if strings.Contains(line, `"result":"refused"`) {
			refusals = append(refusals, line)
		}
	}
	if len(refusals) != 1 {
		t.Fatalf("nob/events: %d refusals, want the fourth write's:\n%s", len(refusals), strings.Join(refusals, "\n"))
	}
	for _, want := range []string{`"op":"write"`, `"path":"nob/config"`, `"uid":65534`, `"code":"OPEN_SNAPSHOT_LIMIT"`, `"errno":"ENOMEM"`, "this write would take"} {
		if !strings.Contains(refusals[0], want) {
			t.Fatalf("nob/events: want %s in %s", want, refusals[0])
		}
	}
	// Closed, the accepted documents applied (whichever closed last) and the refused one never.
	if got := m.read("nob/config"); !regexp.MustCompile(`HTTP = 3490[123]\n`).MatchString(got) {
		t.Fatalf("config after the opens closed:\n%.200s", got)
	}
	waitFor(t, func() string { return "nobody's write after its opens closed" }, func() bool {
		return asUID(m, 65534, `printf '[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 34990\n' > $M/nob/config`).Code == 0
	})
	if got := m.read("nob/config"); !strings.Contains(got, "HTTP = 34990\n") {
		t.Fatalf("config after nobody's last write:\n%s", got)
	}
}

// An append (>>) open copies the document to continue it, and the copy counts too: at its bound a
// uid's append open of its own 60 KB config is refused (ENOMEM, OPEN_SNAPSHOT_LIMIT) and holds
// nothing: once the write open closes, config is what it wrote, and the uid appends again.
func TestCoUserAppendOpenIsBounded(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other", "--max-open-bytes-per-uid", "150000")
	const doc = `printf '[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 3480%d\n#%s\n' $i "$(head -c 60000 /dev/zero | tr '\0' x)"`
	asUIDOK(m, 65534, "mkdir $M/nob && i=0 && "+doc+" > $M/nob/config")
	// A write open holds the config's snapshot (60 KB) and its document: 120 KB. An append open
	// shares the snapshot, and its copy would make 180 KB.
	out := asUIDOK(m, 65534, `i=1; exec {fd}>$M/nob/config && `+doc+` >&$fd || exit 1
		if exec {a}>>$M/nob/config; then echo "append opened"; else echo refused; fi`)
	if out != "refused\n" {
		t.Fatalf("nobody's append open at its bound: %q", out)
	}
	var refusal string
	for _, line := range strings.Split(m.read("nob/events"), "\n") {
		if strings.Contains(line, `"result":"refused"`) {
			refusal = line
		}
	}
	for _, want := range []string{`"op":"open"`, `"uid":65534`, `"code":"OPEN_SNAPSHOT_LIMIT"`, `"errno":"ENOMEM"`, "this append would take"} {
		if !strings.Contains(refusal, want) {
			t.Fatalf("nob/events: want %s in the refusal %s", want, refusal)
		}
	}
	if got := m.read("nob/config"); !regexp.MustCompile(`HTTP = 34801\n`).MatchString(got) {
		t.Fatalf("config after the opens closed:\n%.200s", got)
	}
	asUIDOK(m, 65534, "echo '# appended' >> $M/nob/config")
	if got := m.read("nob/config"); !strings.HasSuffix(got, "\n# appended\n") {
		t.Fatalf("config after nobody's append: %.200q", got[max(0, len(got)-100):])
	}
}

// A directory open's list of names counts with its uid's open bytes: each open keeps a list of
// its own until it closes. Past the bound one user's opendir+readdir is refused (ENOMEM,
// OPEN_SNAPSHOT_LIMIT, op readdir, in the cockpit's events) and lists nothing; another user lists
// on; the stacks are unchanged; once the directories close the user lists again. Uncounted, 5,000
// of one user's opens of a directory of 1,000 stacks held 800 MiB of the daemon.
func TestCoUserListingsAreBounded(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other", "--max-open-bytes-per-uid", "200000")
	m.setupApp(20, map[string]int{"HTTP": 35200})
	m.ok("for i in $(seq 300); do mkdir $M/app/stacks/a-stack-with-a-longer-name-$i; done")
	names := m.ok("ls $M/app/stacks")
	// nobody opens the directory and reads its first entries, again and again, keeping each open.
	out := asUIDOK(m, 65534, `/usr/bin/python3 -c '
import os, sys
held = []
for i in range(1000):
    try:
        it = os.scandir(sys.argv[1]); next(it); held.append(it)
    except OSError as e:
        print("refused at", len(held) + 1, e.strerror); break
else:
    print("never refused")
' $M/app/stacks`)
	if !strings.HasPrefix(out, "refused at ") || !strings.Contains(out, "Cannot allocate memory") {
		t.Fatalf("nobody's directory opens: %q", out)
	}
	// 300 entries cost ≈ 40 bytes each and their names: a handful of opens fits in 200,000 bytes.
	if n, _ := strconv.Atoi(strings.Fields(out)[2]); n < 3 || n > 30 {
		t.Fatalf("refused at the %dth open, not after the few 200,000 bytes hold", n)
	}
	ev := m.lastEvent("app/events")
	for _, want := range []string{`"result":"refused"`, `"code":"OPEN_SNAPSHOT_LIMIT"`, `"errno":"ENOMEM"`, `"uid":65534,`, `"op":"readdir"`,
		"the directories they list", "this listing would take"} {
		if !strings.Contains(ev, want) {
			t.Fatalf("events: want %s in %s", want, ev)
		}
	}
	if got := asUIDOK(m, pinningUser, "ls $M/app/stacks"); got != names {
		t.Fatalf("uid 4321 lists %q", got)
	}
	if got := m.ok("ls $M/app/stacks"); got != names {
		t.Fatalf("the stacks changed: %q", got)
	}
	// Closed (the script exited), they hold nothing.
	waitFor(t, func() string { return "nobody's listing once its directories closed" }, func() bool {
		return asUID(m, 65534, "ls $M/app/stacks").Stdout == names
	})
}

// Every open counts with its uid's open bytes, an open of an empty file too: 512 bytes, what the
// daemon keeps of it. One user's opens of a stack's wait file are refused past the bound (ENOMEM,
// OPEN_SNAPSHOT_LIMIT, op open, in the stack's events), another user opens on, and once they
// close the user opens again. Uncounted, 20,000 opens of a wait file held 6.8 MiB.
func TestCoUserEmptyOpensAreBounded(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other", "--max-open-bytes-per-uid", "20000")
	m.setupApp(20, map[string]int{"HTTP": 35300})
	asUIDOK(m, 65534, "mkdir $M/app/stacks/n")
	record := m.read("app/stacks/n/record")
	out := asUIDOK(m, 65534, `/usr/bin/python3 -c '
import os, sys
held = []
for i in range(1000):
    try:
        held.append(os.open(sys.argv[1], os.O_RDONLY))
    except OSError as e:
        print("refused at", len(held) + 1, e.strerror); break
else:
    print("never refused")
' $M/app/stacks/n/wait`)
	if want := "refused at 40 Cannot allocate memory\n"; out != want { // 39 × 512 ≤ 20,000 < 40 × 512
		t.Fatalf("nobody's opens of wait: %q, want %q", out, want)
	}
	ev := m.lastEvent("app/stacks/n/events")
	for _, want := range []string{`"result":"refused"`, `"code":"OPEN_SNAPSHOT_LIMIT"`, `"errno":"ENOMEM"`, `"uid":65534,`, `"op":"open"`,
		"already hold 19968 bytes"} {
		if !strings.Contains(ev, want) {
			t.Fatalf("events: want %s in %s", want, ev)
		}
	}
	if got := m.read("app/stacks/n/record"); got != record {
		t.Fatalf("the record changed: %q", got)
	}
	asUIDOK(m, pinningUser, "exec 3<$M/app/stacks/n/wait")
	waitFor(t, func() string { return "nobody's open once its opens closed" }, func() bool {
		return asUID(m, 65534, "exec 3<$M/app/stacks/n/wait").Code == 0
	})
}

// What an open of an events file holds of its own once it follows the file (the lines appended
// since, with those it saw) counts with its uid's open bytes: one user's opens of its cockpit's
// events, read again after the file moved on, are refused past the bound (ENOMEM,
// OPEN_SNAPSHOT_LIMIT, op read), and another user follows the file on.
func TestCoUserFollowedOpensAreBounded(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other", "--max-open-bytes-per-uid", "300000")
	out := asUIDOK(m, 65534, `mkdir $M/nob && printf '[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 35400\n' > $M/nob/config &&
		/usr/bin/python3 -c '
import os, sys
events, stacks = sys.argv[1], sys.argv[2]
def commits(n):
    for i in range(n):
        os.mkdir(stacks + "/x"); os.rmdir(stacks + "/x")
commits(100)
fds = [os.open(events, os.O_RDONLY) for i in range(40)]
for fd in fds:
    while os.read(fd, 1 << 16): pass
commits(100)
for n, fd in enumerate(fds):
    try:
        while os.read(fd, 1 << 16): pass
    except OSError as e:
        print("refused at", n + 1, e.strerror); break
else:
    print("never refused")
' $M/nob/events $M/nob/stacks`)
	if !strings.HasPrefix(out, "refused at ") || !strings.Contains(out, "Cannot allocate memory") {
		t.Fatalf("nobody's reads of the events it follows: %q", out)
	}
	ev := m.lastEvent("nob/events")
	for _, want := range []string{`"result":"refused"`, `"code":"OPEN_SNAPSHOT_LIMIT"`, `"errno":"ENOMEM"`, `"uid":65534,`, `"op":"read"`,
		"this follow would take"} {
		if !strings.Contains(ev, want) {
			t.Fatalf("events: want %s in %s", want, ev)
		}
	}
	// uid 4321 reads the same file, the refusal its last line.
	if got := asUIDOK(m, pinningUser, "tail -n 1 $M/nob/events"); got != ev+"\n" {
		t.Fatalf("uid 4321's tail: %q, want %q", got, ev)
	}
}

// A file rendered from a stack's record (record, revision, lease, env…) is a node per content,
// which the kernel keeps as long as anything holds its inode: an inotify watch holds it for good.
// Only the latest nodes of a path keep their content (fs/frozen.go): nobody's watch on each new
// revision of a 120 KB record used to keep every revision in the daemon that serves everybody
// (one user took it to a gigabyte), and now keeps about a kilobyte a revision. An older node
// still opens through a descriptor of it (/dev/fd/3) with the content it had.
func TestCoUserWatchesPinNoContent(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	m.setupApp(20, map[string]int{"HTTP": 35500})
	const stack = "app/stacks/n/"
	// 30 holders with checkouts of 3.9 KB each: a record of about 120 KB.
	asUIDOK(m, 65534, `mkdir $M/app/stacks/n && /usr/bin/python3 -c '
import sys
for i in range(30):
    checkout = "/srv/h%02d" % i + ("/" + "x" * 200) * 19
    with open(sys.argv[1] + "/holders/h%02d" % i, "w") as f: f.write("pid=none checkout=" + checkout + "\n")
' $M/app/stacks/n`)
	record := m.read(stack + "record")
	if len(record) < 120000 {
		t.Fatalf("the record has %d bytes, want over 120,000", len(record))
	}

	// A descriptor of an old revision opens again with what it had, past newer revisions.
	out := m.ok(`S=$M/app/stacks/n; exec 3<$S/record
		for i in 1 2 3; do echo pid=none checkout=/tmp/b > $S/holders/b$i && cat $S/record >/dev/null || exit 1; done
		cat /dev/fd/3; rm $S/holders/b1 $S/holders/b2 $S/holders/b3`)
	if out != record {
		t.Fatalf("/dev/fd/3 of the first revision read %d bytes, want the %d it had", len(out), len(record))
	}

	before := liveHeap(m)
	// nobody watches record at each of 80 revisions (a holder added or removed), and keeps
	// the watches until its input closes.
	watcher, release := startAsNobody(m, "/usr/bin/python3", "-c", `
import ctypes, os, sys
libc = ctypes.CDLL("libc.so.6", use_errno=True)
inotify = libc.inotify_init1(0)
S = sys.argv[1]
for i in range(80):
    if i % 2 == 0:
        with open(S + "/holders/b", "w") as f: f.write("pid=none checkout=/tmp/b\n")
    else:
        os.unlink(S + "/holders/b")
    if libc.inotify_add_watch(inotify, (S + "/record").encode(), 2) < 0:
        print("watch refused", os.strerror(ctypes.get_errno()), flush=True); sys.exit(1)
print("watching", flush=True)
sys.stdin.read()
`, m.Path("app/stacks/n"))
	defer release.Close()
	waitFor(t, func() string { return "nobody's watches: " + watcher.output() }, func() bool {
		return strings.Contains(watcher.output(), "watching") || watcher.done()
	})
	if !strings.Contains(watcher.output(), "watching") {
		t.Fatalf("nobody's watcher: %s", watcher.output())
	}
	// Every revision's content kept would be 80 × 120 KB: 9.6 MB. A node keeps its content for
	// a second once a newer one is looked up, so the heap is read until that is past.
	var after int64
	waitFor(t, func() string {
		return fmt.Sprintf("the daemon's live heap grew by %d bytes (%d → %d) with nobody's watches on 80 revisions", after-before, before, after)
	}, func() bool {
		after = liveHeap(m)
		return after-before < 3<<20
	})
}

// liveHeap is the daemon's live heap after a collection, from the stats line a SIGUSR1 logs.
func liveHeap(m *mount) int64 {
	m.t.Helper()
	stats := regexp.MustCompile(`stats: goroutines=\d+ heap_live=(\d+) `)
	logged := len(stats.FindAllString(m.log.String(), -1))
	if err := m.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		m.t.Fatal(err)
	}
	var live int64
	waitFor(m.t, func() string { return "the daemon's stats line:\n" + m.log.String() }, func() bool {
		all := stats.FindAllStringSubmatch(m.log.String(), -1)
		if len(all) <= logged {
			return false
		}
		live, _ = strconv.ParseInt(all[len(all)-1][1], 10, 64)
		return true
	})
	return live
}

// startAsNobody runs argv as uid 65534 with $M set, its input a pipe it reads until release (the
// returned end) is closed; it is killed when the test ends.
func startAsNobody(m *mount, argv ...string) (r *reader, release *os.File) {
	m.t.Helper()
	r = &reader{cmd: exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups"}, argv...)...),
		out: &syncBuffer{}, exit: make(chan struct{})}
	r.cmd.Env = append(r.cmd.Environ(), "M="+m.Dir)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	stdin, release, err := os.Pipe()
	if err != nil {
		m.t.Fatal(err)
	}
	defer stdin.Close()
	r.cmd.Stdin = stdin
	if err := r.cmd.Start(); err != nil {
		release.Close()
		m.t.Fatal(err)
	}
	go func() { r.cmd.Wait(); close(r.exit) }()
	m.t.Cleanup(func() { r.cmd.Process.Kill(); <-r.exit })
	return r, release
}
