package fs

import (
	"context"
	"errors"
	"syscall"
	"time"
	"unsafe"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine"
)

// entry is one child of a directory as a listing produces it.
type entry struct {
	name string
	node gofs.InodeEmbedder
	dir  bool
	// frozen: a read-only file rendered from the stack's record alone. Each of its contents is
	// a node of its own (see frozenFile), so the kernel may keep the node's pages and attributes
	// for good; the name is looked up at every open, which finds the node of the current content.
	frozen bool
	// unlisted: found by name but never listed (see waitFile).
	unlisted bool
	// unkept: a name that other operations than its own unlink take away (a holder a drain or a
	// claim releases). The kernel keeps it no time: kept, a create of the name after it went
	// would be an OPEN of the old node answered ESTALE, then the whole path walked again, a
	// LOOKUP per component. (Telling the kernel at once is not safe: the notification waits
	// for the directory's lock, which a request to a daemon killed meanwhile holds for good. A
	// helper process looks such names up again instead: forget.go.)
	unkept bool
}

// entryTimeout is how long the kernel may keep a name it looked up. Names that vanish through
// another operation (holders released by a claim or a drain (but see entry.unkept), the ports and
// env of a lease) cannot be kept stale by it: attributes are never cached, so a stat of a kept name reaches
// Getattr, which answers ENOENT once it is gone, and an open reaches Open, which answers ESTALE
// so the kernel walks the path again with a fresh LOOKUP.
const entryTimeout = time.Hour

// ownNames is implemented by listings whose names appear only through this mount's own mkdir or
// create in them (cockpits, stacks, holders): the kernel follows those by itself, so it may also
// keep the answer that a name does not exist, and a claim's create skips its LOOKUP.
type ownNames interface{ namesAppearOnlyThroughOwnOps() }

// lookuper finds one child without listing them all (a stack may have a thousand holders).
type lookuper interface {
	lookup(ctx context.Context, d *dir, name string) (entry, bool, error)
}

// listing is what a directory shows; each directory concept implements it, and the mutations it
// supports through the optional interfaces below. Anything else is refused with EPERM.
type listing interface {
	entries(ctx context.Context, d *dir) ([]entry, error)
}

type (
	mkdirer interface {
		mkdir(ctx context.Context, d *dir, name string) syscall.Errno
	}
	rmdirer interface {
		rmdir(ctx context.Context, d *dir, name string) syscall.Errno
	}
	creator interface {
		// create makes name, and may return how the create's own open renders it (nil: as any
		// open does).
		create(ctx context.Context, d *dir, name string, mode uint32) (render, error)
	}
	unlinker interface {
		unlink(ctx context.Context, d *dir, name string) syscall.Errno
	}
)

// dir is a directory of the tree; cockpit and stack say where it is (either may be "").
type dir struct {
	gofs.Inode
	fsys    *FS
	path    string
	cockpit string
	stack   string
	list    listing
}

func (f *FS) newDir(path, cockpit, stack string, list listing) *dir {
	return &dir{fsys: f, path: path, cockpit: cockpit, stack: stack, list: list}
}

func (d *dir) child(name string) string { return childPath(d.path, name) }

// childPath is the tree path of name in the directory at path ("" for the root).
func childPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "/" + name
}

var (
	_ = (gofs.NodeLookuper)((*dir)(nil))
	_ = (gofs.NodeReaddirer)((*dir)(nil))
	_ = (gofs.NodeGetattrer)((*dir)(nil))
	_ = (gofs.NodeMkdirer)((*dir)(nil))
	_ = (gofs.NodeRmdirer)((*dir)(nil))
	_ = (gofs.NodeCreater)((*dir)(nil))
	_ = (gofs.NodeUnlinker)((*dir)(nil))
	_ = (gofs.NodeRenamer)((*dir)(nil))
	_ = (gofs.NodeMknoder)((*dir)(nil))
	_ = (gofs.NodeSymlinker)((*dir)(nil))
	_ = (gofs.NodeLinker)((*dir)(nil))
	_ = (gofs.NodeSetattrer)((*dir)(nil))
)

// find is the child name of d now; a NotFound refusal when there is none.
func (d *dir) find(ctx context.Context, name string) (entry, error) {
	e, found, err := d.entry(ctx, name)
	if err == nil && !found {
		err = notFound("%s does not exist", d.child(name))
	}
	return e, err
}

