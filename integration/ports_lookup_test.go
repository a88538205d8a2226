package integration

import (
	"strings"
	"syscall"
	"testing"
)

// ports/<port> is found by its key in the port index: a leased port reads its owner, an unleased
// one or a non-canonical spelling of a leased one is ENOENT, and `ls -l` lists each port once.
func TestPortsLookupByKey(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 23400, "DB": 23401}, "one")
	m.ok("touch $M/app/stacks/one/holders/me")
	if got := m.read("ports/23400"); !strings.HasPrefix(got, "cockpit=app stack=one key=HTTP offset=0\n") {
		t.Errorf("ports/23400 = %q", got)
	}
	m.refused("cat $M/ports/023400", syscall.ENOENT)
	m.refused("cat $M/ports/23402", syscall.ENOENT)
	m.refused("cat $M/ports/http", syscall.ENOENT)
	if got := m.ok("ls -l $M/ports | awk 'NR>1 {print $NF}'"); got != "23400\n23401\n" {
		t.Errorf("ls -l ports lists %q", got)
	}
}
