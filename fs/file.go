package fs

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/liveness"
)

// view is a file's content rendered from one consistent snapshot.
type view struct {
	data     []byte
	mtime    time.Time
	uid      uint32
	revision int64 // the stack's revision in that snapshot, for files in a stack
	// start is where data begins in the file's history: the bytes ever appended before the
	// window an events file keeps (0 for every other file).
	start int64
	// seqs are an events file's lines' numbers, one a line in order (see handle.follow).
	seqs []uint64
}

// render produces a file's current view; a NotFound refusal means the file does not exist now.
type render func() (view, error)

// writer takes one write(2) to a writable file: a command's line or a piece of it (see
// commandWriter), or a piece of a document (see documentWriter).
type writer interface {
	write(ctx context.Context, f *file, h *handle, data []byte, off int64) error
}

// file is a regular file of the tree: read-only views and writable control files alike. Every
// open takes its own snapshot (like seq_file's single_open), so reads of one open agree.
type file struct {
	gofs.Inode
	fsys    *FS
	path    string
	cockpit string
	stack   string
	render  render
	// stat, when set, is what a stat by path shows in place of a rendering: for a file whose
	// rendering may wait on what users chose (gc's survey), never rendered but for an open.
	stat   render
	writer writer     // nil: read-only
	fixed  *fixedView // a frozen file's one content (see entry.frozen, frozen.go)
	// follows: an append-only file (events) an open keeps reading as it grows (see handle.base).
	follows bool
	// opens are the file's opens by the thread that opened each (see opened).
	opens threadOpens
}

// threadOpens are a file's opens keyed by the thread that opened each. FUSE sends a process's
// fstat as a stat by path, so a file observed at each open (health) would be observed again
// to answer `cat`'s fstat, and the size could differ from what that open reads. A stat by path
// from the very thread that opened the file is taken for its fstat and answered from its open;
// so is one from another thread of the same process while that process has the file open once
// (Node's readFile opens on one thread of its pool and fstats on another, then reads exactly
// the size it was told: a size observed anew truncated what it read). Any other stat observes
// anew. A writable file's opens answer no stat; they are what a SETATTR without a handle goes
// through (see callerOpen).
type threadOpens struct {
	mu sync.Mutex
	by map[uint32]*handle
}

func (o *threadOpens) add(tid uint32, h *handle) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.by == nil {
		o.by = map[uint32]*handle{}
	}
	o.by[tid] = h
}

func (o *threadOpens) remove(h *handle) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.by[h.tid] == h {
		delete(o.by, h.tid)
	}
}

func (o *threadOpens) of(tid uint32) (*handle, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if h, ok := o.by[tid]; ok || len(o.by) == 0 {
		return h, ok
	}
	pid, err := liveness.ProcessOf(int(tid))
	if err != nil {
		return nil, false
	}
	var found *handle
	for opener, h := range o.by {
		if inProcess(opener, pid) {
			if found != nil {
				return nil, false // two opens of the process: which one it stats is unknown
			}
			found = h
		}
	}
	return found, found != nil
}

// held is the view one of the opens holds, if any.
func (o *threadOpens) held() (view, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, h := range o.by {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.view, true
	}
	return view{}, false
}

// inProcess says whether thread tid belongs to process pid.
func inProcess(tid uint32, pid int) bool {
	p, err := liveness.ProcessOf(int(tid))
	return err == nil && p == pid
}

// handle is one open of a file.
type handle struct {
	mu      sync.Mutex
	view    view
	created bool   // this open created the holder it writes
	doc     []byte // config: everything written through this open
	// line is a command's text written through this open that no write has ended yet: the
	// pieces of a line a writer's buffer cut (see pendingCommand).
	line []byte
	// dirty: doc was written since it was last applied (see documentWriter).
	dirty bool
	// refused: a write of doc was refused (its line in events written then). The document is
	// never applied; every later write and fsync of this open returns the same errno without
	// another events line, until a truncation starts a new document. For a command: a piece of
	// a line was refused, and so is the rest of that line, up to the write that ends it.
	refused syscall.Errno
	// scattered: doc was not written front to back (see configWriter).
	scattered bool
	// wrote: this open wrote a document, so attributes set through it (a copy restoring the
	// source's times and mode: mv, cp -p) are accepted and change nothing.
	wrote bool
	// read is how far this open has read, in the same terms as base (see follow).
	read int64
	tid  uint32 // the thread that opened it (see threadOpens)
	// opener (an open for writing's) and writers, those that wrote what is pending, are the
	// processes of this open (see party). Every other holder of one of its descriptors inherited
	// it (fork copies them all): a `$(…)` subshell, a child python started.
	opener  int
	writers []int
	// pin is this open's hold on the shared snapshot it took (nil: none; see snapshots).
	pin *pin
	// what it writes counts against the open bytes of the uid that opened it
	charges
	// base is where this open's offset 0 lies in the file's history: the start of the window it
	// first saw. Offsets of an open stay put as the window slides, so `tail -f` and `less +F`
	// read each new line once; a fresh open (`cat`) starts at the window it sees.
	base int64
}

