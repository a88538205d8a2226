package integration

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// A co-user (nobody) may name only a process it may signal in its own holder: pid=1 or root's
// process is refused (EACCES) and changes nothing; its own process is accepted. Junk written to
// another user's holder is refused for whose it is (EACCES), not for what it says, and the line
// it leaves quotes no 64 KiB.
func TestCoUserHolderPIDsAndJunk(t *testing.T) {
	m := ownershipMount(t, "--allow-other")
	m.setupApp(20, map[string]int{"HTTP": 33700}, "s1")
	m.ok("touch $M/app/stacks/s1/holders/rootholder")
	const stack = "app/stacks/s1/"
	ownershipNobodyOK(m, "touch $M/app/stacks/s1/holders/nob")

	for _, pid := range []string{"1", strconv.Itoa(m.cmd.Process.Pid)} { // init, and root's daemon
		record := m.read(stack + "record")
		ownershipNobodyRefused(m, "echo pid="+pid+" > $M/app/stacks/s1/holders/nob", syscall.EACCES)
		ownershipDenied(m, stack+"events")
		if ev := m.lastEvent(stack + "events"); !strings.Contains(ev, "may signal") {
			t.Errorf("the refusal does not say why: %s", ev)
		}
		if got := m.read(stack + "record"); got != record {
			t.Fatalf("record changed by a refused pid=%s:\nbefore %s\nafter  %s", pid, record, got)
		}
	}
	// Its own process is fine: the shell that writes it.
	ownershipNobodyOK(m, "echo pid=$$ > $M/app/stacks/s1/holders/nob")

	record := m.read(stack + "record")
	junk := "cat /dev/zero | head -c 65536 | tr '\\0' 'x' > $M/app/stacks/s1/holders/rootholder"
	ownershipNobodyRefused(m, junk, syscall.EACCES)
	ownershipDenied(m, stack+"events")
	if ev := m.lastEvent(stack + "events"); len(ev) > 2000 {
		t.Errorf("the refusal's line is %d bytes", len(ev))
	}
	if got := m.read(stack + "record"); got != record {
		t.Fatalf("record changed by nobody's junk:\nbefore %s\nafter  %s", record, got)
	}
}
