package fs

import (
	"sync"
	"syscall"
	"time"
)

// A frozen file (entry.frozen) is a node per content: each revision of a stack's record is a
// node of its own, which the kernel keeps as long as anything holds its inode, a dentry or an
// inotify watch. Whoever looks a path up may hold the node of each revision they saw: one watch
// a revision kept a 135 KB record each, and a user's watches took the daemon that serves
// everybody to a gigabyte; a watch on a stack's files kept them after the stack was removed. So a
// node keeps its content for retireAfter after a lookup last gave it (a reader between its lookup
// and its open still reads what it looked up; a name is looked up at every open, so a file read
// keeps it). Then it lets its content go and keeps its attributes, so a stat, or an fstat of an
// open of it, answers as before; an open of it finds the content again when an open of it still
// holds it (/dev/fd/3) or the path still renders it, and answers ESTALE otherwise, on which the
// kernel walks the path again and opens the node of the current content. What such a node costs
// is its attributes and go-fuse's entry for it, about 300 bytes of the daemon's. The contents
// kept are bounded by maxKeptBytes: past it (a revision every few milliseconds, each of a large
// record) the oldest go at once, and an open that lost that race answers ESTALE twice over, at
// worst.

// retireAfter is how long a node keeps its content after a lookup last gave it, and maxKeptBytes
// what the nodes keep at most, all paths together.
const (
	retireAfter  = time.Second
	maxKeptBytes = 16 << 20
)

// fixedView is a frozen file's one content and the attributes it shows.
type fixedView struct {
	attrs view // everything but the content (data is nil)
	size  int64
	mu    sync.Mutex
	data  []byte // nil once the node let it go (see frozenNodes)
	// looked is when a lookup last gave the node, and listed says it is in frozenNodes' list;
	// both belong to frozenNodes.mu.
	looked time.Time
	listed bool
}

func newFixedView(v view) *fixedView {
	fv := &fixedView{attrs: v, size: int64(len(v.data)), data: v.data}
	fv.attrs.data = nil
	return fv
}

// content is the view with its content; false when the node let it go.
func (fv *fixedView) content() (view, bool) {
	fv.mu.Lock()
	defer fv.mu.Unlock()
	v := fv.attrs
	v.data = fv.data
	return v, fv.data != nil || fv.size == 0
}

func (fv *fixedView) set(data []byte) {
	fv.mu.Lock()
	defer fv.mu.Unlock()
	fv.data = data
}

// frozenNodes are the frozen nodes that keep their content, in the order they were listed.
type frozenNodes struct {
	mu       sync.Mutex
	kept     []keptNode
	bytes    int64
	trimming bool // a trim is due (time.AfterFunc)
}

type keptNode struct {
	f  *file
	at time.Time // when it was listed
}

// keep is a lookup giving f, which holds v (the content it stands for, just rendered): f keeps
// (or finds again) its content for retireAfter from now.
func (n *frozenNodes) keep(f *file, v view) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, held := f.fixed.content(); !held {
		f.fixed.set(v.data)
	}
	now := time.Now()
	f.fixed.looked = now
	if !f.fixed.listed {
		f.fixed.listed = true
		n.kept = append(n.kept, keptNode{f, now})
		n.bytes += f.fixed.size
	}
	n.trim()
}

// trim lets go of the contents of nodes no lookup gave for retireAfter, and of the oldest past
// maxKeptBytes; a node looked up again since it was listed is listed again, as of then. It calls
// itself again while nodes are kept.
func (n *frozenNodes) trim() {
	now := time.Now()
	for len(n.kept) > 0 {
		k := n.kept[0]
		over := n.bytes > maxKeptBytes
		if !over && now.Sub(k.at) < retireAfter {
			break
		}
		n.kept[0] = keptNode{}
		n.kept = n.kept[1:]
		if !over && k.f.fixed.looked.After(k.at) {
			n.kept = append(n.kept, keptNode{k.f, k.f.fixed.looked})
			continue
		}
		n.bytes -= k.f.fixed.size
		k.f.fixed.listed = false
		k.f.fixed.set(nil)
	}
	if len(n.kept) > 0 && !n.trimming {
		n.trimming = true
		time.AfterFunc(retireAfter-now.Sub(n.kept[0].at), func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			n.trimming = false
			n.trim()
		})
	}
}

// fixedContent is what an open of frozen f reads: its own content; when it let that go, the
// content an open of it still holds (`cat /dev/fd/3` opens fd 3's node again), else its path's
// when it renders the same; ESTALE when the path renders another content now.
func (f *file) fixedContent() (view, syscall.Errno) {
	if v, ok := f.fixed.content(); ok {
		return v, 0
	}
	if v, ok := f.opens.held(); ok {
		return v, 0
	}
	v, err := f.render()
	if err != nil { // the stack removed since, say: gone
		return view{}, f.fsys.failNoEvent("open", f.path, gone(err))
	}
	if frozenIno(f.path, v) != f.StableAttr().Ino {
		return view{}, f.fsys.failNoEvent("open", f.path, errGone)
	}
	f.fsys.frozen.keep(f, v)
	return v, 0
}