// follow takes v, a later rendering of the events file h reads, as h's view: the lines appended
// since (by their seq) are added to it, and what h saw stays as h saw it, at the same offsets. A
// window of an events file may drop a line from its middle (a uid's oldest refusal), which moves
// every line before it in a fresh open; an open that keeps reading must still read each line
// once, in order. Lines the file no longer keeps leave the view from its front, and so do lines
// the open has read once the view holds more than twice the file: it stays about its size.
//
// A rendering older than the view (renderings race each other to the handle) adds nothing. So
// does a file made anew, its lines numbered from 0 again, until its numbers pass the view's: a
// stack removed and made again under the same name while someone follows its events. It says
// whether the view changed.
func (h *handle) follow(v view) bool {
	seen := len(h.view.seqs)
	if len(v.seqs) == 0 || seen > 0 && v.seqs[len(v.seqs)-1] <= h.view.seqs[seen-1] {
		return false
	}
	if seen == 0 {
		// Its offsets continue after what the open has, as a follower expects of a file that grew.
		v.start = max(v.start, h.view.start+int64(len(h.view.data)))
		h.view = v
		return true
	}
	window := len(v.data)
	last := h.view.seqs[seen-1]
	from := sort.Search(len(v.seqs), func(i int) bool { return v.seqs[i] > last })
	drop := sort.Search(seen, func(i int) bool { return h.view.seqs[i] >= v.seqs[0] })
	dropBytes := lineOffset(h.view.data, drop)
	appended := v.data[lineOffset(v.data, from):]
	data := append(append(make([]byte, 0, len(h.view.data)-dropBytes+len(appended)), h.view.data[dropBytes:]...), appended...)
	seqs := append(append(make([]uint64, 0, seen-drop+len(v.seqs)-from), h.view.seqs[drop:]...), v.seqs[from:]...)
	v.start, v.data, v.seqs = h.view.start+int64(dropBytes), data, seqs
	if read := int(h.read - v.start); len(v.data) > 2*window+64<<10 && read > 0 {
		// Bounded: what the open has read goes, whole lines of it.
		lines := bytes.Count(v.data[:min(read, len(v.data))], []byte("\n"))
		cut := lineOffset(v.data, lines)
		v.start, v.data, v.seqs = v.start+int64(cut), v.data[cut:], v.seqs[lines:]
	}
	h.view = v
	return true
}

// followWithin is follow, counting what the open now holds of its own (the lines it followed,
// with those it saw, copied from the shared snapshot it opened) with its uid's open bytes, as the
// most it held: past the bound the view stays as it was and the refusal is returned. Uncounted,
// one user's opens of a busy events file, each read after the file moved on, would each hold a
// copy of up to twice the file.
func (h *handle) followWithin(ss *snapshots, v view) error {
	before := h.view
	if !h.follow(v) {
		return nil
	}
	if err := ss.charge(&h.charges, int64(len(h.view.data)), "follow"); err != nil {
		h.view = before
		return err
	}
	return nil
}

// lineOffset is where line i (from 0) of data starts.
func lineOffset(data []byte, i int) int {
	off := 0
	for ; i > 0 && off < len(data); i-- {
		nl := bytes.IndexByte(data[off:], '\n')
		if nl < 0 {
			return len(data)
		}
		off += nl + 1
	}
	return off
}

var (
	_ = (gofs.NodeOpener)((*file)(nil))
	_ = (gofs.NodeReader)((*file)(nil))
	_ = (gofs.NodeWriter)((*file)(nil))
	_ = (gofs.NodeGetattrer)((*file)(nil))
	_ = (gofs.NodeSetattrer)((*file)(nil))
	_ = (gofs.NodeFsyncer)((*file)(nil))
	_ = (gofs.NodeReleaser)((*file)(nil))
	_ = (gofs.NodeFlusher)((*file)(nil))
)

