package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/cockpitfs/cockpitfs/kv"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// Whole or nothing (docs/integrity.md#whole-or-nothing): a control file applies whole lines, a
// write cut by the writer's buffer joined with the rest; a writer killed before its close applies
// nothing.

// downRequest is a `down` drain request of exactly size bytes, its newline included: targets
// volume:v000 … padded with spaces (tokens are separated by white space), and how many targets.
func downRequest(size int) (string, int) {
	var b strings.Builder
	b.WriteString("down")
	n := 0
	for b.Len()+len(" volume:v000")+1 <= size {
		fmt.Fprintf(&b, " volume:v%03d", n)
		n++
	}
	b.WriteString(strings.Repeat(" ", size-1-b.Len()))
	return b.String() + "\n", n
}

// The 4 KiB boundary, with each common writer: a request of 4095 to 8193 bytes reserves its every
// target, whether the writer writes it in one write(2) (dash, python, printf, a fresh bash) or in
// 4,096-byte pieces (bash once its stdout buffer was sized by an earlier output); nothing is
// reserved from a piece.
func TestWholeLinesAtTheBufferBoundary(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "strace")
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 39480}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	dir := t.TempDir()
	writers := map[string]string{
		"bash":          `bash -c 'echo "$1" > "$2"' bash "$(cat $REQ)" $M/app/stacks/s/drain/request`,
		"bash-cut":      `bash -c 'echo >/dev/null; echo "$1" > "$2"' bash "$(cat $REQ)" $M/app/stacks/s/drain/request`,
		"dash":          `dash -c 'echo "$1" > "$2"' dash "$(cat $REQ)" $M/app/stacks/s/drain/request`,
		"python":        `python3 -c 'import sys; print(open(sys.argv[1]).read(), end="", file=open(sys.argv[2], "w"))' $REQ $M/app/stacks/s/drain/request`,
		"printf":        `/usr/bin/printf '%s\n' "$(cat $REQ)" > $M/app/stacks/s/drain/request`,
		"bash-printf":   `bash -c 'printf "%s\n" "$1" > "$2"' bash "$(cat $REQ)" $M/app/stacks/s/drain/request`,
		"bash-cut-rest": `bash -c 'printf x >/dev/null; printf "%s\n" "$1" > "$2"' bash "$(cat $REQ)" $M/app/stacks/s/drain/request`,
	}
	for _, size := range []int{4095, 4096, 4097, 8192, 8193} {
		line, targets := downRequest(size)
		req := filepath.Join(dir, fmt.Sprintf("req-%d", size))
		if err := os.WriteFile(req, []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
		for name, script := range writers {
			r := m.sh("REQ=" + req + " && " + script)
			if r.Code != 0 {
				t.Fatalf("%s, %d bytes: exit %d: %s", name, size, r.Code, r.Stderr)
			}
			got := drainValue(t, m, "s")["drain"].(map[string]any)["targetIds"].([]any)
			if len(got) != targets+1 { // the stack itself, then the volumes
				t.Fatalf("%s, %d bytes: %d targets reserved, want %d", name, size, len(got)-1, targets)
			}
			m.ok("rm $M/app/stacks/s/drain/request")
		}
	}
	// st_blksize is what glibc's stdio sizes its buffer by: a fresh writer writes a whole request
	// in one write(2).
	if got := strings.TrimSpace(m.ok("stat -c %o $M/app/stacks/s/drain/request $M/app/config")); got != "65536\n65536" {
		t.Fatalf("st_blksize: %q, want 65536 for each", got)
	}
	line, _ := downRequest(6000)
	req := filepath.Join(dir, "req-6000")
	os.WriteFile(req, []byte(line), 0o644)
	trace := filepath.Join(dir, "trace")
	m.ok(fmt.Sprintf(`strace -f -e trace=write -o %s bash -c 'echo "$1" > "$2"' bash "$(cat %s)" $M/app/stacks/s/drain/request`, trace, req))
	out, _ := os.ReadFile(trace)
	writes := regexp.MustCompile(`write\(1, .*\) = (\d+)`).FindAllStringSubmatch(string(out), -1)
	if len(writes) != 1 || writes[0][1] != "6000" {
		t.Fatalf("bash's echo of 6,000 bytes: writes %v, want one of 6000\n%s", writes, out)
	}
}

