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
// everybody to a gigabyte. So a node keeps its content while it is the node the latest lookup of
// its path gave, and for retireAfter once a lookup gave a newer one: a reader that looked the
// path up just before still opens what it looked up. Then it lets its content go, and keeps its
// attributes, so a stat, or an fstat of an open of it, answers as before; an open of it finds
// the content again when an open of it still holds it (/dev/fd/3) or the path still renders it,
// and answers ESTALE otherwise, on which the kernel walks the path again and opens the node of
// the current content. What such a node costs is its attributes and go-fuse's entry for it,
// about a kilobyte with the kernel's own. The contents retired nodes keep are bounded by
// maxRetiredBytes: past it (a revision every few milliseconds, each of a large record) the
// oldest go at once, and an open that lost that race answers ESTALE twice over, at worst.

// retireAfter is how long a node keeps its content once a newer node of its path was looked up,
// and maxRetiredBytes what such nodes keep at most, all paths together.
const (
	retireAfter     = time.Second
	maxRetiredBytes = 16 << 20
)

// fixedView is a frozen file's one content and the attributes it shows.
type fixedView struct {
	attrs view // everything but the content (data is nil)
	size  int64
	mu    sync.Mutex
	data  []byte // nil once the node let it go (see frozenNodes)
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

// frozenNodes are the frozen nodes that keep their content: each path's latest, and the
// retired ones, which a newer node of their path replaced, oldest first.
type frozenNodes struct {
	mu           sync.Mutex
	latest       map[string]*file
	retired      []retiredNode
	retiredBytes int64
	trimming     bool // a trim is due (time.AfterFunc)
}

type retiredNode struct {
	f  *file
	at time.Time
}

// keep makes f, which holds v (the content it stands for, just rendered), its path's latest
// node: it keeps (or finds again) its content, and the node it replaces is retired.
func (n *frozenNodes) keep(f *file, v view) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.latest == nil {
		n.latest = map[string]*file{}
	}
	old := n.latest[f.path]
	if old == f {
		return
	}
	if _, kept := f.fixed.content(); !kept {
		f.fixed.set(v.data)
	}
	n.latest[f.path] = f
	if old != nil {
		n.retired = append(n.retired, retiredNode{old, time.Now()})
		n.retiredBytes += old.fixed.size
	}
	n.trim()
}

// trim lets go of the contents of nodes retired longer than retireAfter, and of the oldest
// past maxRetiredBytes; a node that became its path's latest again keeps its own. It calls
// itself again when retired nodes are left.
func (n *frozenNodes) trim() {
	now := time.Now()
	drop := 0
	for ; drop < len(n.retired); drop++ {
		r := n.retired[drop]
		if now.Sub(r.at) < retireAfter && n.retiredBytes <= maxRetiredBytes {
			break
		}
		n.retiredBytes -= r.f.fixed.size
		if n.latest[r.f.path] != r.f {
			r.f.fixed.set(nil)
		}
	}
	clear(n.retired[:drop]) // their nodes go once the kernel forgets them
	n.retired = n.retired[drop:]
	if len(n.retired) > 0 && !n.trimming {
		n.trimming = true
		time.AfterFunc(retireAfter-now.Sub(n.retired[0].at), func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			n.trimming = false
			n.trim()
		})
	}
}

// forget takes f, a node the kernel forgot, out of the latest nodes (a retired one goes at its
// trim).
func (n *frozenNodes) forget(f *file) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.latest[f.path] == f {
		delete(n.latest, f.path)
	}
}

// OnForget: a frozen node the kernel no longer knows keeps nothing in frozenNodes.
func (f *file) OnForget() {
	if f.fixed != nil {
		f.fsys.frozen.forget(f)
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
		return view{}, syscall.ESTALE
	}
	f.fsys.frozen.keep(f, v)
	return v, 0
}