// Release forgets a followed open, and the open its thread's stats and SETATTRs went through,
// and lets go of its snapshot. It applies what is still pending: what a close held back for a
// descriptor that was of another open (a process writing the file through two opens), or wrote
// by a process the open did not remember (see applyPending, maxWriters).
func (f *file) Release(ctx context.Context, fh gofs.FileHandle) (errno syscall.Errno) {
	defer f.fsys.guard("release", f.path, "", &errno)
	f.applyPending(ctx, fh, "release")
	if h, ok := fh.(*handle); ok {
		f.fsys.snapshots.release(h.pin)
		f.fsys.snapshots.discharge(&h.charges)
		if f.follows {
			f.fsys.followers.remove(f.path, h)
		}
		if h.tid != 0 {
			f.opens.remove(h)
		}
	}
	return 0
}

// followers are the opens of each followed file, by path. A stat of a followed file from a
// process following it counts its size from the offset 0 of that process's opens (see Getattr).
type followers struct {
	ss    *snapshots // what the opens' own copies count with
	mu    sync.Mutex
	opens map[string]map[*handle]struct{}
}

func (o *followers) add(path string, h *handle) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.opens == nil {
		o.opens = map[string]map[*handle]struct{}{}
	}
	if o.opens[path] == nil {
		o.opens[path] = map[*handle]struct{}{}
	}
	o.opens[path][h] = struct{}{}
}

func (o *followers) remove(path string, h *handle) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.opens[path], h)
	if len(o.opens[path]) == 0 {
		delete(o.opens, path)
	}
}

// catchUp brings every open of path up to v: the last lines of an events file about to be
// removed (its stack's), which its followers read before its end, as of a removed file on a disk.
func (o *followers) catchUp(path string, v view) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for h := range o.opens[path] {
		h.mu.Lock()
		_ = h.followWithin(o.ss, v) // past the bound, what it had
		h.mu.Unlock()
	}
}

// following says whether path has followers: catchUp is for them alone.
func (o *followers) following(path string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.opens[path]) > 0
}

// sizeOf brings the opens of path by thread tid's process up to v (when given: nil for a file
// removed since, which its followers keep as they read it) and returns the largest size one of
// them has, and its view; false when that process follows nothing there.
func (o *followers) sizeOf(path string, v *view, tid uint32) (uint64, view, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.opens[path]) == 0 || tid == 0 {
		return 0, view{}, false
	}
	pid, err := liveness.ProcessOf(int(tid))
	var largest int64
	var largestView view
	found := false
	for h := range o.opens[path] {
		if h.tid != tid && (err != nil || !inProcess(h.tid, pid)) {
			continue
		}
		h.mu.Lock()
		if v != nil {
			_ = h.followWithin(o.ss, *v) // past the bound, the size it had
		}
		if size := h.view.start + int64(len(h.view.data)) - h.base; !found || size > largest {
			largest, largestView = size, h.view
		}
		h.mu.Unlock()
		found = true
	}
	return uint64(largest), largestView, found
}

// openFlags are every read-only open's but a frozen file's: direct I/O, so every read reaches the
// handle's snapshot and never a page cache of another; no FLUSH at close, since nothing waits for
// one. An open for writing has FLUSH (writeOpenFlags): its close applies what is pending.
const openFlags = fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH

// writeOpenFlags are an open for writing's: the close applies a document, or a command whose line
// no write ended, and sees whether its writer was killed (see applyPending).
const writeOpenFlags = fuse.FOPEN_DIRECT_IO

// frozenOpenFlags are a frozen file's opens: its content never changes, so the pages the kernel
// keeps are right for every open of it.
const frozenOpenFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH

func (f *FS) newFile(path, cockpit, stack string, r render, w writer) *file {
	return &file{fsys: f, path: path, cockpit: cockpit, stack: stack, render: r, writer: w}
}

