package fs

import (
	"context"
	"strconv"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// waitFile is a stack's `wait`: a read blocks until the stack's revision moves past the one seen
// at open, then returns the new one. No polling: the engine wakes it on commit.
type waitFile struct {
	fs.Inode
	fsys    *FS
	path    string
	cockpit string
	stack   string
}

type waitHandle struct {
	mu     sync.Mutex
	seen   int64
	result []byte // the revision line, once a read returned it
}

var (
	_ = (fs.NodeOpener)((*waitFile)(nil))
	_ = (fs.NodeReader)((*waitFile)(nil))
	_ = (fs.NodeGetattrer)((*waitFile)(nil))
)

func (f *FS) newWaitFile(path, cockpit, stack string) *waitFile {
	return &waitFile{fsys: f, path: path, cockpit: cockpit, stack: stack}
}

func (w *waitFile) Open(ctx context.Context, flags uint32) (_ fs.FileHandle, _ uint32, errno syscall.Errno) {
	defer w.fsys.guard("open "+w.path, &errno)
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EACCES
	}
	r, err := w.fsys.eng.Stack(w.cockpit, w.stack)
	if err != nil {
		return nil, 0, w.fsys.fail(caller(ctx, "open", w.path), "", "", err)
	}
	return &waitHandle{seen: r.Revision}, openFlags, 0
}

func (w *waitFile) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (_ fuse.ReadResult, errno syscall.Errno) {
	defer w.fsys.guard("read "+w.path, &errno)
	h, ok := fh.(*waitHandle)
	if !ok {
		return nil, syscall.EBADF
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.result == nil {
		rev, err := w.fsys.eng.Wait(ctx, w.cockpit, w.stack, h.seen)
		if err != nil {
			return nil, w.fsys.fail(caller(ctx, "read", w.path), "", "", err)
		}
		h.result = []byte(strconv.FormatInt(rev, 10) + "\n")
	}
	if off >= int64(len(h.result)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(h.result[off:]), 0
}

// Getattr reports size 0: what a read returns is not known until the stack changes.
func (w *waitFile) Getattr(ctx context.Context, _ fs.FileHandle, out *fuse.AttrOut) (errno syscall.Errno) {
	defer w.fsys.guard("getattr "+w.path, &errno)
	r, err := w.fsys.eng.Stack(w.cockpit, w.stack)
	if err != nil {
		return w.fsys.fail(caller(ctx, "getattr", w.path), "", "", err)
	}
	out.Mode = syscall.S_IFREG | 0o444
	out.Nlink = 1
	out.Uid = w.fsys.stackUID(r)
	setTimes(&out.Attr, stamp(r.UpdatedAt))
	return 0
}
