package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// SPEC §6 (ownership) and §1 (--allow-other): root runs the daemon, uid 65534 (nobody) is the
// other user.

const ownershipNobody = "65534"

// ownershipMount starts a daemon whose mount point nobody can reach: t.TempDir() is 0700, so the
// mount lives under a 0755 directory of its own in /tmp.
func ownershipMount(t *testing.T, args ...string) *mount {
	t.Helper()
	base, err := os.MkdirTemp("/tmp", "cockpitfs-ownership")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	m := &mount{t: t, ns: ownNetns(t), Dir: filepath.Join(base, "mnt"), Data: filepath.Join(base, "data")}
	// Registered first so it runs last: the store goes only once the mount is gone.
	t.Cleanup(func() {
		if !mounted(m.Dir) {
			os.RemoveAll(base)
		}
	})
	m.start(args...)
	t.Cleanup(m.stop)
	return m
}

// ownershipAsNobody runs script with bash as uid/gid 65534 and no groups, from /, with $M set.
func ownershipAsNobody(m *mount, script string) result {
	m.t.Helper()
	return shIn(m.t, "/", `exec setpriv --reuid=65534 --regid=65534 --clear-groups bash -c "$S"`, "M="+m.Dir, "S="+script)
}

func ownershipNobodyOK(m *mount, script string) string {
	m.t.Helper()
	r := ownershipAsNobody(m, script)
	if r.Code != 0 {
		m.t.Fatalf("as nobody, script failed (exit %d):\n%s\nstdout: %s\nstderr: %s", r.Code, script, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// ownershipNobodyRefused wants script, run as nobody, to fail with errno's message.
func ownershipNobodyRefused(m *mount, script string, errno syscall.Errno) {
	m.t.Helper()
	r := ownershipAsNobody(m, script)
	if r.Code == 0 || !strings.Contains(strings.ToLower(r.Stderr), errno.Error()) {
		m.t.Fatalf("as nobody, want refusal %q from:\n%s\ngot exit %d\nstdout: %s\nstderr: %s", errno.Error(), script, r.Code, r.Stdout, r.Stderr)
	}
}

// ownershipDenied checks the last line of an events file records nobody's EACCES.
func ownershipDenied(m *mount, events string) {
	m.t.Helper()
	ev := m.lastEvent(events)
	if !strings.Contains(ev, `"result":"refused"`) || !strings.Contains(ev, `"errno":"EACCES"`) || !strings.Contains(ev, `"uid":65534`) {
		m.t.Fatalf("%s: want nobody's EACCES refusal, got %s", events, ev)
	}
}

func TestOwnershipAllowOther(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	m.setupApp(20, map[string]int{"HTTP": 33000}, "s1")
	m.ok("touch $M/app/stacks/s1/holders/rootholder")
	const stack = "app/stacks/s1/"

	// Reading is open to everyone.
	if got := ownershipNobodyOK(m, "cat $M/app/stacks/s1/record"); got != m.read(stack+"record") {
		t.Fatalf("nobody reads record %q, root %q", got, m.read(stack+"record"))
	}
	if got := ownershipNobodyOK(m, "cat $M/app/stacks/s1/holders/rootholder"); !strings.Contains(got, "name=rootholder\n") || !strings.Contains(got, "uid=0\n") {
		t.Fatalf("nobody reads holders/rootholder = %q", got)
	}

	// A stack is closed to other users until its creator opens it (chmod o+w); then anyone may
	// claim, and the holder is theirs.
	ownershipNobodyRefused(m, "touch $M/app/stacks/s1/holders/nob", syscall.EACCES)
	ownershipDenied(m, stack+"events")
	m.ok("chmod o+w $M/app/stacks/s1")
	ownershipNobodyOK(m, "touch $M/app/stacks/s1/holders/nob")
	if got := m.ok("stat -c %u $M/app/stacks/s1/holders/nob $M/app/stacks/s1/holders/rootholder"); got != ownershipNobody+"\n0\n" {
		t.Fatalf("st_uid of holders nob, rootholder = %q, want 65534 and 0", got)
	}
	if got := m.read(stack + "holders/nob"); !strings.Contains(got, "uid=65534\n") {
		t.Fatalf("holders/nob = %q, want uid=65534", got)
	}
	// nobody may set its own holder's attributes.
	ownershipNobodyOK(m, "echo pid=none > $M/app/stacks/s1/holders/nob")

	// Not someone else's: release and write are refused, nothing changes.
	record := m.read(stack + "record")
	ownershipNobodyRefused(m, "rm $M/app/stacks/s1/holders/rootholder", syscall.EACCES)
	ownershipDenied(m, stack+"events")
	if _, err := os.Stat(m.Path(stack, "holders/rootholder")); err != nil {
		t.Fatalf("rootholder after nobody's refused rm: %v", err)
	}
	ownershipNobodyRefused(m, "echo pid=none > $M/app/stacks/s1/holders/rootholder", syscall.EACCES)
	ownershipDenied(m, stack+"events")
	if got := m.read(stack + "record"); got != record {
		t.Fatalf("record changed by nobody's refused operations:\nbefore %s\nafter  %s", record, got)
	}
	if got := m.read(stack + "holders/rootholder"); strings.Contains(got, "state=untracked") {
		t.Fatalf("nobody's refused write changed rootholder: %s", got)
	}

	// Nor the cockpit's config, which belongs to its creator.
	config := m.read("app/config")
	ownershipNobodyRefused(m, "cat > $M/app/config <<'EOF'\n[ports]\nstep = 10\ncount = 1\n[ports.bases]\nHTTP = 33500\nEOF", syscall.EACCES)
	ownershipDenied(m, "app/events")
	if got := m.read("app/config"); got != config {
		t.Fatalf("config changed by nobody's refused write:\nbefore %q\nafter  %q", config, got)
	}
	if got := m.ok("stat -c %u $M/app/config"); got != "0\n" {
		t.Fatalf("st_uid of root's cockpit config = %q", got)
	}

	// Root may do all: it releases nobody's holder.
	m.ok("rm $M/app/stacks/s1/holders/nob")
	if got := m.ok("ls $M/app/stacks/s1/holders"); got != "rootholder\n" {
		t.Fatalf("holders after root released nob = %q", got)
	}
	if got := m.read(stack + "revision"); got != "5\n" {
		t.Fatalf("revision after claim, chmod, claim, write, release = %q, want 5", got)
	}
}

// A cockpit nobody creates is nobody's: its config shows uid 65534, nobody writes it, root too.
func TestOwnershipCockpitCreator(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	ownershipNobodyOK(m, "mkdir $M/nobapp && mkdir $M/nobapp/stacks/s1 && cat > $M/nobapp/config <<'EOF'\n[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 33100\nEOF")
	if got := m.ok("stat -c %u $M/nobapp/config $M/nobapp $M/nobapp/stacks/s1"); got != strings.Repeat(ownershipNobody+"\n", 3) {
		t.Fatalf("st_uid of nobody's cockpit config, cockpit dir, stack dir = %q, want 65534 each", got)
	}
	if got := m.read("nobapp/config"); !strings.Contains(got, "HTTP = 33100") {
		t.Fatalf("nobody's config = %q", got)
	}
	// Root may rewrite it (a shorter document: `>` truncates, so nothing of the old one may
	// remain); ownership stays with the creator.
	m.ok("cat > $M/nobapp/config <<'EOF'\n[ports]\nstep = 5\ncount = 2\n[ports.bases]\nHTTP = 33200\nEOF")
	if got, want := m.read("nobapp/config"), "[ports]\nstep = 5\ncount = 2\n[ports.bases]\nHTTP = 33200\n"; got != want {
		t.Fatalf("config after root's rewrite = %q, want %q", got, want)
	}
	if got := m.ok("stat -c %u $M/nobapp/config"); got != ownershipNobody+"\n" {
		t.Fatalf("st_uid of config after root's rewrite = %q", got)
	}
	// And nobody's own rewrite still works.
	ownershipNobodyOK(m, "cat > $M/nobapp/config <<'EOF'\n[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 33300\nEOF")
	if got := m.read("nobapp/config"); !strings.Contains(got, "HTTP = 33300") {
		t.Fatalf("config after nobody's rewrite = %q", got)
	}
}

// SPEC §1: "By default only the mounting user can see the mount".
func TestOwnershipDefaultOnlyMounter(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t)
	m.ok("mkdir $M/app")
	for _, script := range []string{"stat $M/README", "ls $M", "cat $M/README", "mkdir $M/nobapp"} {
		ownershipNobodyRefused(m, script, syscall.EACCES)
	}
	// The refused mkdir made nothing; root still sees everything.
	if got := m.ok("ls $M"); got != "README\napp\ngc\nports\nstatus\nstatus.json\n" {
		t.Fatalf("ls as root = %q", got)
	}
}

// Ownership comes before content: a non-owner's write to a config is EACCES whatever it says.
// (A partial document, as bash's printf writes one line per write(2), must not answer EINVAL to
// someone who may not write the file at all.)
func TestOwnershipConfigDeniedBeforeValidation(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	m.setupApp(20, map[string]int{"HTTP": 33400})
	config := m.read("app/config")
	ownershipNobodyRefused(m, "echo 'nonsense = 1' > $M/app/config", syscall.EACCES)
	ownershipDenied(m, "app/events")
	if got := m.read("app/config"); got != config {
		t.Fatalf("config changed by nobody's refused write:\nbefore %q\nafter  %q", config, got)
	}
}

// A stack's drain belongs to the uid of its holder (§6): anyone else can neither reserve one,
// nor start, publish, repair or cancel root's; root can.
func TestOwnershipDrain(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	m.setupApp(20, map[string]int{"HTTP": 33700}, "s")
	m.ok("touch $M/app/stacks/s/holders/rootholder")
	const stack = "app/stacks/s/"
	record := m.read(stack + "record")

	ownershipNobodyRefused(m, "echo sleep > $M/app/stacks/s/drain/request", syscall.EACCES)
	ownershipDenied(m, stack+"events")
	if got := m.read(stack + "record"); got != record {
		t.Fatalf("nobody's refused reservation changed the record")
	}

	m.ok("echo sleep > $M/app/stacks/s/drain/request")
	record = m.read(stack + "record")
	for _, script := range []string{
		"echo start > $M/app/stacks/s/drain/attempt",
		"rm $M/app/stacks/s/drain/request",
	} {
		ownershipNobodyRefused(m, script, syscall.EACCES)
		ownershipDenied(m, stack+"events")
		if got := m.read(stack + "record"); got != record {
			t.Fatalf("nobody's refused %q changed the record", script)
		}
	}
	m.ok("echo start pid=none > $M/app/stacks/s/drain/attempt")
	record = m.read(stack + "record")
	for _, script := range []string{
		"echo success > $M/app/stacks/s/drain/outcome",
		"echo failure > $M/app/stacks/s/drain/outcome",
		"echo terminated > $M/app/stacks/s/drain/repair",
	} {
		ownershipNobodyRefused(m, script, syscall.EACCES)
		ownershipDenied(m, stack+"events")
	}
	if got := m.read(stack + "record"); got != record {
		t.Fatalf("nobody's refused drain steps changed the record")
	}
	m.ok("echo success > $M/app/stacks/s/drain/outcome")
	if got := m.read(stack + "lease"); !strings.Contains(got, "released=true") {
		t.Fatalf("root's drain did not complete: %s", got)
	}
}