// frozenFile is read-only f fixed at v.
func (f *FS) frozenFile(of *file, v view) *file {
	return &file{fsys: f, path: of.path, cockpit: of.cockpit, stack: of.stack, render: of.render, fixed: newFixedView(v)}
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
// holder's checkout. It renders f with created, when the create gave one.
func (f *file) openCreated(created render, uid uint32) (*handle, error) {
	if created == nil {
		created = f.render
	}
	v, err := created()
	return &handle{view: v, created: true, charges: charges{uid: uid}}, err
}

func (f *file) Open(ctx context.Context, flags uint32) (_ gofs.FileHandle, _ uint32, errno syscall.Errno) {
	defer f.fsys.guard("open", f.path, "", &errno)
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY && f.writer == nil {
		return nil, 0, syscall.EACCES
	}
	if f.fixed != nil {
		v, errno := f.fixedContent()
		if errno != 0 {
			return nil, 0, errno
		}
		h, errno := f.pinned(ctx, v)
		if errno != 0 {
			return nil, 0, errno
		}
		f.opened(ctx, h) // what an open of this node finds once the node let its content go
		return h, frozenOpenFlags, 0
	}
	v, err := f.render()
	if err != nil { // a holder released since the kernel looked it up, say: gone
		return nil, 0, f.fsys.failNoEvent("open", f.path, gone(err))
	}
	openedFlags := uint32(openFlags)
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		if d, isDocument := f.writer.(documentWriter); isDocument {
			// Who may write it is known now: refused here, even bash's echo reports it.
			if err := d.mayOpen(caller(ctx, "open", f.path), f); err != nil {
				return nil, 0, f.fsys.fail(caller(ctx, "open", f.path), f.cockpit, f.stack, err)
			}
		}
		openedFlags = writeOpenFlags
	}
	h, errno := f.pinned(ctx, v)
	if errno != 0 {
		return nil, 0, errno
	}
	if flags&syscall.O_APPEND != 0 {
		// An append (>>) continues the document there. Anything else writes a whole document:
		// go-fuse negotiates no atomic O_TRUNC, so `>` arrives as OPEN then a handle-less
		// SETATTR(size=0), and cannot be told apart here from a write in place.
		if err := f.fsys.snapshots.charge(&h.charges, int64(len(v.data)), "append"); err != nil {
			f.fsys.snapshots.release(h.pin)
			return nil, 0, f.fsys.fail(caller(ctx, "open", f.path), f.cockpit, f.stack, err)
		}
		h.doc = append([]byte(nil), v.data...)
	}
	f.opened(ctx, h)
	if openedFlags == writeOpenFlags {
		h.opener, _ = callerProcess(ctx)
	}
	if f.follows {
		f.fsys.followers.add(f.path, h)
	}
	return h, openedFlags, 0
}

// pinned is a new open's handle on v, its content shared with every open of the same content and
// held for the caller's uid (see snapshots), or the refusal past that uid's bound.
func (f *file) pinned(ctx context.Context, v view) (*handle, syscall.Errno) {
	uid := requestUID(ctx)
	data, p, err := f.fsys.snapshots.acquire(uid, f.path, v.data)
	if err != nil {
		return nil, f.fsys.fail(caller(ctx, "open", f.path), f.cockpit, f.stack, err)
	}
	v.data = data
	return &handle{view: v, base: v.start, pin: p, charges: charges{uid: uid}}, 0
}

// requestUID is the uid the kernel says made the request (0 outside one).
func requestUID(ctx context.Context) uint32 {
	if fc, ok := fuse.FromContext(ctx); ok {
		return fc.Uid
	}
	return 0
}