// A long holder attribute cut into pieces is one command: the 5,000-byte checkout a claim names
// is refused whole (EINVAL) and none of it is stored; a piece refused for its size refuses the
// rest of its line, and the next line is a command of its own.
func TestWholeLinesHolderAttribute(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 39490}, "s")
	long := "/" + strings.Repeat("a", 5000)
	r := m.sh(fmt.Sprintf(`bash -c 'echo >/dev/null; echo "checkout=%s" > $M/app/stacks/s/holders/me'`, long))
	if r.Code == 0 || !strings.Contains(r.Stderr, "Invalid argument") {
		t.Fatalf("a 5,000-byte checkout: exit %d, %s", r.Code, r.Stderr)
	}
	if got := m.read("app/stacks/s/holders/me"); strings.Contains(got, "aaaa") {
		t.Fatalf("a piece of the checkout was stored:\n%s", got)
	}
	claimsRefusalEvent(t, m, "app/stacks/s/events", "STATE_RECORD_MALFORMED", "EINVAL")

	// Past 64 KiB, the piece that crosses it is refused (EFBIG), and so is the line's tail; the
	// line after it applies.
	before := m.read("app/stacks/s/revision")
	script := `python3 - "$M/app/stacks/s/holders/me" <<'EOF'
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
os.write(fd, b"pid=" + b"1" * 40000)
for piece in (b"2" * 40000, b"3\n"):
    try:
        os.write(fd, piece)
        sys.exit("a piece past 64 KiB was accepted")
    except OSError as e:
        print(e.strerror)
os.write(fd, b"pid=none\n")
EOF`
	if got := m.ok(script); got != "File too large\nFile too large\n" {
		t.Fatalf("the pieces past 64 KiB: %q", got)
	}
	if got := m.read("app/stacks/s/holders/me"); !strings.Contains(got, "state=untracked") {
		t.Fatalf("the line after a refused one did not apply:\n%s", got)
	}
	var b, a int
	fmt.Sscan(before, &b)
	fmt.Sscan(m.read("app/stacks/s/revision"), &a)
	if a != b+1 {
		t.Fatalf("revision %d -> %d: want only pid=none applied", b, a)
	}
}

// A writer killed by a signal before its close applies nothing and leaves one events line saying
// so; one that exits without closing applies; a close of a duplicate descriptor (bash's `>&3`)
// while the writer holds another is not its end.
func TestKilledWriterAppliesNothing(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 39500}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	config := m.read("app/config")
	lines := claimsEventCount(m, "app/events")

	// SIGKILL between two writes: `HTTP = 2` of `HTTP = 26500`.
	m.sh(`bash -c 'exec 3>$M/app/config; printf "[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 2" >&3; kill -9 $$'`)
	if got := m.read("app/config"); got != config {
		t.Fatalf("a killed writer's config was applied:\n%s", got)
	}
	if n := claimsEventCount(m, "app/events"); n != lines+1 {
		t.Fatalf("events went from %d to %d lines, want one more", lines, n)
	}
	ev := claimsRefusalEvent(t, m, "app/events", "WRITE_ABANDONED", "ECANCELED")
	if msg := ev["message"].(string); !strings.Contains(msg, "SIGKILL") {
		t.Fatalf("the line does not say the writer was killed: %s", msg)
	}
	// A writer killed with SIGTERM, from another of its threads.
	m.sh(`python3 -c '
import os, signal, sys, threading
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
os.write(fd, b"[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 3")
threading.Thread(target=lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
signal.pause()' $M/app/config`)
	if got := m.read("app/config"); got != config {
		t.Fatalf("a writer killed by SIGTERM had its config applied:\n%s", got)
	}
	claimsRefusalEvent(t, m, "app/events", "WRITE_ABANDONED", "ECANCELED")

	// A command's unended line, the writer killed.
	holder := m.read("app/stacks/s/holders/me")
	m.sh(`bash -c 'exec 3>$M/app/stacks/s/holders/me; printf "pid=none" >&3; kill -9 $$'`)
	if got := m.read("app/stacks/s/holders/me"); got != holder {
		t.Fatalf("a killed writer's unended line was applied:\n%s", got)
	}
	claimsRefusalEvent(t, m, "app/stacks/s/events", "WRITE_ABANDONED", "ECANCELED")

	// Exiting without a close (exit status 3) is finishing: the document applies.
	m.ok(`python3 -c '
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
os.write(fd, b"[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 39510\n")
os._exit(0)' $M/app/config`)
	if got := m.read("app/config"); !strings.Contains(got, "HTTP = 39510") {
		t.Fatalf("a writer exiting without close: config\n%s", got)
	}
	// Written through a descriptor bash duplicates for each printf: applied once, whole, at the
	// close of the descriptor itself.
	rev := claimsEvent(t, m, "app/events")["revision"]
	m.ok(`exec 3>$M/app/config; printf "[ports]\nstep = 10\n" >&3; printf "count = 4\n[ports.bases]\nHTTP = 39520\n" >&3; exec 3>&-`)
	ev = claimsEvent(t, m, "app/events")
	if got := m.read("app/config"); !strings.Contains(got, "HTTP = 39520") || ev["revision"].(float64) != rev.(float64)+1 {
		t.Fatalf("config %q applied at revision %v after %v: want it applied once", got, ev["revision"], rev)
	}
}

