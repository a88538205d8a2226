package fs

import (
	"context"
	"sort"
	"strings"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine"
)

// Scratch directories: what rsync --delay-updates (.~tmp~) and --partial-dir=.DIR make beside
// config. rsync writes its scratch file beside config, renames it into the directory, renames it
// from there onto config once everything is copied, then removes the directory; refused, the
// copy was "discarded" and rsync exited 0 with nothing applied. A scratch directory is a hidden
// name, holds only scratch files, is its creator's alone (as its files are) and counts, with
// each file in it, against the cockpit's maxScratch.

// scratchDirName says name may be a scratch directory: rsync's .~tmp~, or a dot and a valid name.
func scratchDirName(name string) bool {
	return name == ".~tmp~" || strings.HasPrefix(name, ".") && engine.ValidName(name[1:])
}

// scratchFileName says name may be a scratch file: a valid name, or a dot and one, and none an
// editor makes (those stay refused, so the editor saves in place).
func scratchFileName(name string) bool {
	return !editorScratch(name) && engine.ValidName(strings.TrimPrefix(name, "."))
}

func (cockpitListing) mkdir(ctx context.Context, d *dir, name string) syscall.Errno {
	if !scratchDirName(name) {
		return d.fsys.undefined(ctx, "mkdir", d.child(name), d.cockpit, "")
	}
	c := caller(ctx, "mkdir", d.child(name))
	// As for a scratch file: only who may write config, so no other user fills the cockpit's.
	err := d.fsys.eng.MayWriteConfig(c, d.cockpit)
	if err == nil {
		sc := newScratch(c.UID, 0o700, nil, time.Now())
		sc.dir = true
		err = d.fsys.scratch.create(d.cockpit, name, sc)
	}
	if err != nil {
		return d.fsys.fail(c, d.cockpit, "", err)
	}
	return 0
}

func (cockpitListing) rmdir(ctx context.Context, d *dir, name string) syscall.Errno {
	sc := d.fsys.scratch.get(d.cockpit, name)
	if sc == nil || !sc.dir {
		return d.fsys.undefined(ctx, "rmdir", d.child(name), d.cockpit, "")
	}
	if !sc.mine(ctx) {
		return syscall.EACCES
	}
	return d.fsys.scratch.rmdir(d.cockpit, name, sc)
}

// rmdir forgets the scratch directory name if it is still sc and holds nothing.
func (s *scratchFiles) rmdir(cockpit, name string, sc *scratch) syscall.Errno {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[cockpit][name] != sc {
		return syscall.ENOENT
	}
	for key := range s.m[cockpit] {
		if strings.HasPrefix(key, name+"/") {
			return syscall.ENOTEMPTY
		}
	}
	delete(s.m[cockpit], name)
	return 0
}

// scratchDir is the node of one scratch directory; its files are scratchFile nodes.
type scratchDir struct {
	gofs.Inode
	fsys    *FS
	cockpit *dir // the cockpit's directory, where it is
	name    string
	s       *scratch
}

var (
	_ = (gofs.NodeLookuper)((*scratchDir)(nil))
	_ = (gofs.NodeReaddirer)((*scratchDir)(nil))
	_ = (gofs.NodeGetattrer)((*scratchDir)(nil))
	_ = (gofs.NodeSetattrer)((*scratchDir)(nil))
	_ = (gofs.NodeCreater)((*scratchDir)(nil))
	_ = (gofs.NodeUnlinker)((*scratchDir)(nil))
	_ = (gofs.NodeRenamer)((*scratchDir)(nil))
	_ = (gofs.NodeMkdirer)((*scratchDir)(nil))
)

func (n *scratchDir) identity() uint64 { return n.s.ino }

func (n *scratchDir) key(name string) string { return n.name + "/" + name }

func (n *scratchDir) child(name string) string { return n.cockpit.child(n.key(name)) }

// usable says the caller may use the directory now: it still exists (ENOENT once removed, with
// its cockpit or by rmdir) and is the caller's (EACCES).
func (n *scratchDir) usable(ctx context.Context) syscall.Errno {
	if n.fsys.scratch.get(n.cockpit.cockpit, n.name) != n.s {
		return syscall.ENOENT
	}
	if !n.s.mine(ctx) {
		return syscall.EACCES
	}
	return 0
}