func (f *file) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (_ fuse.ReadResult, errno syscall.Errno) {
	defer f.fsys.guard("read", f.path, "", &errno)
	h, ok := fh.(*handle)
	if !ok {
		return nil, syscall.EBADF
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	at := h.base + off
	if f.follows && at >= h.view.start+int64(len(h.view.data)) {
		// At the end of what this open saw: whatever was appended since is read now.
		if v, err := f.render(); err == nil {
			if err := h.followWithin(&f.fsys.snapshots, v); err != nil {
				return nil, f.fsys.fail(caller(ctx, "read", f.path), f.cockpit, f.stack, err)
			}
		}
	}
	if at < h.view.start {
		// The lines this open had not read yet were trimmed from the window: it skips them,
		// and reads on from the oldest line kept, never a line twice.
		h.base += h.view.start - at
		at = h.view.start
	}
	data := h.view.data
	from := at - h.view.start
	if from >= int64(len(data)) {
		return fuse.ReadResultData(nil), 0
	}
	to := min(int64(len(data)), from+int64(len(dest)))
	h.read = max(h.read, h.view.start+to)
	return fuse.ReadResultData(data[from:to]), 0
}

func (f *file) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (written uint32, errno syscall.Errno) {
	defer f.fsys.guard("write", f.path, "", &errno)
	ctx = uninterrupted(ctx)
	h, ok := fh.(*handle)
	if !ok || f.writer == nil {
		return 0, syscall.EBADF
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, isCommand := f.writer.(commandWriter)
	_, isDocument := f.writer.(documentWriter)
	h.wroteBy(ctx, isDocument && h.dirty || isCommand && len(h.line) > 0)
	if h.refused != 0 {
		errno := h.refused
		if isCommand && endsLine(data) {
			h.refused = 0 // the refused line ends here: the next one is a command of its own
		}
		return 0, errno
	}
	// What the open holds once this write is collected, counted before it is: a command's pieces,
	// or the document up to its furthest byte. An open holds at most maxCommand: past it the
	// writer refuses the write for its size (EFBIG).
	grown := int64(len(h.doc)) + int64(len(h.line)) + int64(len(data))
	if isDocument {
		grown = max(int64(len(h.doc)), off+int64(len(data))) + int64(len(h.line))
	}
	err := f.fsys.snapshots.charge(&h.charges, min(grown, maxCommand), "write")
	if err == nil {
		err = f.writer.write(ctx, f, h, data, off)
	}
	if err != nil {
		errno := f.fsys.fail(caller(ctx, "write", f.path), f.cockpit, f.stack, err)
		if isDocument {
			// A document missing this write is not the one written: it is never applied.
			h.refused, h.dirty = errno, false
		}
		if isCommand && !endsLine(data) {
			h.refused = errno // the rest of this line is not a command of its own
		}
		h.line = h.line[:0]
		return 0, errno
	}
	return uint32(len(data)), 0
}

// ownOpen is the open a Getattr is about: fh for an fstat, or, for a stat by path, the open of
// the same thread (see threadOpens).
func (f *file) ownOpen(ctx context.Context, fh gofs.FileHandle) (*handle, bool) {
	if h, ok := f.fsys.openedHandle(ctx, fh); ok {
		return h, true
	}
	if fc, ok := ctx.(*fuse.Context); ok && fc.Pid != 0 && f.writer == nil && !f.follows {
		return f.opens.of(fc.Pid)
	}
	return nil, false
}

func (f *file) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) (errno syscall.Errno) {
	defer f.fsys.guard("getattr", f.path, "", &errno)
	out.Gid = f.fsys.gid
	var v view
	origin := int64(-1) // where the size is counted from: the view's start unless an open says
	length := int64(-1) // the content's length, when v does not hold the content
	if f.fixed != nil {
		v, length = f.fixed.attrs, f.fixed.size // its content it may have let go
		out.SetTimeout(entryTimeout)            // it never changes
	} else if h, ok := f.ownOpen(ctx, fh); ok {
		h.mu.Lock()
		if f.follows {
			// fstat of a followed open: its size grows with what is appended (tail -f polls it).
			if latest, err := f.render(); err == nil {
				_ = h.followWithin(&f.fsys.snapshots, latest) // past the bound, the size it had
			}
		}
		v = h.view
		origin = h.base
		h.mu.Unlock()
	} else {
		render := f.render
		if f.stat != nil {
			render = f.stat
		}
		var err error
		if v, err = render(); err != nil {
			fc, ok := ctx.(*fuse.Context)
			if !ok || !f.follows {
				return f.fsys.failNoEvent("getattr", f.path, err)
			}
			// Removed since (its stack drained and removed): a process following it keeps it as
			// it read it, as a follower of a removed file on a disk does; tail -f goes on.
			size, kept, following := f.fsys.followers.sizeOf(f.path, nil, fc.Pid)
			if !following {
				return f.fsys.failNoEvent("getattr", f.path, err)
			}
			out.Mode, out.Nlink, out.Size, out.Uid = syscall.S_IFREG|0o444, 1, size, kept.uid
			setTimes(&out.Attr, kept.mtime)
			return 0
		}
	}
	out.Mode = syscall.S_IFREG | 0o444
	if f.writer != nil {
		out.Mode = syscall.S_IFREG | 0o644
	}
	out.Nlink = 1
	// glibc's stdio (bash's builtins, printf, python) sizes its buffer by st_blksize: a command
	// or document of up to 64 KiB leaves a fresh buffer in one write(2).
	out.Blksize = maxCommand
	// An open's size runs from its own offset 0; a stat's is the window a new open would read.
	byPath := origin < 0
	if byPath {
		origin = v.start
	}
	if length < 0 {
		length = int64(len(v.data))
	}
	out.Size = uint64(max(0, v.start+length-origin))
	if fc, ok := ctx.(*fuse.Context); ok && byPath && f.follows {
		// FUSE sends fstat as a stat by path. A follower (tail -f) takes a size below its own
		// offset for a truncation and reads again from 0: a stat from a process following the
		// file is the largest of that process's opens, each brought up to date, so it is never
		// below its own, and grows with every line. Anyone else's is the window a new open reads
		// (rsync, `tail -c` and `wc -c` read exactly that much).
		if n, _, following := f.fsys.followers.sizeOf(f.path, &v, fc.Pid); following {
			out.Size = max(out.Size, n)
		}
	}
	out.Uid = v.uid
	setTimes(&out.Attr, v.mtime)
	return 0
}

// Setattr accepts truncation to 0 (`>` opens with O_TRUNC), which starts a new document, and a
// holder's `touch` (times set to now), which re-binds the holder to the toucher's session. Modes,
// owners and times are derived from the record, so anything else (chmod, chown, touch -d, other
// sizes) is refused with EPERM and an events line rather than answered with a success that
// changed nothing.
func (f *file) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) (errno syscall.Errno) {
	defer f.fsys.guard("setattr", f.path, "", &errno)
	ctx = uninterrupted(ctx)
	own := f.callerOpen(ctx, fh)
	// touch(1) of the holder its own open just created sets the times and nothing else: the
	// claim bound the holder already.
	if own != nil && own.created && in.Valid&(fuse.FATTR_MODE|fuse.FATTR_UID|fuse.FATTR_GID|fuse.FATTR_SIZE) == 0 && touchedNow(in) {
		return f.Getattr(ctx, fh, out)
	}
	size, sized := in.GetSize()
	if sized && f.writer == nil {
		return syscall.EACCES
	}
	if sized && size != 0 && own != nil && own.wrote {
		// A writer in place that ends its document at what it wrote (rsync --inplace: ftruncate
		// to the new length) cuts nothing it did not write: the document is what it wrote.
		own.mu.Lock()
		if fits := uint64(len(own.doc)) >= size; fits {
			own.doc, sized = own.doc[:size], false
		}
		own.mu.Unlock()
	}
	var current fuse.AttrOut
	if errno := f.Getattr(ctx, fh, &current); errno != 0 {
		return errno
	}
	op, refused := unsupportedAttrs(in, sized && size != 0, current.Attr)
	if own != nil && own.wrote && op != "truncate" {
		refused = nil // a copy restoring its source's times or mode onto the document it wrote
	}
	if _, isConfig := f.writer.(configWriter); isConfig && refused != nil && op != "truncate" && f.fsys.replacing.restoring(ctx, f.cockpit) {
		refused = nil // the same, by path, after the close (install -m): see replace.go
	}
	if refused != nil {
		return f.fsys.fail(caller(ctx, op, f.path), f.cockpit, f.stack, refused(f.path))
	}
	if sized {
		if h, ok := fh.(*handle); ok {
			h.mu.Lock()
			h.doc, h.refused, h.scattered = h.doc[:0], 0, false
			h.mu.Unlock()
		}
	}
	if own != nil && own.created {
		return f.Getattr(ctx, fh, out) // the claim that created the holder bound it already
	}
	if touchedNow(in) {
		t, ok := f.writer.(toucher)
		if !ok {
			return f.fsys.fail(caller(ctx, "utimes", f.path), f.cockpit, f.stack, timesDerived(f.path))
		}
		if err := t.touch(ctx, f); err != nil {
			return f.fsys.fail(caller(ctx, "touch", f.path), f.cockpit, f.stack, err)
		}
	}
	return f.Getattr(ctx, fh, out)
}

