package fs

import (
	"context"
	"sync"
	"syscall"

	"github.com/cockpitfs/cockpitfs/engine"
)

// Stack names do not nest. `mkdir -p stacks/feature/login` makes the stack feature, then asks for
// login inside it: the second mkdir is refused (EINVAL), and the stack the same process made the
// moment before is removed again, unclaimed, so that the refused command leaves nothing behind.

// maxMadeStacks bounds the stacks remembered as just made (their makers' next mkdir inside them
// is what is looked for; older ones are forgotten).
const maxMadeStacks = 64

// madeStacks remembers which process made each of the last stacks made through this mount.
type madeStacks struct {
	mu    sync.Mutex
	pids  map[string]int // stack path → the pid of the mkdir that made it
	order []string
}

func (m *madeStacks) note(path string, pid int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pids == nil {
		m.pids = map[string]int{}
	}
	if _, ok := m.pids[path]; !ok {
		m.order = append(m.order, path)
	}
	m.pids[path] = pid
	for len(m.order) > maxMadeStacks {
		delete(m.pids, m.order[0])
		m.order = m.order[1:]
	}
}

// takeIfMadeBy forgets path, reporting whether pid made it.
func (m *madeStacks) takeIfMadeBy(path string, pid int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	made, ok := m.pids[path]
	if ok {
		delete(m.pids, path)
		for i, p := range m.order {
			if p == path {
				m.order = append(m.order[:i], m.order[i+1:]...)
				break
			}
		}
	}
	return ok && pid != 0 && made == pid
}

// mkdir inside a stack's directory: a nested stack name.
func (stackListing) mkdir(ctx context.Context, d *dir, name string) syscall.Errno {
	c := caller(ctx, "mkdir", d.child(name))
	refusal := &engine.Refusal{Code: engine.StateRecordMalformed, Target: d.child(name),
		Message: "stack names do not nest: " + d.stack + "/" + name + " is no stack's name",
		Fix:     "name the stack on one level below stacks/, e.g. " + d.stack + "-" + name}
	if !d.fsys.made.takeIfMadeBy(d.path, c.PID) {
		return d.fsys.fail(c, d.cockpit, d.stack, refusal)
	}
	// The stack this process made a moment ago (mkdir -p) goes again, if nothing holds it.
	rm := caller(ctx, "rmdir", d.path)
	if err := d.fsys.eng.RemoveStack(ctx, rm, d.cockpit, d.stack); err != nil {
		return d.fsys.fail(c, d.cockpit, d.stack, refusal)
	}
	refusal.Message += "; " + d.stack + ", which this mkdir -p made first, is removed again"
	return d.fsys.fail(c, d.cockpit, "", refusal)
}