// file is the caller's scratch file name in n, with its inode; ENOENT when there is none.
func (n *scratchDir) file(ctx context.Context, name string) (*scratch, syscall.Errno) {
	if errno := n.usable(ctx); errno != 0 {
		return nil, errno
	}
	sc := n.fsys.scratch.get(n.cockpit.cockpit, n.key(name))
	if sc == nil || sc.promoted {
		return nil, syscall.ENOENT
	}
	return sc, 0
}

func (n *scratchDir) enter(ctx context.Context, name string, sc *scratch, out *fuse.EntryOut) *gofs.Inode {
	node := &scratchFile{fsys: n.fsys, path: n.child(name), s: sc}
	in := n.NewInode(ctx, node, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: sc.ino})
	var attr fuse.AttrOut
	node.Getattr(ctx, nil, &attr)
	out.Attr = attr.Attr
	out.SetEntryTimeout(entryTimeout)
	return in
}

func (n *scratchDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (_ *gofs.Inode, errno syscall.Errno) {
	defer n.fsys.guard("lookup", n.cockpit.child(n.name), name, &errno)
	sc, errno := n.file(ctx, name)
	if errno != 0 {
		return nil, errno
	}
	return n.enter(ctx, name, sc, out), 0
}

func (n *scratchDir) Readdir(ctx context.Context) (_ gofs.DirStream, errno syscall.Errno) {
	defer n.fsys.guard("readdir", n.cockpit.child(n.name), "", &errno)
	if errno := n.usable(ctx); errno != 0 {
		return nil, errno
	}
	parent := n.cockpit.StableAttr().Ino
	es := []fuse.DirEntry{{Name: ".", Mode: syscall.S_IFDIR, Ino: n.s.ino}, {Name: "..", Mode: syscall.S_IFDIR, Ino: parent}}
	s := &n.fsys.scratch
	s.mu.Lock()
	for key, sc := range s.m[n.cockpit.cockpit] {
		if name, in := strings.CutPrefix(key, n.name+"/"); in && !sc.promoted {
			es = append(es, fuse.DirEntry{Name: name, Mode: syscall.S_IFREG, Ino: sc.ino})
		}
	}
	s.mu.Unlock()
	sort.Slice(es[2:], func(i, j int) bool { return es[2+i].Name < es[2+j].Name })
	return gofs.NewListDirStream(es), 0 // at most maxScratch entries
}

func (n *scratchDir) Getattr(ctx context.Context, _ gofs.FileHandle, out *fuse.AttrOut) (errno syscall.Errno) {
	defer n.fsys.guard("getattr", n.cockpit.child(n.name), "", &errno)
	n.s.mu.Lock()
	defer n.s.mu.Unlock()
	out.Mode = syscall.S_IFDIR | n.s.mode
	out.Nlink = 2
	out.Uid, out.Gid = n.s.uid, n.fsys.gid
	setTimes(&out.Attr, n.s.mtime)
	return 0
}

// Setattr takes what rsync and cp -a restore on a directory: mode and times; its owner stays
// its creator.
func (n *scratchDir) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) (errno syscall.Errno) {
	defer n.fsys.guard("setattr", n.cockpit.child(n.name), "", &errno)
	if errno := n.usable(ctx); errno != 0 {
		return errno
	}
	if uid, ok := in.GetUID(); ok && uid != n.s.uid {
		return syscall.EPERM
	}
	if _, ok := in.GetSize(); ok {
		return syscall.EISDIR
	}
	n.s.mu.Lock()
	n.s.setModeTimes(in)
	n.s.mu.Unlock()
	return n.Getattr(ctx, fh, out)
}

func (n *scratchDir) Create(ctx context.Context, name string, _, mode uint32, out *fuse.EntryOut) (_ *gofs.Inode, _ gofs.FileHandle, _ uint32, errno syscall.Errno) {
	defer n.fsys.guard("create", n.cockpit.child(n.name), name, &errno)
	ctx = uninterrupted(ctx)
	if errno := n.usable(ctx); errno != 0 {
		return nil, nil, 0, errno
	}
	if !scratchFileName(name) {
		return nil, nil, 0, n.fsys.undefined(ctx, "create", n.child(name), n.cockpit.cockpit, "")
	}
	c := caller(ctx, "create", n.child(name))
	err := n.fsys.eng.MayWriteConfig(c, n.cockpit.cockpit)
	sc := newScratch(c.UID, mode, nil, time.Now())
	if err == nil {
		err = n.fsys.scratch.create(n.cockpit.cockpit, n.key(name), sc)
	}
	if err != nil {
		return nil, nil, 0, n.fsys.fail(c, n.cockpit.cockpit, "", err)
	}
	return n.enter(ctx, name, sc, out), newScratchHandle(ctx), openFlags, 0
}

