package fs

import (
	"bytes"
	"context"

	"github.com/cockpitfs/cockpitfs/engine"
)

// holderWriter applies `pid=<n>|none checkout=<path>` commands to a holder file.
type holderWriter struct{ name string }

func (w holderWriter) write(ctx context.Context, f *file, h *handle, data []byte, _ int64) error {
	// Another user's junk is refused for whose it is, not for what it says, from its first piece.
	if err := f.fsys.eng.MayWriteHolder(caller(ctx, "write", f.path), f.cockpit, f.stack, w.name); err != nil {
		return err
	}
	text, whole, err := pendingCommand(h, data)
	if err != nil || !whole {
		return err
	}
	return w.command(ctx, f, h, text)
}

func (w holderWriter) command(ctx context.Context, f *file, h *handle, text string) error {
	return f.fsys.eng.SetHolder(ctx, caller(ctx, "write", f.path), f.cockpit, f.stack, w.name, text, h.created)
}

// pendingCommand adds one write(2) to the command this open writes and returns the command once
// whole: when the write ends a line, everything written since the last command. A write that
// stops mid-line is a piece (bash's echo writes a long line in pieces of its buffer's size, 4 KiB
// when its buffer was sized before the redirection), joined with the rest; the close applies a
// last line no newline ended (see file.applyPending).
func pendingCommand(h *handle, data []byte) (string, bool, error) {
	if n := len(h.line) + len(data); n > maxCommand {
		return "", false, tooLarge(n)
	}
	h.line = append(h.line, data...)
	if !endsLine(data) {
		return "", false, nil
	}
	text := string(h.line)
	h.line = h.line[:0]
	return text, true, nil
}

func endsLine(data []byte) bool { return len(data) > 0 && data[len(data)-1] == '\n' }

// touch re-binds the holder to the toucher's session (see engine.Rebind).
func (w holderWriter) touch(ctx context.Context, f *file) error {
	return f.fsys.eng.Rebind(ctx, caller(ctx, "touch", f.path), f.cockpit, f.stack, w.name)
}

// configWriter collects the document written on an open; it is applied whole, once, when the
// writer is done: at close or fsync (see documentWriter), or by renaming a scratch file onto
// config (see scratch.go). A writer may write it in any number of write(2)s: bash's printf writes
// a line at a time, dd bs=16 sixteen bytes.
//
// A close's errno is lost on bash's builtins, so the document so far is judged at every write
// that ends a line: the write that brings an error no further line can fix is refused (see
// engine.CheckConfigPrefix), and bash's printf and echo report it.
type configWriter struct{}

// maxJudgedPrefix bounds the documents judged at each line: a judgement parses everything
// written so far, so a document written a line per write costs the square of its length. Real
// configs are a few KiB; a longer one is judged whole at close.
const maxJudgedPrefix = 16 << 10

func (configWriter) write(_ context.Context, f *file, h *handle, data []byte, off int64) error {
	if err := collect(h, data, off); err != nil {
		return err
	}
	if lines := bytes.LastIndexByte(h.doc, '\n') + 1; !h.scattered && bytes.IndexByte(data, '\n') >= 0 && lines <= maxJudgedPrefix {
		return f.fsys.eng.CheckConfigPrefix(f.cockpit, h.doc[:lines])
	}
	return nil
}

// collect adds one write(2) of a whole document to the document written on h so far.
func collect(h *handle, data []byte, off int64) error {
	end := off + int64(len(data))
	if off < 0 || end > maxCommand {
		return tooLarge(int(end))
	}
	// Only a document written front to back has a beginning to judge; one written out of order
	// (a hole, a rewrite) is judged whole at close.
	h.scattered = h.scattered || off != int64(len(h.doc))
	if int64(len(h.doc)) < end {
		h.doc = append(h.doc, make([]byte, end-int64(len(h.doc)))...)
	}
	copy(h.doc[off:], data)
	h.dirty, h.wrote = true, true
	return nil
}

func (configWriter) mayOpen(c engine.Caller, f *file) error {
	return f.fsys.eng.MayWriteConfig(c, f.cockpit)
}

func (configWriter) apply(ctx context.Context, f *file, h *handle) error {
	return f.fsys.eng.SetConfig(ctx, caller(ctx, "write", f.path), f.cockpit, h.doc)
}

// declaredValuesWriter collects a stack's declared-values document as configWriter collects
// config, and applies it whole when the writer is done.
type declaredValuesWriter struct{}

func (declaredValuesWriter) write(_ context.Context, _ *file, h *handle, data []byte, off int64) error {
	return collect(h, data, off)
}

func (declaredValuesWriter) mayOpen(c engine.Caller, f *file) error {
	return f.fsys.eng.MayWriteDeclaredValues(c, f.cockpit, f.stack)
}

func (declaredValuesWriter) apply(ctx context.Context, f *file, h *handle) error {
	return f.fsys.eng.SetDeclaredValues(ctx, caller(ctx, "write", f.path), f.cockpit, f.stack, h.doc)
}
