package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// A holder a drain released is looked up again by the daemon's helper process, so the kernel
// keeps its name missing: the next claim of the name is its CREATE alone, not a LOOKUP revalidating
// the released file, a LOOKUP of the name anew and the CREATE. The helper's lookups write no events
// line.
func TestClaimAfterDrainIsItsCreateAlone(t *testing.T) {
	t.Parallel()
	m := newMount(t, "--log-level", "debug")
	m.setupApp(4, map[string]int{"HTTP": 38650}, "s")
	m.ok("cd $M/app/stacks/s && touch holders/h && cat holders/h > /dev/null")
	drained := len(m.log.String())
	m.ok("cd $M/app/stacks/s && echo sleep > drain/request && echo start > drain/attempt && echo success > drain/outcome")
	events := m.ok("cat $M/app/stacks/s/events")
	// The helper's lookups: the released file's, answered missing, then the name's anew.
	lookupH := regexp.MustCompile(`rx (\d+): LOOKUP n\d+ +"h"`)
	waitFor(t, func() string { return "two lookups of h, answered, after the drain:\n" + m.log.String()[drained:] }, func() bool {
		log := m.log.String()[drained:]
		lookups := lookupH.FindAllStringSubmatch(log, -1)
		return len(lookups) >= 2 && strings.Contains(log, fmt.Sprintf("tx %s: ", lookups[len(lookups)-1][1]))
	})
	before := len(m.log.String())
	m.ok("cd $M/app/stacks/s && touch holders/h")
	claim := m.log.String()[before:]
	if lookups := lookupH.FindAllString(claim, -1); len(lookups) > 0 || !strings.Contains(claim, "CREATE") {
		t.Fatalf("the claim after the drain sent %q, want its CREATE alone:\n%s", lookups, claim)
	}
	if after := m.ok("cat $M/app/stacks/s/events"); !strings.HasPrefix(after, events) || strings.Count(after, "\n") != strings.Count(events, "\n")+1 {
		t.Fatalf("events after the drain:\n%s\nthen after the claim:\n%s\nwant the claim's line alone added", events, after)
	}
}

// The helper keeps nothing of the mount: no /dev/fuse descriptor, no file or directory of the
// tree, no cwd in it. So a daemon killed while the helper waits in a lookup dies, its connection
// aborts, the lookup fails, and the helper exits at the end of its input.
func TestForgetHelperKeepsNothingOfTheMount(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	daemon := m.cmd.Process.Pid
	helper := childOf(t, daemon)
	if helper == 0 {
		t.Fatalf("the daemon (pid %d) runs no helper", daemon)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", helper))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", helper, fd.Name()))
		if target == "/dev/fuse" || strings.HasPrefix(target, m.Dir) {
			t.Errorf("the helper (pid %d) has fd %s open on %s", helper, fd.Name(), target)
		}
	}
	if cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", helper)); strings.HasPrefix(cwd, m.Dir) {
		t.Errorf("the helper's cwd is %s, in the mount", cwd)
	}
	m.Kill()
	waitFor(t, func() string { return fmt.Sprintf("the helper (pid %d) to exit after its daemon was killed", helper) }, func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", helper))
		return err != nil || procState(stat) == "Z"
	})
}

// childOf is the pid of a child process of pid (0: none).
func childOf(t *testing.T, pid int) int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range stats {
		stat, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses, the last ")" ends it.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			child, _ := strconv.Atoi(strings.Fields(string(stat))[0])
			return child
		}
	}
	return 0
}

// procState is the state field of a /proc/<pid>/stat line.
func procState(stat []byte) string {
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(fields) == 0 {
		return ""
	}
	return fields[0]
}