// eventsSince parses the lines an events file gained after its first n.
func eventsSince(t *testing.T, m *mount, path string, n int) []map[string]any {
	t.Helper()
	var evs []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(m.read(path), "\n"), "\n")[n:] {
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("%s: a line is not JSON: %v\n%s", path, err, line)
		}
		evs = append(evs, ev)
	}
	return evs
}

// oneEvent checks that an events file gained exactly one line since its first n, of result (and
// code, when refused) and by process pid, and returns it.
func oneEvent(t *testing.T, m *mount, path string, n int, result, code string, pid int) map[string]any {
	t.Helper()
	evs := eventsSince(t, m, path, n)
	if len(evs) != 1 {
		t.Fatalf("%s gained %d lines, want one (%s %s by %d):\n%v", path, len(evs), result, code, pid, evs)
	}
	ev := evs[0]
	if ev["result"] != result || code != "" && ev["code"] != code || ev["pid"] != float64(pid) {
		t.Fatalf("%s: want %s %s by pid %d, got %v", path, result, code, pid, ev)
	}
	return ev
}

// lastPid is the pid a script printed as its output's last line.
func lastPid(t *testing.T, out string) int {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	pid, err := strconv.Atoi(lines[len(lines)-1])
	if err != nil {
		t.Fatalf("no pid as the last line of %q", out)
	}
	return pid
}

// FUSE flushes at every close(2) of every descriptor sharing an open, so a child's close of the
// copy it inherited reaches the daemon too. A child that wrote nothing through it (a `$(…)`
// subshell, a process python starts, a `sleep` killed) ends nothing and abandons nothing: the
// document applies whole at its writer's own close, or is refused whole, never in part, and the
// child leaves no events line. The same for a command's unended line.

// configHead is a config up to its bases.
const configHead = `[ports]\nstep = 10\ncount = 4\n[ports.bases]\n`

// A `$(…)` subshell between two writes of a config: refused whole or applied whole, once.
func TestSubshellBetweenWritesEndsNothing(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 46600})
	// bash: a `$(…)` subshell between two writes. Refused whole (DB repeats HTTP's port) at
	// echo's write, which sees EINVAL; config stays as it was.
	config := m.read("app/config")
	n := claimsEventCount(m, "app/events")
	r := m.sh(`echo $$; { printf '` + configHead + `HTTP = 46610\n'; echo "DB = $(echo 46610)"; } > $M/app/config`)
	if r.Code != 1 || !strings.Contains(r.Stderr, "write error: Invalid argument") {
		t.Fatalf("bash's echo of a refused line: exit %d, stderr %q; want 1, EINVAL", r.Code, r.Stderr)
	}
	if got := m.read("app/config"); got != config {
		t.Fatalf("a refused document was applied in part:\n%s", got)
	}
	oneEvent(t, m, "app/events", n, "refused", "PORT_FAMILY_OUT_OF_RANGE", lastPid(t, r.Stdout))
	// Accepted: applied once (one events line), whole.
	n = claimsEventCount(m, "app/events")
	out := m.ok(`echo $$; { printf '` + configHead + `HTTP = 46620\n'; echo "DB = $(echo 46820)"; } > $M/app/config`)
	oneEvent(t, m, "app/events", n, "ok", "", lastPid(t, out))
	if got := m.read("app/config"); !strings.Contains(got, "HTTP = 46620") || !strings.Contains(got, "DB = 46820") {
		t.Fatalf("config after a document written around a subshell:\n%s", got)
	}
}

// Written by two children in turn, the first one's exit ends nothing while the shell that opened
// the file holds it: `{ cat base; cat more; } > config` applies once, whole.
func TestTwoChildWritersApplyOnce(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 46600})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "base"), []byte("[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 46640\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "more"), []byte("DB = 46840\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := claimsEventCount(m, "app/events")
	out := m.ok(`echo $$; { cat ` + dir + `/base; cat ` + dir + `/more; } > $M/app/config`)
	oneEvent(t, m, "app/events", n, "ok", "", lastPid(t, out))
	if got := m.read("app/config"); !strings.Contains(got, "HTTP = 46640") || !strings.Contains(got, "DB = 46840") {
		t.Fatalf("config after two cats:\n%s", got)
	}
}

