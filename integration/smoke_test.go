package integration

import (
	"strings"
	"syscall"
	"testing"
)

// The SPEC's walkthrough, as a newcomer types it.
func TestWalkthrough(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(20, map[string]int{"HTTP": 28080, "DB": 25432}, "feature-x")
	m.ok("touch $M/app/stacks/feature-x/holders/me")
	if got := m.read("app/stacks/feature-x/ports/HTTP"); got != "28080\n" {
		t.Fatalf("ports/HTTP = %q", got)
	}
	// The default entrypoints (entrypoints/http) are not exported: no HTTP_URL nobody declared.
	env := m.ok("set -a; . $M/app/stacks/feature-x/env; set +a; echo $HTTP $DB ${HTTP_URL-unset}; cat $M/app/stacks/feature-x/entrypoints/http")
	if env != "28080 25432 unset\nhttp://127.0.0.1:28080/\n" {
		t.Fatalf("env = %q", env)
	}
	m.refused("rm $M/app/stacks/feature-x/holders/me", syscall.EBUSY)
	if ev := m.lastEvent("app/stacks/feature-x/events"); !strings.Contains(ev, `"code":"CLAIM_CO_TENANT"`) || !strings.Contains(ev, `"errno":"EBUSY"`) {
		t.Fatalf("events = %s", ev)
	}
	if got := m.read("app/stacks/feature-x/revision"); got != "1\n" {
		t.Fatalf("revision after the refusal = %q", got)
	}
}