// entry is find without the refusal for a missing name, which a lookup answers with ENOENT alone:
// every claim's create looks its name up first.
func (d *dir) entry(ctx context.Context, name string) (entry, bool, error) {
	if l, ok := d.list.(lookuper); ok {
		return l.lookup(ctx, d, name)
	}
	es, err := d.list.entries(ctx, d)
	if err != nil {
		return entry{}, false, err
	}
	for _, e := range es {
		if e.name == name {
			return e, true, nil
		}
	}
	return entry{}, false, nil
}

func (d *dir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (_ *gofs.Inode, errno syscall.Errno) {
	defer d.fsys.guard("lookup", d.path, name, &errno)
	e, found, err := d.entry(ctx, name)
	if err != nil || !found {
		missing := errnos[engine.NotFound]
		if err != nil {
			missing = d.fsys.failNoEvent("lookup", d.child(name), err)
		}
		// Over a shared store another machine's daemon creates names too.
		if _, ok := d.list.(ownNames); ok && missing == errnos[engine.NotFound] && !d.fsys.eng.Shared() {
			out.SetEntryTimeout(entryTimeout) // a negative entry: see rawLayer.Lookup
		}
		return nil, missing
	}
	return d.enter(ctx, e, out, nil)
}

// enter answers a lookup of e: its inode (the one already known for its identity, if any), its
// attributes (from fh's view when an open already took one) and its timeouts.
func (d *dir) enter(ctx context.Context, e entry, out *fuse.EntryOut, fh gofs.FileHandle) (*gofs.Inode, syscall.Errno) {
	node, id, errno := d.node(ctx, e)
	if errno != 0 {
		return nil, errno
	}
	in := d.NewInode(ctx, node, id)
	if f, ok := in.Operations().(*file); ok && f.fixed != nil {
		// The node the kernel now has for the name: maybe one it knew, which let its content go.
		v, _ := node.(*file).fixed.content()
		d.fsys.frozen.keep(f, v)
	}
	if g, ok := in.Operations().(gofs.NodeGetattrer); ok {
		var attr fuse.AttrOut
		if errno := g.Getattr(ctx, fh, &attr); errno != 0 {
			return nil, errno
		}
		out.Attr = attr.Attr
		out.SetAttrTimeout(attr.Timeout())
	}
	if !e.frozen && !e.unkept {
		out.SetEntryTimeout(entryTimeout)
	}
	return in, 0
}

// node is what e is now, and its identity: for a frozen entry, the file rendered now, whose
// inode number is that of its path and content, so the same content is the same node.
func (d *dir) node(ctx context.Context, e entry) (gofs.InodeEmbedder, gofs.StableAttr, syscall.Errno) {
	path := d.child(e.name)
	if n, ok := e.node.(identified); ok {
		mode := uint32(syscall.S_IFREG)
		if e.dir {
			mode = syscall.S_IFDIR // a scratch directory
		}
		return e.node, gofs.StableAttr{Mode: mode, Ino: n.identity()}, 0
	}
	if e.dir {
		return e.node, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino(path)}, 0
	}
	f, ok := e.node.(*file)
	if !e.frozen || !ok {
		return e.node, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: ino(path)}, 0
	}
	v, err := f.render()
	if err != nil {
		return nil, gofs.StableAttr{}, d.fsys.failNoEvent("lookup", path, err)
	}
	return d.fsys.frozenFile(f, v), gofs.StableAttr{Mode: syscall.S_IFREG, Ino: frozenIno(path, v)}, 0
}

