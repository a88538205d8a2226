package fs

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cockpitfs/cockpitfs/engine"
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
	mu      sync.Mutex
	seen    int64  // the stack's revision at open
	seenAt  uint64 // the cockpit's change count at open
	result  []byte // the line, once a read returned it
	charges        // the open counts with its uid's open bytes
}

var (
	_ = (gofs.NodeOpener)((*waitFile)(nil))
	_ = (gofs.NodeReader)((*waitFile)(nil))
	_ = (gofs.NodeGetattrer)((*waitFile)(nil))
	_ = (gofs.NodeReleaser)((*waitFile)(nil))
)

func (f *FS) newWaitFile(path, cockpit, stack string) *waitFile {
	return &waitFile{fsys: f, path: path, cockpit: cockpit, stack: stack}
}

func (w *waitFile) Open(ctx context.Context, flags uint32) (_ gofs.FileHandle, _ uint32, errno syscall.Errno) {
	defer w.fsys.guard("open", w.path, "", &errno)
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EACCES
	}
	h := &waitHandle{charges: charges{uid: requestUID(ctx)}}
	if w.stack == "" {
		h.seenAt = w.fsys.eng.CockpitSeen(w.cockpit)
		if _, err := w.fsys.eng.Cockpit(w.cockpit); err != nil {
			return nil, 0, w.fsys.failNoEvent("open", w.path, err)
		}
	} else {
		r, err := w.fsys.eng.Stack(w.cockpit, w.stack)
		if err != nil {
			return nil, 0, w.fsys.failNoEvent("open", w.path, err)
		}
		h.seen = r.Revision
	}
	if err := w.fsys.snapshots.charge(&h.charges, openCost, "open"); err != nil {
		return nil, 0, w.fsys.fail(caller(ctx, "open", w.path), w.cockpit, w.stack, err)
	}
	return h, openFlags, 0
}

// Release gives back what the open was counted for.
func (w *waitFile) Release(_ context.Context, fh gofs.FileHandle) (errno syscall.Errno) {
	defer w.fsys.guard("release", w.path, "", &errno)
	if h, ok := fh.(*waitHandle); ok {
		w.fsys.snapshots.discharge(&h.charges)
	}
	return 0
}

func (w *waitFile) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (_ fuse.ReadResult, errno syscall.Errno) {
	defer w.fsys.guard("read", w.path, "", &errno)
	h, ok := fh.(*waitHandle)
	if !ok {
		return nil, syscall.EBADF
	}
	// Counted before h.mu: a read queued behind another on the same open waits as long.
	uid := requestUID(ctx)
	if err := w.fsys.waiting.enter(uid); err != nil {
		return nil, w.fsys.fail(caller(ctx, "read", w.path), w.cockpit, w.stack, err)
	}
	defer w.fsys.waiting.leave(uid)
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

// DefaultMaxWaitsPerUID is the most reads one uid may have waiting in wait files at once: a wait
// per stack of a user's full cockpit (engine.MaxStacks), whoever reads them.
const DefaultMaxWaitsPerUID = 1024

// waiting counts each uid's reads in wait files. A read holds one of the daemon's requests (its
// goroutine and buffers, ≈ 10 KiB) until something commits, however long that is, where any
// other request ends within an operation's budget: unbounded, 3,000 of one user's threads
// blocked in reads grew the daemon that serves everybody by 28 MiB.
type waiting struct {
	bound engine.UIDBound
	// mu guards n; a leaf.
	mu sync.Mutex
	n  map[uint32]int // reads under way by uid; a uid with none has no entry
}

// enter counts a read of uid's, or refuses it (WAIT_UID_LIMIT) past uid's bound.
func (w *waiting) enter(uid uint32) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if limit := w.bound.Of(uid); limit > 0 && w.n[uid] >= limit {
		return &engine.Refusal{Code: engine.WaitUIDLimit,
			Message: fmt.Sprintf("uid %d already has %d reads waiting in wait files, the most one user may", uid, w.n[uid]),
			Fix:     "end waits you no longer need (each waiting read holds the daemon's memory until something commits), or ask the daemon's administrator to raise --max-waits-per-uid"}
	}
	if w.n == nil {
		w.n = map[uint32]int{}
	}
	w.n[uid]++
	return nil
}

// leave ends a read enter counted.
func (w *waiting) leave(uid uint32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n[uid]--; w.n[uid] <= 0 {
		delete(w.n, uid)
	}
}
