package integration

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestKernelToldOfNamesACommitTookOut: names that vanish by another operation than their own
// unlink — the dead holder a claim releases, a drain's holders and its lease's ports — are taken
// out of the kernel's cache as they go (the daemon's debug log shows each FUSE request and
// notification), so the next claim of the same name costs a LOOKUP and a CREATE, not an OPEN
// answered ESTALE and the kernel's walk of the whole path again.
func TestKernelToldOfNamesACommitTookOut(t *testing.T) {
	t.Parallel()
	m := newMount(t, "--log-level", "debug")
	m.setupApp(4, map[string]int{"HTTP": 38620}, "s")
	stack := m.Path("app", "stacks", "s")
	sleeper := livenessStart(t)
	m.ok(fmt.Sprintf("cd %s && touch holders/dead && echo pid=%d > holders/dead && touch holders/mine && cat ports/HTTP $M/ports/38620",
		stack, sleeper.Pid()))

	sleeper.kill(t)
	m.ok("cd " + stack + " && touch holders/next") // releases the dead holder
	m.notified(`"dead"`)
	m.ok("rm " + stack + "/holders/next") // the kernel drops the name it unlinks itself
	m.ok(fmt.Sprintf("cd %s && echo sleep > drain/request && echo start > drain/attempt && echo success > drain/outcome", stack))
	m.notified(`"mine"`, `"HTTP"`, `"38620"`)
	if n := strings.Count(m.log.String(), `NOTIFY_DELETE, {parent`); n != 4 {
		t.Fatalf("%d deletions notified, want 4 (dead, mine, HTTP, 38620):\n%s", n, m.log)
	}

	before := len(m.log.String())
	if got := m.ok("cd " + stack + " && touch holders/mine && ls holders && cat ports/HTTP"); got != "mine\n38620\n" {
		t.Fatalf("claim after the drain: %q", got)
	}
	if stale := regexp.MustCompile(`tx \d+: +116=`).FindString(m.log.String()[before:]); stale != "" {
		t.Fatalf("the claim after the drain was answered ESTALE (%q): the kernel kept a released name\n%s", stale, m.log.String()[before:])
	}
}

// notified waits (10 s at most) until the daemon's debug log shows the kernel was told each of
// names (quoted, as the log quotes them) is gone.
func (m *mount) notified(names ...string) {
	m.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		log, missing := m.log.String(), []string(nil)
		for _, name := range names {
			if !regexp.MustCompile(`NOTIFY_DELETE, \{[^}]*\} ` + regexp.QuoteMeta(name)).MatchString(log) {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("the kernel was not told %v are gone:\n%s", missing, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