// A child python starts between two writes of a config: refused whole or applied whole, once.
func TestPythonChildBetweenWritesEndsNothing(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 46600})
	// A child started between two writes (`true`) closes its copy as it execs.
	const python = `python3 - "$M/app/config" "$DOC" <<'EOF'
import os, subprocess, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
first, rest = sys.argv[2].encode().split(b"|")
os.write(fd, first)
subprocess.run(["true"], check=True)
try:
    os.write(fd, rest)
    print("written")
except OSError as e:
    print("write:", e.strerror)
try:
    os.close(fd)
    print("closed")
except OSError as e:
    print("close:", e.strerror)
print(os.getpid())
EOF`
	config := m.read("app/config")
	n := claimsEventCount(m, "app/events")
	out := m.ok(`DOC=$(printf '` + configHead + `HTTP = 46660\n|DB = 46660\n'); ` + python)
	if !strings.HasPrefix(out, "written\nclose: Invalid argument\n") { // its last line, unended, is judged at the close
		t.Fatalf("python writing a refused document: %q", out)
	}
	if got := m.read("app/config"); got != config {
		t.Fatalf("a refused document was applied in part:\n%s", got)
	}
	oneEvent(t, m, "app/events", n, "refused", "PORT_FAMILY_OUT_OF_RANGE", lastPid(t, out))
	n = claimsEventCount(m, "app/events")
	out = m.ok(`DOC=$(printf '` + configHead + `HTTP = 46670\n|DB = 46870\n'); ` + python)
	if !strings.HasPrefix(out, "written\nclosed\n") {
		t.Fatalf("python writing a document: %q", out)
	}
	oneEvent(t, m, "app/events", n, "ok", "", lastPid(t, out))
	if got := m.read("app/config"); !strings.Contains(got, "HTTP = 46670") || !strings.Contains(got, "DB = 46870") {
		t.Fatalf("config after python's document:\n%s", got)
	}
}

// A child that never wrote, killed: no abandonment; the writer goes on and its document applies
// whole.
func TestKilledChildThatNeverWroteAbandonsNothing(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 46600})
	n := claimsEventCount(m, "app/events")
	out := m.ok(`{ printf '[ports]\nstep = 10\n'; sleep 30; printf 'count = 4\n[ports.bases]\nHTTP = 46690\n'; } > $M/app/config &
writer=$!
for i in $(seq 100); do child=$(pgrep -P $writer -x sleep) && break; sleep 0.1; done
kill -9 $child && wait $writer && echo $writer`)
	oneEvent(t, m, "app/events", n, "ok", "", lastPid(t, out))
	if got := m.read("app/config"); !strings.Contains(got, "HTTP = 46690") {
		t.Fatalf("config after the writer's child was killed:\n%s", got)
	}
}

// A command's unended line, a subshell between its pieces: applied whole at the close.
func TestSubshellBetweenPiecesOfACommand(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 46600}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	n := claimsEventCount(m, "app/stacks/s/events")
	out := m.ok(`echo $$; { printf 'pid=no'; : "$(true)"; printf 'ne'; } > $M/app/stacks/s/holders/me`)
	oneEvent(t, m, "app/stacks/s/events", n, "ok", "", lastPid(t, out))
	if got := m.read("app/stacks/s/holders/me"); !strings.Contains(got, "state=untracked") {
		t.Fatalf("holder after pid=none written in two pieces:\n%s", got)
	}
}

// A descriptor a process holds open for reading is no duplicate of its write open: the close of
// the write open applies, and the writer reads the errno of a refusal, named in events
// (`with open(p) as r: … open(p, "w")`).
func TestReadOpenBesideAWriteOpen(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 46700})
	const python = `python3 - "$M/app/config" "$DOC" <<'EOF'
import os, sys
keep = os.open(sys.argv[1], os.O_RDONLY)
os.read(keep, 4096)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
os.write(fd, sys.argv[2].encode())
try:
    os.close(fd)
    print("closed")
except OSError as e:
    print("close:", e.strerror)
os.close(keep)
print(os.getpid())
EOF`
	// Incomplete (no bases), so refused whole at the close, not at a write.
	config := m.read("app/config")
	n := claimsEventCount(m, "app/events")
	out := m.ok(`DOC=$(printf '[ports]\nstep = 10\ncount = 4\n'); ` + python)
	if !strings.HasPrefix(out, "close: Invalid argument\n") {
		t.Fatalf("the close of a refused document, a read open beside it: %q", out)
	}
	if got := m.read("app/config"); got != config {
		t.Fatalf("a refused document was applied:\n%s", got)
	}
	oneEvent(t, m, "app/events", n, "refused", "PORT_FAMILY_OUT_OF_RANGE", lastPid(t, out))
	n = claimsEventCount(m, "app/events")
	out = m.ok(`DOC=$(printf '[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 46710\n'); ` + python)
	if !strings.HasPrefix(out, "closed\n") {
		t.Fatalf("the close of a document, a read open beside it: %q", out)
	}
	oneEvent(t, m, "app/events", n, "ok", "", lastPid(t, out))
	if got := m.read("app/config"); !strings.Contains(got, "HTTP = 46710") {
		t.Fatalf("config after the close:\n%s", got)
	}
}

