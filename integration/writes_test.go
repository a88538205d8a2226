package integration

import (
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// A control write is one command whatever its offset: appends (>>) and writes at odd offsets
// apply the command they carry, nothing of what the file showed before.
func TestWritesAtOffsetsAndAppends(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 38280}, "s")
	h := "$M/app/stacks/s/holders/me"
	m.ok("touch " + h)

	m.ok("echo pid=none >> " + h)
	if got := m.read("app/stacks/s/holders/me"); !strings.Contains(got, "state=untracked") {
		t.Fatalf("after >>: %s", got)
	}
	m.ok("echo pid=$PPID | dd of=" + h + " bs=64 oflag=seek_bytes seek=1000 conv=notrunc status=none")
	if got := m.read("app/stacks/s/holders/me"); !strings.Contains(got, "state=live") {
		t.Fatalf("after a write at offset 1000: %s", got)
	}
	rev := m.read("app/stacks/s/revision")
	// A write in the middle of what the file shows is not a splice of its text.
	m.refused("printf 'xx' | dd of="+h+" bs=64 oflag=seek_bytes seek=3 conv=notrunc status=none", syscall.EINVAL)
	if got := m.read("app/stacks/s/revision"); got != rev {
		t.Fatalf("a refused write moved the revision %s -> %s", rev, got)
	}
}

// Concurrent writers to one holder file: every write is applied whole, one after another, and
// the record stays sound (the harness verifies the store when the test ends).
func TestWritesConcurrentToOneHolder(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 38380}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	before := m.read("app/stacks/s/revision")

	const writers, each = 8, 10
	var wg sync.WaitGroup
	failures := make(chan string, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			script := fmt.Sprintf(`for i in $(seq %d); do echo pid=none > $M/app/stacks/s/holders/me || exit 1; echo pid=$$ > $M/app/stacks/s/holders/me || exit 1; done`, each)
			if r := m.sh(script); r.Code != 0 {
				failures <- fmt.Sprintf("writer %d: %s", w, r.Stderr)
			}
		}()
	}
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Error(f)
	}
	var b, a int
	fmt.Sscan(before, &b)
	fmt.Sscan(m.read("app/stacks/s/revision"), &a)
	// Each write changes the pid from what the previous one left, except when two writers with
	// the same content follow each other: at most every write is one revision.
	if a <= b || a > b+2*writers*each {
		t.Fatalf("revision %d -> %d after %d writes", b, a, 2*writers*each)
	}
	got := m.read("app/stacks/s/holders/me")
	if !strings.Contains(got, "state=") || strings.Count(got, "pid=") != 1 {
		t.Fatalf("holder after concurrent writes:\n%s", got)
	}
}
