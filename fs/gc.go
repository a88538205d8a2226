package fs

import (
	"context"
	"strings"

	"github.com/cockpitfs/cockpitfs/engine"
)

// The root's gc file (docs/worktrees.md): reading it lists each stack with an active lease as gc
// judges it now, `drain` (stale: every holder dead or pid-less, every checkout gone) or `keep`,
// and why; writing `run` drains, for the writer, every stale stack it may drain, without waiting
// for the cockpit's grace. `cockpitfs gc` reads and writes it.

// gcFile is the gc file. A survey looks at every holder's checkout, and one may keep it waiting
// (a co-user's stopped FUSE server): a stat (`ls -l` of the mount) surveys nothing and shows size
// 0, as a /proc file does, and a read, through direct I/O, gets the whole survey all the same.
func (f *FS) gcFile() *file {
	g := f.newFile("gc", "", "", f.gcView, gcWriter{})
	g.stat = f.gcStat
	return g
}

// gcStat is the gc file without its content. Its content follows processes and directories, not
// commits: no change has a time to show.
func (f *FS) gcStat() (view, error) {
	return view{mtime: f.started, uid: f.uid}, nil
}

// gcView renders gc's verdicts, one line each.
func (f *FS) gcView() (view, error) {
	verdicts, err := f.exec.Survey()
	if err != nil {
		return view{}, err
	}
	var b strings.Builder
	for _, v := range verdicts {
		b.WriteString(v.Line()) // printable already: Survey escapes each path and error it names
		b.WriteByte('\n')
	}
	v, _ := f.gcStat()
	v.data = []byte(b.String())
	return v, nil
}

// gcWriter applies `run` to the gc file.
type gcWriter struct{}

func (gcWriter) write(ctx context.Context, f *file, h *handle, data []byte, _ int64) error {
	text, whole, err := pendingCommand(h, data)
	if err != nil || !whole {
		return err
	}
	return gcWriter{}.command(ctx, f, h, text)
}

func (gcWriter) command(ctx context.Context, f *file, _ *handle, text string) error {
	if strings.TrimSpace(text) != "run" {
		return &engine.Refusal{Code: engine.StateRecordMalformed, Message: "gc command " + engine.Printable(text) + " is not run",
			Fix: "echo run > gc (cat gc lists what it drains)"}
	}
	c := caller(ctx, "gc", "gc")
	drained, err := f.fsys.exec.Collect(ctx, c)
	if err != nil {
		return err
	}
	// Each stack's refusal goes to its own events; the write reports the first one's errno.
	var first error
	for _, d := range drained {
		if d.Err != nil {
			f.fsys.fail(c, d.Cockpit, d.Stack, d.Err)
			if first == nil {
				first = d.Err
			}
		}
	}
	return first
}
