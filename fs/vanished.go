package fs

import (
	"context"
	"strconv"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/cockpitfs/cockpitfs/engine"
)

// The kernel keeps the names it looked up (entryTimeout). A name a commit takes out by any other
// way than this mount's unlink of it — a drain's holders and its lease's ports, the dead holders a
// claim releases — stays in the kernel's cache: the next open of it (a claim's create of the same
// holder) is answered ESTALE, and the kernel walks the whole path again, a LOOKUP per component.
// So after such a commit the kernel is told the names are gone (FUSE_NOTIFY_DELETE: the dentry goes
// and an inode still open reads as unlinked). Never from inside a request, which may hold the
// directory's lock the notification takes (FIELD-NOTES): a worker sends them.

// vanishedQueue bounds the commits waiting for the worker. A commit that finds it full drops its
// notification: its names are then found gone at their next open, as without one.
const vanishedQueue = 256

// unlinkedName marks the context of an unlink of a holder: the kernel drops that name itself.
type unlinkedName struct{}

// forgetVanished has the kernel told what v took out, except the name the operation unlinked.
func (f *FS) forgetVanished(ctx context.Context, v engine.Vanished) {
	if name, ok := ctx.Value(unlinkedName{}).(string); ok && len(v.Holders) == 1 && v.Holders[0] == name && len(v.Ports) == 0 {
		return
	}
	select {
	case f.vanished <- v:
	default:
	}
}

// tellKernelVanished sends the notifications of each queued commit, until done is closed.
func (f *FS) tellKernelVanished(root *fs.Inode, done <-chan struct{}) {
	for {
		select {
		case v := <-f.vanished:
			stack := child(root, v.Cockpit, "stacks", v.Stack)
			for _, name := range v.Holders {
				notifyDelete(child(stack, "holders"), name)
			}
			for key, port := range v.Ports {
				notifyDelete(child(stack, "ports"), key)
				notifyDelete(child(root, "ports"), strconv.Itoa(port))
			}
		case <-done:
			return
		}
	}
}

// child is the inode at names below n that the kernel knows; nil when it knows none.
func child(n *fs.Inode, names ...string) *fs.Inode {
	for _, name := range names {
		if n == nil {
			return nil
		}
		n = n.GetChild(name)
	}
	return n
}

// notifyDelete tells the kernel that dir's name is gone, if the kernel knows it. An error is the
// kernel's having dropped it meanwhile (or the mount going): nothing to do either way.
func notifyDelete(dir *fs.Inode, name string) {
	if c := child(dir, name); c != nil {
		_ = dir.NotifyDelete(name, c)
	}
}