func (d *dir) Readdir(ctx context.Context) (_ gofs.DirStream, errno syscall.Errno) {
	defer d.fsys.guard("readdir", d.path, "", &errno)
	es, err := d.list.entries(ctx, d)
	if err != nil {
		return nil, d.fsys.failNoEvent("readdir", d.path, err)
	}
	out := make([]fuse.DirEntry, 0, len(es)+2)
	// The kernel lists only what a FUSE readdir returns: `ls -a` shows . and .. from here.
	out = append(out, fuse.DirEntry{Name: ".", Mode: syscall.S_IFDIR, Ino: d.StableAttr().Ino})
	parentIno := d.StableAttr().Ino
	if _, parent := d.Parent(); parent != nil {
		parentIno = parent.StableAttr().Ino
	}
	out = append(out, fuse.DirEntry{Name: "..", Mode: syscall.S_IFDIR, Ino: parentIno})
	for _, e := range es {
		if e.unlisted {
			continue
		}
		_, id, errno := d.node(ctx, e)
		if errno == syscall.ENOENT {
			continue // gone since the listing
		}
		if errno != 0 {
			return nil, errno
		}
		out = append(out, fuse.DirEntry{Name: e.name, Mode: id.Mode, Ino: id.Ino})
	}
	l := &dirListing{entries: out, fsys: d.fsys, charges: charges{uid: requestUID(ctx)}}
	size := openCost + int64(cap(out))*int64(unsafe.Sizeof(fuse.DirEntry{}))
	for _, e := range out {
		size += int64(len(e.Name))
	}
	if err := d.fsys.snapshots.charge(&l.charges, size, "listing"); err != nil {
		return nil, d.fsys.fail(caller(ctx, "readdir", d.path), d.cockpit, d.stack, err)
	}
	return l, 0
}

// dirListing is what a directory open lists. Each open keeps a list of its own until it closes, so
// it counts with the open bytes of the uid that opened it: uncounted, one user's 5,000 opens of a
// directory of 1,000 stacks held 800 MiB of the daemon.
type dirListing struct {
	idx     int
	entries []fuse.DirEntry
	fsys    *FS
	charges charges
}

var _ = (gofs.FileSeekdirer)((*dirListing)(nil)) // rewinddir and telldir/seekdir

func (l *dirListing) HasNext() bool { return l.idx < len(l.entries) }

// Next returns the next entry; its offset is the index of the one after it, which Seekdir takes.
func (l *dirListing) Next() (fuse.DirEntry, syscall.Errno) {
	e := l.entries[l.idx]
	l.idx++
	e.Off = uint64(l.idx)
	return e, 0
}

func (l *dirListing) Seekdir(_ context.Context, off uint64) syscall.Errno {
	if off > uint64(len(l.entries)) {
		return syscall.EINVAL
	}
	l.idx = int(off)
	return 0
}

func (l *dirListing) Close() {
	l.entries = nil
	l.fsys.snapshots.discharge(&l.charges)
}

func (d *dir) Getattr(ctx context.Context, _ gofs.FileHandle, out *fuse.AttrOut) (errno syscall.Errno) {
	defer d.fsys.guard("getattr", d.path, "", &errno)
	out.Gid = d.fsys.gid
	out.Mode = syscall.S_IFDIR | 0o755
	out.Nlink = 2
	out.Uid = d.fsys.uid
	setTimes(&out.Attr, d.fsys.started)
	if t, uid, ok := d.fsys.cockpitOwner(d.cockpit); ok {
		out.Uid = uid
		setTimes(&out.Attr, t)
	}
	if d.stack != "" {
		// A stack's directories change with its record (a holder added or released, a lease, a
		// drain): `ls -lt stacks/` and `find -newer` see the stacks that moved.
		if r, err := d.fsys.eng.Stack(d.cockpit, d.stack); err == nil {
			setTimes(&out.Attr, stamp(r.UpdatedAt))
			if _, isStack := d.list.(stackListing); isStack {
				// A stack's directory shows who may remove it, and by its mode and group who
				// else may join it.
				if uid, ok := d.fsys.eng.StackCreator(r); ok {
					out.Uid = uid
				}
				out.Mode = syscall.S_IFDIR | r.StackMode()
				if r.GID != nil {
					out.Gid = *r.GID
				}
			}
		}
	}
	return 0
}