// callerOpen is the open a SETATTR comes through: fh, or, since FUSE sends the SETATTR of
// futimens and fchmod without the handle (only ftruncate's carries it), the caller's own open of
// f when it has one (see threadOpens); nil when neither. touch(1) sets the times on the fd its
// open created; cp -p restores a copy's times and mode on the fd it wrote.
func (f *file) callerOpen(ctx context.Context, fh gofs.FileHandle) *handle {
	if h, ok := fh.(*handle); ok {
		return h
	}
	if fc, ok := fuse.FromContext(ctx); ok && fc.Pid != 0 {
		h, _ := f.opens.of(fc.Pid)
		return h
	}
	return nil
}

// opened keeps h under the thread that opened it until its release: a stat by path from that
// thread is answered from it (read-only files: see ownOpen), and a SETATTR without a handle goes
// through it (see callerOpen).
func (f *file) opened(ctx context.Context, h *handle) {
	if fc, ok := fuse.FromContext(ctx); ok && fc.Pid != 0 {
		h.tid = fc.Pid
		if !f.follows {
			f.opens.add(h.tid, h)
		}
	}
}

// toucher is a writer whose file means something when touched.
type toucher interface {
	touch(ctx context.Context, f *file) error
}

// settable are the attributes a SETATTR may ask to change; the rest (a file handle, a lock
// owner, ctime) come along with them.
const settable = fuse.FATTR_MODE | fuse.FATTR_UID | fuse.FATTR_GID | fuse.FATTR_SIZE | fuse.FATTR_ATIME | fuse.FATTR_MTIME