// Backups are ordered by the sequence each holds, never by name or clock. With three backups
// named in the future (a clock that ran ahead, then was corrected), the backup just written is
// kept, restore without a file picks the newest content, and a store emptied by mistake does not
// push the fuller backups out without a word: the fullest older one is kept, and the log says so.
func TestBackupsOrderedByWhatTheyHold(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 39530}, "s1")
	m.Stop()
	backups := filepath.Join(m.Data, "backups")
	for range 2 {
		m.start()
		m.Stop()
	}
	names, _ := filepath.Glob(filepath.Join(backups, "*.backup"))
	if len(names) != 3 {
		t.Fatalf("three starts left %v", names)
	}
	for i, name := range names {
		if err := os.Rename(name, filepath.Join(backups, fmt.Sprintf("2099010%dT000000.000000000Z.backup", i+1))); err != nil {
			t.Fatal(err)
		}
	}
	m.start()
	m.ok("mkdir $M/app/stacks/s2 $M/app/stacks/s3")
	m.Stop()
	m.start() // its backup holds s1, s2 and s3
	m.Stop()  // which waits for the backup the start began
	var written string
	names, _ = filepath.Glob(filepath.Join(backups, "*.backup"))
	for _, name := range names {
		if b, err := kv.ReadBackup(name); err == nil {
			for key := range b.Records {
				if strings.HasSuffix(key, "/s3") {
					written = name
				}
			}
		}
	}
	if written == "" {
		t.Fatalf("the backup just written, of s1, s2 and s3, is gone: %v\n%s", names, m.log)
	}
	r := cockpitfs(t, "restore", "--data", m.Data)
	if r.code != 0 || !strings.Contains(r.out, "from "+written) {
		t.Fatalf("restore without a file did not pick %s:\n%s", written, r.out)
	}
	m.start()
	if got := m.ok("ls $M/app/stacks"); got != "s1\ns2\ns3\n" {
		t.Fatalf("restored stacks %q", got)
	}
	// Emptied by mistake: four backups of fewer records each.
	m.ok("rmdir $M/app/stacks/s1 $M/app/stacks/s2 $M/app/stacks/s3 && rmdir $M/app")
	for range 4 {
		m.Stop()
		m.start()
	}
	m.Stop()
	log := m.log.String()
	if !strings.Contains(log, "backup: kept ") || !strings.Contains(log, "beside the newest 3, which hold fewer") {
		t.Fatalf("the rotation did not keep the fuller backup, or said nothing:\n%s", log)
	}
	if names, _ := filepath.Glob(filepath.Join(backups, "*.backup")); len(names) != 4 {
		t.Fatalf("backups after the rotation: %v", names)
	}
}

// A restore run on a clean store drops what was committed since its backup, names it, and says
// how to undo it: backing up the store it kept aside and restoring that brings it all back.
func TestRestoreOfACleanStoreSaysHowToUndoIt(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 39560}, "s1")
	m.Stop()
	m.start() // its backup holds s1
	m.ok("mkdir $M/app/stacks/s2")
	m.Stop()
	r := cockpitfs(t, "restore", "--data", m.Data)
	undo := regexp.MustCompile(`(?m)^to undo it: (cockpitfs backup --data \S+ FILE && cockpitfs restore --data \S+ FILE)$`).FindStringSubmatch(r.out)
	if r.code != 0 || !strings.Contains(r.out, "s2") || undo == nil {
		t.Fatalf("restore of a clean store: exit %d, want s2 named lost and how to undo it:\n%s", r.code, r.out)
	}
	file := filepath.Join(t.TempDir(), "undo.backup")
	sh := exec.Command("bash", "-c", strings.ReplaceAll(undo[1], "FILE", file))
	sh.Env = append(os.Environ(), "PATH="+filepath.Dir(binary)+":"+os.Getenv("PATH"))
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", undo[1], err, out)
	}
	m.start()
	if got := m.ok("ls $M/app/stacks"); got != "s1\ns2\n" {
		t.Fatalf("after the undo, stacks %q", got)
	}
}