// Setattr refuses every change of a directory's attributes (EPERM, with an events line): its
// mode, owner and times are derived from the record. `touch holders/` is a claim without a name.
// A stack's directory takes a chmod of its group and other write bits: who else may join it.
func (d *dir) Setattr(ctx context.Context, _ gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) (errno syscall.Errno) {
	defer d.fsys.guard("setattr", d.path, "", &errno)
	ctx = uninterrupted(ctx)
	if in.Valid&settable == 0 {
		return d.Getattr(ctx, nil, out)
	}
	var current fuse.AttrOut
	d.Getattr(ctx, nil, &current)
	if mode, ok := in.GetMode(); ok && mode&0o7777 != current.Mode&0o7777 {
		if _, isStack := d.list.(stackListing); isStack {
			c := caller(ctx, "chmod", d.path)
			if err := d.fsys.eng.ChmodStack(ctx, c, d.cockpit, d.stack, mode&0o7777); err != nil {
				return d.fsys.fail(c, d.cockpit, d.stack, err)
			}
			d.Getattr(ctx, nil, &current) // the other attributes are checked against the new mode
		}
	}
	op, refused := unsupportedAttrs(in, false, current.Attr)
	if refused == nil && in.Valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME) == 0 {
		return d.Getattr(ctx, nil, out)
	}
	if refused == nil {
		op, refused = "utimes", func(path string) error {
			r := timesDerived(path).(*engine.Refusal)
			if _, ok := d.list.(holdersListing); ok {
				r.Fix = "name the holder: touch " + path + "/<name> (in make: $(shell id -un) when USER is unset)"
			}
			return r
		}
	}
	return d.fsys.fail(caller(ctx, op, d.path), d.cockpit, d.stack, refused(d.path))
}