// touchedNow says in sets the times to now and nothing else of them: `touch` without -d/-r/-t.
func touchedNow(in *fuse.SetAttrIn) bool {
	times := in.Valid & (fuse.FATTR_ATIME | fuse.FATTR_MTIME | fuse.FATTR_ATIME_NOW | fuse.FATTR_MTIME_NOW)
	if times == 0 {
		return false
	}
	nowOnly := true
	if in.Valid&fuse.FATTR_ATIME != 0 && in.Valid&fuse.FATTR_ATIME_NOW == 0 {
		nowOnly = false
	}
	if in.Valid&fuse.FATTR_MTIME != 0 && in.Valid&fuse.FATTR_MTIME_NOW == 0 {
		nowOnly = false
	}
	return nowOnly
}

// unsupportedAttrs names the first attribute change the tree refuses in in (the op an events line
// shows), and the refusal; nil when in asks only for what Setattr accepts. Setting the mode or
// owner a file already has changes nothing and is accepted (editors and cp -p restore them).
func unsupportedAttrs(in *fuse.SetAttrIn, resized bool, current fuse.Attr) (string, func(path string) error) {
	mode, modeSet := in.GetMode()
	uid, uidSet := in.GetUID()
	gid, gidSet := in.GetGID()
	switch {
	case modeSet && mode&0o7777 != current.Mode&0o7777:
		return "chmod", func(path string) error {
			return &engine.Refusal{Code: engine.Unsupported, Message: path + ": modes are derived from the record; chmod changes nothing",
				Fix: "leave the mode as it is: who may write is the file's owner (or root)"}
		}
	case uidSet && uid != current.Uid, gidSet && gid != current.Gid:
		return "chown", func(path string) error {
			return &engine.Refusal{Code: engine.Unsupported, Message: path + ": owners are derived from the record; chown changes nothing",
				Fix: "act as the owner instead (a holder belongs to whoever claimed it, a cockpit to whoever made it)"}
		}
	case resized:
		return "truncate", func(path string) error {
			return &engine.Refusal{Code: engine.Unsupported, Message: path + ": a file of the tree is truncated only to 0 (a new document)",
				Fix: "write the whole document or command instead"}
		}
	case in.Valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME) != 0 && !touchedNow(in):
		return "utimes", timesDerived
	}
	return "", nil
}

func timesDerived(path string) error {
	return &engine.Refusal{Code: engine.Unsupported, Message: path + ": times are those of the change that produced the content; they cannot be set",
		Fix: "touch a holder (without -d) to re-bind it to your session; other files change only by writing them"}
}

// Fsync applies what was written on this open and is pending (vim fsyncs before it closes): a
// document, or a command whose line no write ended; otherwise it succeeds, since an acknowledged
// change is already durable.
func (f *file) Fsync(ctx context.Context, fh gofs.FileHandle, _ uint32) (errno syscall.Errno) {
	defer f.fsys.guard("fsync", f.path, "", &errno)
	return f.applyPending(ctx, fh, "fsync")
}

// Flush is a close (of each descriptor of the open, by whichever process holds it): it applies
// what was written on this open and is pending, once its writer is done (see applyPending),
// unless the writer was killed. cat, cp, dd, tee, python, sed and editors report its errno;
// bash's builtins do not.
func (f *file) Flush(ctx context.Context, fh gofs.FileHandle) (errno syscall.Errno) {
	defer f.fsys.guard("flush", f.path, "", &errno)
	return f.applyPending(ctx, fh, "write")
}

// documentWriter is a writer of a whole document (config): writes collect it, and it is applied
// once, when the writer is done with it (close or fsync).
type documentWriter interface {
	// mayOpen refuses at open a writer who may not write the document.
	mayOpen(c engine.Caller, f *file) error
	apply(ctx context.Context, f *file, h *handle) error
}

// commandWriter is a writer of commands (holder attributes, drain/*): a command is whole lines,
// applied when a write(2) ends a line, or at close (see pendingCommand).
type commandWriter interface {
	command(ctx context.Context, f *file, h *handle, text string) error
}

