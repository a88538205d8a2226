package fs

import (
	"context"
	"path/filepath"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cockpitfs/cockpitfs/engine/liveness"
)

// A stack's files go only with their stack. `rm -rf stacks/x`, `find x -delete` and
// shutil.rmtree walk x, removing everything they list before x itself; refused one by one, that
// was a message and an events line a file. So a removal inside a stack by a process that holds the
// stack's directory open — the walker, as it walks — answers 0 and changes nothing, and the
// walker's own rmdir of the stack, last, is the real one: it removes an unclaimed stack (one
// events line), or refuses once, as rmdir does. What a walker "removed" inside is there until
// then, and stays if that rmdir is refused.

// walkerRemoval reports whether the caller of an unlink or rmdir in d, a directory of a stack, is
// walking the stack: it holds the stack's directory open.
func (d *dir) walkerRemoval(ctx context.Context) bool {
	fc, ok := fuse.FromContext(ctx)
	stack := childPath(childPath(d.cockpit, "stacks"), d.stack)
	return ok && d.fsys.dir != "" && liveness.HoldsOpen(int(fc.Pid), filepath.Join(d.fsys.dir, stack))
}