func (n *scratchDir) Unlink(ctx context.Context, name string) (errno syscall.Errno) {
	defer n.fsys.guard("unlink", n.cockpit.child(n.name), name, &errno)
	sc, errno := n.file(ctx, name)
	if errno != 0 {
		return errno
	}
	n.fsys.scratch.remove(n.cockpit.cockpit, n.key(name), sc)
	return 0
}

// Mkdir is refused: a scratch directory holds only scratch files.
func (n *scratchDir) Mkdir(ctx context.Context, name string, _ uint32, _ *fuse.EntryOut) (_ *gofs.Inode, errno syscall.Errno) {
	defer n.fsys.guard("mkdir", n.cockpit.child(n.name), name, &errno)
	return nil, n.fsys.undefined(ctx, "mkdir", n.child(name), n.cockpit.cockpit, "")
}

// Rename moves a scratch file out of n: onto config it applies its content, as a rename of one
// beside config does (rsync --delay-updates' last step); to another scratch name, it moves.
func (n *scratchDir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) (errno syscall.Errno) {
	defer n.fsys.guard("rename", n.cockpit.child(n.name), name, &errno)
	ctx = uninterrupted(ctx)
	sc, errno := n.file(ctx, name)
	if errno != 0 {
		return errno
	}
	from := n.key(name)
	if flags&unix.RENAME_EXCHANGE == 0 {
		switch p := newParent.(type) {
		case *dir:
			if _, isCockpit := p.list.(cockpitListing); isCockpit && p.cockpit == n.cockpit.cockpit {
				if newName == "config" {
					return p.promote(ctx, from, sc)
				}
				if scratchFileName(newName) && p.scratchTarget(ctx, newName) {
					return n.fsys.scratch.moveUnless(n.cockpit.cockpit, from, newName, sc, flags)
				}
			}
		case *scratchDir:
			if p.cockpit.cockpit == n.cockpit.cockpit && scratchFileName(newName) {
				if errno := p.usable(ctx); errno != 0 {
					return errno
				}
				return n.fsys.scratch.moveUnless(n.cockpit.cockpit, from, p.key(newName), sc, flags)
			}
		}
	}
	c := caller(ctx, "rename", n.child(name))
	return n.fsys.fail(c, n.cockpit.cockpit, "", &engine.Refusal{Code: engine.Unsupported,
		Message: "a scratch file in " + n.cockpit.child(n.name) + " is only renamed onto config or to another scratch name",
		Fix:     "mv it onto " + n.cockpit.child("config")})
}

// moveUnless is move, refused (EEXIST) where the rename may not replace (RENAME_NOREPLACE: mv -n).
func (s *scratchFiles) moveUnless(cockpit, from, to string, sc *scratch, flags uint32) syscall.Errno {
	if flags&unix.RENAME_NOREPLACE != 0 && s.get(cockpit, to) != nil {
		return syscall.EEXIST
	}
	return s.move(cockpit, from, to, sc)
}

// renameIntoScratchDir moves the caller's scratch file name beside config into the scratch
// directory p (rsync's rename of its copy into .~tmp~); false when name is no scratch file.
func (d *dir) renameIntoScratchDir(ctx context.Context, name string, p *scratchDir, newName string, flags uint32) (bool, syscall.Errno) {
	sc := d.fsys.scratch.get(d.cockpit, name)
	if sc == nil || sc.dir || sc.promoted || !scratchFileName(newName) {
		return false, 0
	}
	if !sc.mine(ctx) {
		return true, syscall.EACCES
	}
	if errno := p.usable(ctx); errno != 0 {
		return true, errno
	}
	return true, d.fsys.scratch.moveUnless(d.cockpit, name, p.key(newName), sc, flags)
}