func (d *dir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (_ *gofs.Inode, errno syscall.Errno) {
	defer d.fsys.guard("mkdir", d.path, name, &errno)
	ctx = uninterrupted(ctx)
	m, ok := d.list.(mkdirer)
	if !ok {
		return nil, d.fsys.undefined(ctx, "mkdir", d.child(name), d.cockpit, d.stack)
	}
	if errno := m.mkdir(ctx, d, name); errno != 0 {
		return nil, errno
	}
	return d.Lookup(ctx, name, out)
}

func (d *dir) Rmdir(ctx context.Context, name string) (errno syscall.Errno) {
	defer d.fsys.guard("rmdir", d.path, name, &errno)
	ctx = uninterrupted(ctx)
	if d.stack != "" && d.walkerRemoval(ctx) {
		return 0 // see walker.go
	}
	if r, ok := d.list.(rmdirer); ok {
		return r.rmdir(ctx, d, name)
	}
	return d.fsys.undefined(ctx, "rmdir", d.child(name), d.cockpit, d.stack)
}

func (d *dir) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (_ *gofs.Inode, _ gofs.FileHandle, _ uint32, errno syscall.Errno) {
	defer d.fsys.guard("create", d.path, name, &errno)
	ctx = uninterrupted(ctx)
	c, ok := d.list.(creator)
	if !ok {
		return nil, nil, 0, d.fsys.undefined(ctx, "create", d.child(name), d.cockpit, d.stack)
	}
	created, err := c.create(ctx, d, name, mode)
	if errors.Is(err, errUndefined) {
		return nil, nil, 0, d.fsys.undefined(ctx, "create", d.child(name), d.cockpit, d.stack)
	} else if err != nil {
		return nil, nil, 0, d.fsys.fail(caller(ctx, "create", d.child(name)), d.cockpit, d.stack, err)
	}
	// The create's open: a snapshot of the file just created. A creator that knows the entry it
	// made says so, where finding it over a shared store would ask etcd again.
	var e entry
	if k, ok := d.list.(knowsCreated); ok && d.fsys.eng.Shared() {
		e = k.created(d, name)
	} else {
		e, err = d.find(ctx, name)
	}
	var h gofs.FileHandle = newScratchHandle(ctx)
	if f, isFile := e.node.(*file); err == nil && isFile {
		h, err = f.openCreated(created, requestUID(ctx))
	}
	if err != nil { // released again before we could look it up
		return nil, nil, 0, d.fsys.fail(caller(ctx, "create", d.child(name)), d.cockpit, d.stack, gone(err))
	}
	// The attributes are those of the snapshot the create's open took, rendered once.
	in, errno := d.enter(ctx, e, out, h)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if f, isFile := in.Operations().(*file); isFile {
		if created, ok := h.(*handle); ok {
			f.opened(ctx, created)
		}
	}
	if _, replacing := in.Operations().(*replacementFile); replacing {
		return in, h, writeOpenFlags, 0 // its close applies it
	}
	return in, h, openFlags, 0
}

func (d *dir) Unlink(ctx context.Context, name string) (errno syscall.Errno) {
	defer d.fsys.guard("unlink", d.path, name, &errno)
	ctx = uninterrupted(ctx)
	if d.stack != "" && d.walkerRemoval(ctx) {
		return 0 // see walker.go
	}
	if u, ok := d.list.(unlinker); ok {
		return u.unlink(ctx, d, name)
	}
	return d.fsys.undefined(ctx, "unlink", d.child(name), d.cockpit, d.stack)
}

// uninterrupted keeps a change from being abandoned half-way by a FUSE INTERRUPT: the kernel
// sends one for any signal to the caller (Go's runtime preempts its threads with SIGURG), and a
// change is short and bounded (STATE_LOCKED after 2 s) anyway. Only `wait` ends on Ctrl-C.
func uninterrupted(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// Rename is refused (EPERM): a name of the tree is a record's key, not a label. The refusal says
// what to do instead. Beside config, scratch files rename (scratch.go), also into and out of a
// scratch directory (scratchdir.go), and config renames aside to a backup name (replace.go).
func (d *dir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) (errno syscall.Errno) {
	defer d.fsys.guard("rename", d.path, name, &errno)
	ctx = uninterrupted(ctx)
	to := newName
	if p, ok := newParent.(*dir); ok {
		to = p.child(newName)
	}
	if p, ok := newParent.(*dir); ok && p == d {
		if _, isCockpit := d.list.(cockpitListing); isCockpit {
			if name == "config" && backupName.MatchString(newName) && flags&unix.RENAME_EXCHANGE == 0 {
				return d.renameConfigAside(ctx, newName, flags) // cp --backup: see replace.go
			}
			// Not RENAME_EXCHANGE, which keeps both names, swapped: taken as a rename, it applied a
			// scratch file or removed the other one, and the kernel swapped its names.
			if flags&unix.RENAME_EXCHANGE == 0 {
				if handled, errno := d.renameScratch(ctx, name, newName); handled {
					return errno
				}
			}
		}
	}
	if p, ok := newParent.(*scratchDir); ok && p.cockpit.cockpit == d.cockpit && flags&unix.RENAME_EXCHANGE == 0 {
		if handled, errno := d.renameIntoScratchDir(ctx, name, p, newName, flags); handled {
			return errno
		}
	}
	c := caller(ctx, "rename", d.child(name))
	if _, err := d.find(ctx, name); err != nil {
		return d.fsys.undefined(ctx, "rename", d.child(name), d.cockpit, d.stack)
	}
	fix := "names cannot change: create the new name and remove the old one"
	if _, ok := d.list.(holdersListing); ok {
		fix = "claim under the new name (touch holders/" + newName + "), then release the old one (rm holders/" + name + ")"
	}
	if _, ok := d.list.(cockpitListing); ok && name == "config" {
		fix = "config is only moved aside to a backup name, config~ or config.~N~ (cp --backup without --suffix); or copy it: cp config " + newName
	}
	return d.fsys.fail(c, d.cockpit, d.stack, &engine.Refusal{Code: engine.Unsupported,
		Message: "renaming " + d.child(name) + " to " + to + " is not supported", Fix: fix})
}

func (d *dir) Mknod(ctx context.Context, name string, _, _ uint32, _ *fuse.EntryOut) (_ *gofs.Inode, errno syscall.Errno) {
	defer d.fsys.guard("mknod", d.path, name, &errno)
	return nil, d.fsys.undefined(ctx, "mknod", d.child(name), d.cockpit, d.stack)
}

func (d *dir) Symlink(ctx context.Context, _, name string, _ *fuse.EntryOut) (_ *gofs.Inode, errno syscall.Errno) {
	defer d.fsys.guard("symlink", d.path, name, &errno)
	return nil, d.fsys.undefined(ctx, "symlink", d.child(name), d.cockpit, d.stack)
}

func (d *dir) Link(ctx context.Context, _ gofs.InodeEmbedder, name string, _ *fuse.EntryOut) (_ *gofs.Inode, errno syscall.Errno) {
	defer d.fsys.guard("link", d.path, name, &errno)
	return nil, d.fsys.undefined(ctx, "link", d.child(name), d.cockpit, d.stack)
}
