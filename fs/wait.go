package fs

import (
	"context"
	"strconv"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// waitFile is a stack's or a cockpit's `wait`: a read blocks until something is committed after
// the open, then returns one line. A stack's wait returns when its revision moves past the one
// seen at open, and prints the new revision; a cockpit's when anything in the cockpit commits
// (its config, any stack, a refusal), and prints the events file, relative to the cockpit, that
// records it. No polling: the engine wakes it on commit.
//
// `wait` is not listed by readdir, so tree walkers (grep -r, cp -r, rsync, tar, find) never
// block on it; it is found by name, as /proc finds a thread id it does not list.
type waitFile struct {
	gofs.Inode
	fsys    *FS
	path    string
	cockpit string
	stack   string // "": the cockpit's wait
}

type waitHandle struct {
	mu     sync.Mutex
	seen   int64  // the stack's revision at open
	seenAt uint64 // the cockpit's change count at open
	result []byte // the line, once a read returned it
}

var (
	_ = (gofs.NodeOpener)((*waitFile)(nil))
	_ = (gofs.NodeReader)((*waitFile)(nil))
	_ = (gofs.NodeGetattrer)((*waitFile)(nil))
)

func (f *FS) newWaitFile(path, cockpit, stack string) *waitFile {
	return &waitFile{fsys: f, path: path, cockpit: cockpit, stack: stack}
}

func (w *waitFile) Open(ctx context.Context, flags uint32) (_ gofs.FileHandle, _ uint32, errno syscall.Errno) {
	defer w.fsys.guard("open", w.path, "", &errno)
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EACCES
	}
	if w.stack == "" {
		seen := w.fsys.eng.CockpitSeen(w.cockpit)
		if _, err := w.fsys.eng.Cockpit(w.cockpit); err != nil {
			return nil, 0, w.fsys.failNoEvent("open", w.path, err)
		}
		return &waitHandle{seenAt: seen}, openFlags, 0
	}
	r, err := w.fsys.eng.Stack(w.cockpit, w.stack)
	if err != nil {
		return nil, 0, w.fsys.failNoEvent("open", w.path, err)
	}
	return &waitHandle{seen: r.Revision}, openFlags, 0
}

func (w *waitFile) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (_ fuse.ReadResult, errno syscall.Errno) {
	defer w.fsys.guard("read", w.path, "", &errno)
	h, ok := fh.(*waitHandle)
	if !ok {
		return nil, syscall.EBADF
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.result == nil {
		line, err := w.next(ctx, h)
		if err != nil {
			return nil, w.fsys.failNoEvent("read", w.path, err)
		}
		h.result = []byte(line + "\n")
	}
	if off >= int64(len(h.result)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(h.result[off:]), 0
}

// next blocks until the change h waits for and returns its line.
func (w *waitFile) next(ctx context.Context, h *waitHandle) (string, error) {
	if w.stack == "" {
		c, err := w.fsys.eng.WaitCockpit(ctx, w.cockpit, h.seenAt)
		return c.Events, err
	}
	rev, err := w.fsys.eng.Wait(ctx, w.cockpit, w.stack, h.seen)
	return strconv.FormatInt(rev, 10), err
}

// Getattr reports size 0: what a read returns is not known until something changes.
func (w *waitFile) Getattr(ctx context.Context, _ gofs.FileHandle, out *fuse.AttrOut) (errno syscall.Errno) {
	defer w.fsys.guard("getattr", w.path, "", &errno)
	out.Gid = w.fsys.gid
	out.Mode = syscall.S_IFREG | 0o444
	out.Nlink = 1
	if w.stack == "" {
		info, err := w.fsys.eng.Cockpit(w.cockpit)
		if err != nil {
			return w.fsys.failNoEvent("getattr", w.path, err)
		}
		out.Uid = info.UID
		setTimes(&out.Attr, stamp(info.UpdatedAt))
		return 0
	}
	r, err := w.fsys.eng.Stack(w.cockpit, w.stack)
	if err != nil {
		return w.fsys.failNoEvent("getattr", w.path, err)
	}
	out.Uid = w.fsys.stackUID(r)
	setTimes(&out.Attr, stamp(r.UpdatedAt))
	return 0
}
