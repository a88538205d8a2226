package integration

import (
	"strings"
	"testing"
)

// rm -rf of a stack does what rmdir does: an unclaimed one goes, with exit 0 and one events
// line; a claimed one is refused once — one message, one events line — and nothing in it changes
// (its holders are not released one by one). shutil.rmtree walks the same way.
func TestRemoveTreeOfAStack(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(3, map[string]int{"HTTP": 37740}, "free", "held", "py")
	m.ok("touch $M/app/stacks/held/holders/me")

	n := claimsEventCount(m, "app/events")
	if r := m.sh("rm -rf $M/app/stacks/free"); r.Code != 0 || r.Stderr != "" {
		t.Fatalf("rm -rf of an unclaimed stack: exit %d\n%s", r.Code, r.Stderr)
	}
	lines := strings.Split(strings.TrimSpace(m.read("app/events")), "\n")[n:]
	if len(lines) != 1 || !strings.Contains(lines[0], `"op":"rmdir","path":"app/stacks/free"`) || !strings.Contains(lines[0], `"result":"ok"`) {
		t.Fatalf("events of rm -rf of an unclaimed stack:\n%s", strings.Join(lines, "\n"))
	}

	record := m.read("app/stacks/held/record")
	n = claimsEventCount(m, "app/events")
	r := m.sh("rm -rf $M/app/stacks/held")
	if r.Code != 1 || strings.Count(r.Stderr, "\n") != 1 || !strings.Contains(r.Stderr, "cannot remove '"+m.Path("app/stacks/held")+"': Device or resource busy") {
		t.Fatalf("rm -rf of a claimed stack: exit %d, want 1 with one message\n%s", r.Code, r.Stderr)
	}
	claimsRefusalEvent(t, m, "app/events", "CLAIM_CO_TENANT", "EBUSY")
	if got := claimsEventCount(m, "app/events"); got != n+1 {
		t.Errorf("%d events lines for rm -rf of a claimed stack, want 1", got-n)
	}
	if got := m.read("app/stacks/held/record"); got != record {
		t.Errorf("rm -rf changed the claimed stack:\n%s\n%s", record, got)
	}

	m.ok(`python3 -c 'import shutil, sys; shutil.rmtree(sys.argv[1])' $M/app/stacks/py`)
	if got := m.ok("ls $M/app/stacks"); got != "held\n" {
		t.Errorf("stacks after the removals: %q", got)
	}
}
