package integration

import (
	"strings"
	"testing"
)

// fullDrain drains stack of cockpit app as a developer does: request, attempt, outcome.
func fullDrain(m *mount, stack string) {
	m.t.Helper()
	m.ok("cd $M/app/stacks/" + stack + " && echo sleep > drain/request && echo start > drain/attempt && echo success > drain/outcome")
}

// A stack drained and claimed again gets its family back, across a daemon restart, though an
// earlier family is free; when another stack took it meanwhile, it gets the first free one and
// its claim's events line says why.
func TestClaimsSameFamilyAfterDrain(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 51280}, "a", "b", "c", "s")
	m.ok("touch $M/app/stacks/a/holders/me $M/app/stacks/s/holders/me")
	if got := m.read("app/stacks/s/ports/HTTP"); got != "51290\n" {
		t.Fatalf("s leased %q, want 51290", got)
	}
	fullDrain(m, "s")
	fullDrain(m, "a")
	if got := m.ok("ls $M/ports"); got != "" {
		t.Fatalf("ports after both drains: %q", got)
	}
	// A clean restart: restart() is for a killed daemon, and beside a live one the new daemon
	// could start before the old one, lazily detached, had let the data directory go.
	m.Stop()
	m.start(m.args...)
	m.ok("touch $M/app/stacks/s/holders/me")
	if got := m.read("app/stacks/s/ports/HTTP"); got != "51290\n" {
		t.Fatalf("s claimed again %q, want its previous 51290 (51280 is the first free)", got)
	}
	if ev := m.lastEvent("app/stacks/s/events"); strings.Contains(ev, "previous family") {
		t.Fatalf("the claim that got its family back says otherwise: %s", ev)
	}

	// Meanwhile b takes 51280 and c the first free, s's previous family.
	fullDrain(m, "s")
	m.ok("touch $M/app/stacks/b/holders/me && touch $M/app/stacks/c/holders/me")
	if got := m.read("app/stacks/c/ports/HTTP"); got != "51290\n" {
		t.Fatalf("c leased %q, want 51290", got)
	}
	m.ok("touch $M/app/stacks/s/holders/me")
	if got := m.read("app/stacks/s/ports/HTTP"); got != "51300\n" {
		t.Fatalf("s claimed again %q, want 51300, the first free", got)
	}
	if ev := m.lastEvent("app/stacks/s/events"); !strings.Contains(ev, `"op":"create"`) || !strings.Contains(ev, "the stack's previous family 51290 is taken (leased by app/c)") {
		t.Fatalf("the claim's events line does not say why the previous family was passed: %s", ev)
	}
}
