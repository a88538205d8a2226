package fs

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cockpitfs/cockpitfs/engine"
)

// view is a file's content rendered from one consistent snapshot.
type view struct {
	data     []byte
	mtime    time.Time
	uid      uint32
	revision int64 // the stack's revision in that snapshot, for files in a stack
}

// render produces a file's current view; a NotFound refusal means the file does not exist now.
type render func() (view, error)

// writer applies one write(2) to a writable file: a command, or the config document so far.
type writer interface {
	write(ctx context.Context, f *file, h *handle, data []byte, off int64) error
}

// file is a regular file of the tree: read-only views and writable control files alike. Every
// open takes its own snapshot (like seq_file's single_open), so reads of one open agree.
type file struct {
	fs.Inode
	fsys    *FS
	path    string
	cockpit string
	stack   string
	render  render
	writer  writer // nil: read-only
	fixed   *view  // a frozen file's one content (see entry.frozen)
}

// handle is one open of a file.
type handle struct {
	mu      sync.Mutex
	view    view
	created bool   // this open created the holder it writes
	doc     []byte // config: everything written through this open
}

var (
	_ = (fs.NodeOpener)((*file)(nil))
	_ = (fs.NodeReader)((*file)(nil))
	_ = (fs.NodeWriter)((*file)(nil))
	_ = (fs.NodeGetattrer)((*file)(nil))
	_ = (fs.NodeSetattrer)((*file)(nil))
	_ = (fs.NodeFsyncer)((*file)(nil))
)

// openFlags are every open's but a frozen file's: direct I/O, so every read reaches the handle's
// snapshot and never a page cache of another; no FLUSH at close, since nothing waits for one (a
// command applies at its write(2), and its errno is that write's).
const openFlags = fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH

// frozenOpenFlags are a frozen file's opens: its content never changes, so the pages the kernel
// keeps are right for every open of it.
const frozenOpenFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH

func (f *FS) newFile(path, cockpit, stack string, r render, w writer) *file {
	return &file{fsys: f, path: path, cockpit: cockpit, stack: stack, render: r, writer: w}
}

// frozenFile is read-only f fixed at v.
func (f *FS) frozenFile(of *file, v view) *file {
	return &file{fsys: f, path: of.path, cockpit: of.cockpit, stack: of.stack, fixed: &v}
}

// frozenIno numbers a frozen file by its path and everything a stat or read shows of it.
func frozenIno(path string, v view) uint64 {
	h := fnv.New64a()
	h.Write([]byte(path))
	var attrs [13]byte // a 0 ends the path, then mtime and uid
	binary.LittleEndian.PutUint64(attrs[1:], uint64(v.mtime.UnixNano()))
	binary.LittleEndian.PutUint32(attrs[9:], v.uid)
	h.Write(attrs[:])
	h.Write(v.data)
	return h.Sum64() | 1<<63 // never 0, and apart from the paths' own numbers
}

// openCreated is the handle of the open that created f: the only one that may choose a new
// holder's checkout.
func (f *file) openCreated() (*handle, error) {
	v, err := f.render()
	return &handle{view: v, created: true}, err
}

func (f *file) Open(ctx context.Context, flags uint32) (_ fs.FileHandle, _ uint32, errno syscall.Errno) {
	defer f.fsys.guard("open "+f.path, &errno)
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY && f.writer == nil {
		return nil, 0, syscall.EACCES
	}
	if f.fixed != nil {
		return &handle{view: *f.fixed}, frozenOpenFlags, 0
	}
	v, err := f.render()
	if err != nil { // a holder released since the kernel looked it up, say: gone
		return nil, 0, f.fsys.fail(caller(ctx, "open", f.path), "", "", gone(err))
	}
	h := &handle{view: v}
	if flags&syscall.O_APPEND != 0 {
		// An append (>>) continues the document there. Anything else writes a whole document:
		// go-fuse negotiates no atomic O_TRUNC, so `>` arrives as OPEN then a handle-less
		// SETATTR(size=0), and cannot be told apart here from a write in place.
		h.doc = append([]byte(nil), v.data...)
	}
	return h, openFlags, 0
}

func (f *file) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (_ fuse.ReadResult, errno syscall.Errno) {
	defer f.fsys.guard("read "+f.path, &errno)
	h, ok := fh.(*handle)
	if !ok {
		return nil, syscall.EBADF
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	data := h.view.data
	if off >= int64(len(data)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(data[off:min(int64(len(data)), off+int64(len(dest)))]), 0
}

func (f *file) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (written uint32, errno syscall.Errno) {
	defer f.fsys.guard("write "+f.path, &errno)
	ctx = uninterrupted(ctx)
	h, ok := fh.(*handle)
	if !ok || f.writer == nil {
		return 0, syscall.EBADF
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := f.writer.write(ctx, f, h, data, off); err != nil {
		return 0, f.fsys.fail(caller(ctx, "write", f.path), f.cockpit, f.stack, err)
	}
	return uint32(len(data)), 0
}

func (f *file) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) (errno syscall.Errno) {
	defer f.fsys.guard("getattr "+f.path, &errno)
	var v view
	if f.fixed != nil {
		v = *f.fixed
		out.SetTimeout(entryTimeout) // it never changes
	} else if h, ok := f.fsys.openedHandle(ctx, fh); ok {
		h.mu.Lock()
		v = h.view
		h.mu.Unlock()
	} else {
		var err error
		if v, err = f.render(); err != nil {
			return f.fsys.fail(caller(ctx, "getattr", f.path), "", "", err)
		}
	}
	out.Mode = syscall.S_IFREG | 0o444
	if f.writer != nil {
		out.Mode = syscall.S_IFREG | 0o644
	}
	out.Nlink = 1
	out.Size = uint64(len(v.data))
	out.Uid = v.uid
	setTimes(&out.Attr, v.mtime)
	return 0
}

// Setattr accepts truncation (`>` opens with O_TRUNC) and time changes (`touch`) without changing
// anything: a command is what a write says, and truncation alone says nothing.
func (f *file) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) (errno syscall.Errno) {
	defer f.fsys.guard("setattr "+f.path, &errno)
	if f.writer == nil {
		return syscall.EACCES
	}
	if size, ok := in.GetSize(); ok && size == 0 {
		if h, ok := fh.(*handle); ok {
			h.mu.Lock()
			h.doc = h.doc[:0]
			h.mu.Unlock()
		}
	}
	return f.Getattr(ctx, fh, out)
}

// Fsync succeeds: an acknowledged change is already durable.
func (f *file) Fsync(context.Context, fs.FileHandle, uint32) syscall.Errno { return 0 }

// tooLarge refuses a write of n bytes past the 64 KiB a command may take (EFBIG).
func tooLarge(n int) error {
	return &engine.Refusal{Code: engine.CommandTooLarge, Fix: "write a shorter command",
		Message: fmt.Sprintf("a command is at most %d bytes; this write makes %d", maxCommand, n)}
}
