package integration

import (
	"strings"
	"syscall"
	"testing"
)

// `mkdir -p stacks/feature/login` is refused (EINVAL) and leaves nothing behind: the stack
// feature its first step made is removed again; the events line says why and what to name it.
// A mkdir inside a stack someone made before is refused the same way, and the stack stays.
func TestNestedStackNamesRefused(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(3, map[string]int{"HTTP": 37720})
	n := claimsEventCount(m, "app/events")
	m.refused("mkdir -p $M/app/stacks/feature/login", syscall.EINVAL)
	if got := m.ok("ls -A $M/app/stacks"); got != "" {
		t.Fatalf("stacks after a refused mkdir -p: %q", got)
	}
	ev := claimsRefusalEvent(t, m, "app/events", "STATE_RECORD_MALFORMED", "EINVAL")
	if msg, fix := ev["message"].(string), ev["fix"].(string); !strings.Contains(msg, "stack names do not nest: feature/login") ||
		!strings.Contains(msg, "feature, which this mkdir -p made first, is removed again") || !strings.Contains(fix, "feature-login") {
		t.Fatalf("the refusal: %v", ev)
	}
	// mkdir of feature, then its removal, then the refusal.
	if got := claimsEventCount(m, "app/events"); got != n+3 {
		t.Errorf("%d events lines, want 3 (mkdir, rmdir, the refusal):\n%s", got-n, m.read("app/events"))
	}

	// A stack made by another command stays; only the nested mkdir is refused.
	m.ok("mkdir $M/app/stacks/kept")
	m.refused("mkdir $M/app/stacks/kept/inner", syscall.EINVAL)
	if got := m.ok("ls -A $M/app/stacks"); got != "kept\n" {
		t.Fatalf("stacks after a nested mkdir in kept: %q", got)
	}
	claimsRefusalEvent(t, m, "app/stacks/kept/events", "STATE_RECORD_MALFORMED", "EINVAL")
}
