package fs

import (
	"context"

	"github.com/cockpitfs/cockpitfs/engine"
)

// holderWriter applies `pid=<n>|none checkout=<path>` writes to a holder file.
type holderWriter struct{ name string }

func (w holderWriter) write(ctx context.Context, f *file, h *handle, data []byte, _ int64) error {
	if len(data) > maxCommand {
		return tooLarge(len(data))
	}
	attrs, err := engine.ParseHolderAttrs(string(data))
	if err != nil {
		return err
	}
	c := caller(ctx, "write", f.path)
	return f.fsys.eng.SetHolder(ctx, c, f.cockpit, f.stack, w.name, attrs, h.created)
}

// touch re-binds the holder to the toucher's session (see engine.Rebind).
func (w holderWriter) touch(ctx context.Context, f *file) error {
	return f.fsys.eng.Rebind(ctx, caller(ctx, "touch", f.path), f.cockpit, f.stack, w.name)
}

// configWriter re-applies the whole document written so far on this open at every write, so a
// document written in one go, by cp or by an editor saving in place, is accepted as a whole.
type configWriter struct{}

func (configWriter) write(ctx context.Context, f *file, h *handle, data []byte, off int64) error {
	end := off + int64(len(data))
	if off < 0 || end > maxCommand {
		return tooLarge(int(end))
	}
	if int64(len(h.doc)) < end {
		h.doc = append(h.doc, make([]byte, end-int64(len(h.doc)))...)
	}
	copy(h.doc[off:], data)
	c := caller(ctx, "write", f.path)
	return f.fsys.eng.SetConfig(ctx, c, f.cockpit, h.doc)
}
