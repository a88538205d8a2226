package fs

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine"
)

// A holder released by another way than this mount's unlink of it — a drain's holders, the dead
// ones a claim releases — stays in the kernel as the file it was: its dentry is kept (holder names
// are looked up at each use, entry.unkept, but the kernel keeps the dentry to revalidate). The next
// claim of the name (`make up` after `make sleep`) was then three requests: a LOOKUP revalidating
// the old file, answered missing, a LOOKUP of the name anew, and the CREATE.
//
// So after such a commit a helper process looks each name the kernel still knows up, by its path,
// as any process could: the kernel drops the old file and keeps the answer that the name is
// missing (holders is a listing whose names appear only through this mount, ownNames), and the
// next claim of the name is its CREATE alone. A process of its own, not a thread of the daemon: a
// lookup may wait, uninterruptibly, for the directory's lock, which a request to this daemon may
// hold; a daemon thread stuck there would keep a killed daemon's /dev/fuse open, so its connection
// would never be aborted and that request never answered (why the kernel is sent no notification
// either). The helper holds no descriptor of the mount or of /dev/fuse (closeFuseOnExec): when the
// daemon dies the connection aborts, the helper's lookup fails, and it exits at the end of its
// input. Its lookups are the kernel's business only: no events line. While one is under way a
// non-lazy unmount answers EBUSY, as beside any process's lookup (the daemon's own retries).

// forgetQueue bounds the paths waiting for the helper; a commit that finds it full drops its
// names, whose next claim is then the three requests again.
const forgetQueue = 256

// forgetScript is the helper: a shell that stats each path it reads (test -e is a builtin).
const forgetScript = `while IFS= read -r p; do test -e "$p"; done`

// forgetter feeds the helper the paths to look up.
type forgetter struct {
	paths chan string
	done  chan struct{} // closed by stop
}

// startForgetter starts the helper for the mount at dir; nil (and the claims keep their extra
// LOOKUP) when it cannot run.
func startForgetter(dir string, logf func(format string, args ...any)) *forgetter {
	if dir == "" || strings.ContainsRune(dir, '\n') {
		return nil
	}
	if err := closeFuseOnExec(); err != nil {
		logf("not looking released holder names up again: %v", err)
		return nil
	}
	cmd := exec.Command("/bin/sh", "-c", forgetScript)
	cmd.Dir = "/" // never a directory of the mount, which it would keep busy
	in, err := cmd.StdinPipe()
	if err != nil {
		logf("not looking released holder names up again: %v", err)
		return nil
	}
	if err := cmd.Start(); err != nil {
		logf("not looking released holder names up again: %v", err)
		return nil
	}
	f := &forgetter{paths: make(chan string, forgetQueue), done: make(chan struct{})}
	go f.feed(in, cmd)
	return f
}

// feed writes each queued path to the helper until stop, or until the helper is gone (the queue
// then fills, and what comes is dropped). The helper exits at the end of its input.
func (f *forgetter) feed(in io.WriteCloser, cmd *exec.Cmd) {
	defer cmd.Wait()
	defer in.Close()
	for {
		select {
		case path := <-f.paths:
			if _, err := io.WriteString(in, path+"\n"); err != nil {
				return
			}
		case <-f.done:
			return
		}
	}
}

// stop ends the helper.
func (f *forgetter) stop() {
	if f != nil {
		close(f.done)
	}
}

// closeFuseOnExec marks this process's /dev/fuse descriptors close-on-exec (go-fuse opens them
// without), so no process the daemon starts keeps its connection open.
func closeFuseOnExec() error {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range fds {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == "/dev/fuse" {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
				return err
			}
		}
	}
	return nil
}

// unlinkedName marks the context of a holder's release by this mount's unlink of it: the kernel
// follows that name itself.
type unlinkedName struct{}

// forgetVanished queues for the helper each holder v released whose name the kernel still knows,
// except the one the operation unlinked. It never blocks: a commit's goroutine calls it.
func (f *FS) forgetVanished(ctx context.Context, v engine.Vanished) {
	holders := known(f.root, v.Cockpit, "stacks", v.Stack, "holders")
	if f.forget == nil || holders == nil {
		return
	}
	unlinked, _ := ctx.Value(unlinkedName{}).(string)
	for _, name := range v.Holders {
		if name == unlinked || holders.GetChild(name) == nil {
			continue
		}
		select {
		case f.forget.paths <- filepath.Join(f.dir, v.Cockpit, "stacks", v.Stack, "holders", name):
		default:
		}
	}
}

// known is the inode at names below n that the kernel knows; nil when it knows none.
func known(n *gofs.Inode, names ...string) *gofs.Inode {
	for _, name := range names {
		if n == nil {
			return nil
		}
		n = n.GetChild(name)
	}
	return n
}
