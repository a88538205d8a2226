package integration

import (
	"strings"
	"syscall"
	"testing"
)

// A claim past the cockpit's count is refused ENOSPC naming the stacks that hold its families,
// which of them have only dead holders, and the claim that frees one; nothing changes.
func TestFullCockpitNamesItsStacks(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(3, map[string]int{"HTTP": 37700}, "live", "gone1", "gone2", "next")
	m.ok("touch $M/app/stacks/live/holders/me") // this test's session: live
	for _, s := range []string{"gone1", "gone2"} {
		m.ok("setsid bash -c 'touch $M/app/stacks/" + s + "/holders/me'") // a session that ended: dead
	}
	record := m.read("app/stacks/next/record")
	n := claimsEventCount(m, "app/stacks/next/events")
	r := m.refused("touch $M/app/stacks/next/holders/me", syscall.ENOSPC)
	ev := claimsRefusalEvent(t, m, "app/stacks/next/events", "PORT_LEASE_EXHAUSTED", "ENOSPC")
	msg, fix := ev["message"].(string), ev["fix"].(string)
	if !strings.Contains(msg, "maximum 3 concurrent stacks is already active in this cockpit: held by live; with only dead holders: gone1, gone2") ||
		!strings.HasPrefix(fix, "claim app/stacks/gone1 instead") {
		t.Fatalf("refusal of a full cockpit: %q (fix %q), stderr %q", msg, fix, r.Stderr)
	}
	if got := claimsEventCount(m, "app/stacks/next/events"); got != n+1 {
		t.Errorf("%d events lines for one refusal", got-n)
	}
	if got := m.read("app/stacks/next/record"); got != record {
		t.Errorf("the refused stack changed:\n%s\n%s", record, got)
	}
	// The fix works: a claim of gone1 takes it over.
	m.ok("touch $M/app/stacks/gone1/holders/you")
	if got := m.ok("ls $M/app/stacks/gone1/holders"); got != "you\n" {
		t.Errorf("gone1's holders after the takeover: %q", got)
	}
}