// applyPending applies what this open wrote and nothing has applied yet: a document, or a
// command's unended line. FUSE flushes at every close(2) of every descriptor sharing the open,
// so a close (op "write") applies only when it ends the writing: it is by a process of the open
// (see party), and neither that process nor another of the open's still holds a descriptor of
// the file for writing. The close of an inherited copy by a child that wrote nothing (a `$(…)`
// subshell, a `sleep` killed) ends nothing and abandons nothing. At a close by a process of the
// open a signal killed, it applies nothing: what was written may stop anywhere (`HTTP = 2` of
// `HTTP = 26500`). One events line says so; the writer is gone and reads no errno, and the
// open's later writes are refused with the same errno. A writer that exits without closing
// closes at its exit, unkilled, and what it wrote applies.
func (f *file) applyPending(ctx context.Context, fh gofs.FileHandle, op string) syscall.Errno {
	ctx = uninterrupted(ctx)
	h, ok := fh.(*handle)
	if !ok {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	d, isDocument := f.writer.(documentWriter)
	w, isCommand := f.writer.(commandWriter)
	switch {
	case isDocument && h.refused != 0 && op == "fsync":
		return h.refused // what was written cannot be made durable
	case isDocument && h.refused != 0:
		return 0 // the writer was told at the write that was refused (cat would say it twice)
	case isDocument && !h.dirty, isCommand && len(h.line) == 0, !isDocument && !isCommand:
		return 0 // never apply on a flush nothing was written before (every close flushes)
	}
	pending := len(h.line)
	if isDocument {
		pending = len(h.doc)
	}
	if op == "release" {
		op = "write" // the last close's, which held back: nobody is left to read its errno
	} else if op == "write" {
		pid, known := callerProcess(ctx)
		if known && !h.party(pid) {
			return 0 // a copy inherited: the open's own processes are not done with it
		}
		if errno := f.abandoned(ctx, pending); errno != 0 {
			h.dirty, h.line, h.refused = false, h.line[:0], errno
			return errno
		}
		if f.stillWriting(ctx, h, pid) {
			return 0
		}
	}
	var err error
	if isDocument {
		h.dirty = false // refused or applied, it is reported once
		err = d.apply(ctx, f, h)
	} else {
		text := string(h.line)
		h.line = h.line[:0]
		err = w.command(ctx, f, h, text)
	}
	if err != nil {
		return f.fsys.fail(caller(ctx, op, f.path), f.cockpit, f.stack, err)
	}
	return 0
}

// stillWriting says whether a close of h by process pid leaves the writing unended: that process
// holds another descriptor of f for writing (bash's `printf … >&3` closes a duplicate of fd 3),
// or another process of h does (a child that wrote part exits; its parent writes on). A
// descriptor open only for reading is no duplicate of a write open, and does not count.
func (f *file) stillWriting(ctx context.Context, h *handle, pid int) bool {
	path := filepath.Join(f.fsys.dir, f.path)
	if fc, ok := fuse.FromContext(ctx); ok && liveness.HoldsOpenForWriting(int(fc.Pid), path) {
		return true
	}
	for _, p := range append([]int{h.opener}, h.writers...) {
		if p != 0 && p != pid && liveness.HoldsOpenForWriting(p, path) {
			return true
		}
	}
	return false
}

// maxWriters bounds the writers an open remembers. A write by one more is not remembered: its
// close holds back, and the release (the last close) applies what it wrote.
const maxWriters = 64

// wroteBy notes the caller's process as a writer of what h holds pending; a write that starts
// anew (pending false: nothing is) forgets the writers of what was applied or refused before.
func (h *handle) wroteBy(ctx context.Context, pending bool) {
	if !pending {
		h.writers = h.writers[:0]
	}
	if pid, ok := callerProcess(ctx); ok && !h.party(pid) && len(h.writers) < maxWriters {
		h.writers = append(h.writers, pid)
	}
}

// party says whether process pid is one of h's: its opener, or a writer of what is pending.
func (h *handle) party(pid int) bool {
	return pid == h.opener || slices.Contains(h.writers, pid)
}

// callerProcess is the process of the thread the kernel says made the request (false when none:
// outside a request, or a thread that cannot be resolved).
func callerProcess(ctx context.Context) (int, bool) {
	fc, ok := fuse.FromContext(ctx)
	if !ok || fc.Pid == 0 {
		return 0, false
	}
	pid, err := liveness.ProcessOf(int(fc.Pid))
	return pid, err == nil && pid != 0
}

// abandoned refuses, with its events line, what a close by a killed writer leaves pending.
func (f *file) abandoned(ctx context.Context, pending int) syscall.Errno {
	fc, ok := fuse.FromContext(ctx)
	if !ok {
		return 0
	}
	sig, killed := liveness.KilledBy(int(fc.Pid))
	if !killed {
		return 0
	}
	return f.fsys.fail(caller(ctx, "write", f.path), f.cockpit, f.stack, &engine.Refusal{Code: engine.WriteAbandoned,
		Message: fmt.Sprintf("its writer was killed (%s) before it closed %s: nothing of the %d bytes it wrote and had not applied was applied", unix.SignalName(sig), f.path, pending),
		Fix:     "write it again, whole"})
}

// tooLarge refuses a write of n bytes past the 64 KiB a command may take (EFBIG).
func tooLarge(n int) error {
	return &engine.Refusal{Code: engine.CommandTooLarge, Fix: "write a shorter command",
		Message: fmt.Sprintf("a command is at most %d bytes; this write makes %d", maxCommand, n)}
}
