package fs

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cockpitfs/cockpitfs/engine"
)

// Scratch files: what sed -i, perl -pi, rsync, python's tempfile.mkstemp(dir=…) and `cp new.toml` make
// beside a cockpit's config before renaming it onto config. They live only in the daemon's memory,
// belong to the uid that created them (nobody else may open them), hold at most maxCommand bytes,
// at most maxScratch of them per cockpit, and vanish with the daemon. Renaming one onto config
// applies its content as the whole document (or refuses the rename, with the reason in events);
// nothing else of a scratch file reaches the store.

// errUndefined: a create of a name the directory does not define (refused as undefined).
var errUndefined = errors.New("the tree does not define this name")

// maxScratch bounds the scratch files of one cockpit, scratch directories and the files in them
// included. A scratch directory may be made beyond it, up to twice it: rsync makes its directory
// after its scratch file and takes a refused mkdir as a copy to discard, exiting 0 with nothing
// applied; where its file found room, its directory does too.
const maxScratch = 16

type scratch struct {
	mu    sync.Mutex
	ino   uint64 // its node's inode number: its own, so a name made again is a node of its own
	uid   uint32
	mode  uint32
	data  []byte
	mtime time.Time
	// dir: a scratch directory (see scratchdir.go); its files are scratch files keyed
	// "<dir>/<name>", so they count against the cockpit's maxScratch with it.
	dir bool
	// promoted: renamed onto config. The kernel may still hold config's name for this node; an
	// open, stat or change of it by name answers ESTALE, so the kernel looks config up again and
	// the name shows config's inode and times from the rename on (an editor compares a file's
	// mtime at its write with the one at its read: vim found config changed under it, and
	// vim -es wrote nothing and exited 0). A descriptor still open on it sees its own.
	promoted bool
}

// setModeTimes takes the mode and modification time a setattr gives (what editors, cp -p and
// rsync restore), under s.mu.
func (s *scratch) setModeTimes(in *fuse.SetAttrIn) {
	if mode, ok := in.GetMode(); ok {
		s.mode = mode & 0o7777
	}
	if in.Valid&fuse.FATTR_MTIME_NOW != 0 {
		s.mtime = time.Now()
	} else if t, ok := in.GetMTime(); ok {
		s.mtime = t
	}
}

// scratchFiles are every cockpit's scratch files and directories, by cockpit and name.
type scratchFiles struct {
	mu sync.Mutex
	m  map[string]map[string]*scratch
}

// scratchMade numbers every scratch file made, for its inode number.
var scratchMade atomic.Uint64

func newScratch(uid, mode uint32, data []byte, mtime time.Time) *scratch {
	return &scratch{ino: ino(fmt.Sprintf("\x00scratch %d", scratchMade.Add(1))), uid: uid, mode: mode & 0o7777, data: data, mtime: mtime}
}

func (s *scratchFiles) get(cockpit, name string) *scratch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[cockpit][name]
}

// create makes sc the scratch file or directory name, which must be free.
func (s *scratchFiles) create(cockpit, name string, sc *scratch) error {
	if s.get(cockpit, name) != nil {
		return &engine.Refusal{Code: engine.Exists, Message: childPath(cockpit, name) + " exists"}
	}
	return s.put(cockpit, name, sc)
}

// put makes sc the scratch file name, replacing the one of that name.
func (s *scratchFiles) put(cockpit, name string, sc *scratch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]map[string]*scratch{}
	}
	if s.m[cockpit] == nil {
		s.m[cockpit] = map[string]*scratch{}
	}
	if !s.parentHeld(cockpit, name) {
		return notFound("%s does not exist", childPath(cockpit, name[:strings.IndexByte(name, '/')]))
	}
	limit := maxScratch
	if sc.dir {
		limit = 2 * maxScratch
	}
	if _, replaced := s.m[cockpit][name]; !replaced && len(s.m[cockpit]) >= limit {
		return &engine.Refusal{Code: engine.ConfigEditLimit, Fix: "rename or remove the other scratch files (and directories: rm -r) first",
			Message: fmt.Sprintf("cockpit %s already has %d scratch files and directories beside its config", cockpit, len(s.m[cockpit]))}
	}
	s.m[cockpit][name] = sc
	return nil
}

// remove forgets name if it is still sc.
func (s *scratchFiles) remove(cockpit, name string, sc *scratch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[cockpit][name] == sc {
		delete(s.m[cockpit], name)
	}
}

// move renames a scratch file to another scratch name, replacing the file there; a scratch
// directory there, or none for the directory of to, refuses it.
func (s *scratchFiles) move(cockpit, from, to string, sc *scratch) syscall.Errno {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch old := s.m[cockpit][to]; {
	case s.m[cockpit][from] != sc || !s.parentHeld(cockpit, to):
		return syscall.ENOENT
	case old != nil && old.dir:
		return syscall.EISDIR
	}
	delete(s.m[cockpit], from)
	s.m[cockpit][to] = sc
	return 0
}

// parentHeld says the scratch directory of key (one "<dir>/<name>") exists; a key beside config
// has none to hold (under s.mu).
func (s *scratchFiles) parentHeld(cockpit, key string) bool {
	i := strings.IndexByte(key, '/')
	if i < 0 {
		return true
	}
	p := s.m[cockpit][key[:i]]
	return p != nil && p.dir
}

// forgetCockpit drops a removed cockpit's scratch files.
func (s *scratchFiles) forgetCockpit(cockpit string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, cockpit)
}

// scratchFile is the node of one scratch file: a plain in-memory file, shared by its opens.
type scratchFile struct {
	gofs.Inode
	fsys *FS
	path string
	s    *scratch
}

// scratchHandle is one open of a scratch file. What the file holds counts against the opener's
// uid while it is open: one removed or renamed over while open leaves the cockpit's maxScratch,
// and a loop of them held 64 KiB each with no bound but the descriptors.
type scratchHandle struct{ charges charges }

func newScratchHandle(ctx context.Context) *scratchHandle {
	return &scratchHandle{charges: charges{uid: requestUID(ctx)}}
}

// chargeScratch counts size bytes of a scratch file against the opener of fh, its open.
func (f *FS) chargeScratch(ctx context.Context, fh gofs.FileHandle, size int64, op, path string) syscall.Errno {
	h, ok := fh.(*scratchHandle)
	if !ok {
		return 0
	}
	if err := f.snapshots.charge(&h.charges, size, op); err != nil {
		return f.fail(caller(ctx, op, path), "", "", err)
	}
	return 0
}

// identified is a node whose identity is its own rather than its path's (see dir.node).
type identified interface{ identity() uint64 }

func (n *scratchFile) identity() uint64 { return n.s.ino }

var (
	_ = (gofs.NodeOpener)((*scratchFile)(nil))
	_ = (gofs.NodeReader)((*scratchFile)(nil))
	_ = (gofs.NodeWriter)((*scratchFile)(nil))
	_ = (gofs.NodeGetattrer)((*scratchFile)(nil))
	_ = (gofs.NodeSetattrer)((*scratchFile)(nil))
	_ = (gofs.NodeFsyncer)((*scratchFile)(nil))
	_ = (gofs.NodeReleaser)((*scratchFile)(nil))
)

// mine says the caller may use sc: its creator (or root).
func (sc *scratch) mine(ctx context.Context) bool {
	c := caller(ctx, "", "")
	return c.UID == 0 || c.UID == sc.uid
}

func (n *scratchFile) Open(ctx context.Context, flags uint32) (_ gofs.FileHandle, _ uint32, errno syscall.Errno) {
	defer n.fsys.guard("open", n.path, "", &errno)
	n.s.mu.Lock()
	defer n.s.mu.Unlock()
	if n.s.promoted {
		return nil, 0, n.fsys.failNoEvent("open", n.path, errGone)
	}
	if !n.s.mine(ctx) {
		return nil, 0, syscall.EACCES
	}
	if flags&syscall.O_TRUNC != 0 {
		n.s.data = nil
	}
	// Counted from the open, a read-only one too: a file written through a descriptor since
	// closed, then removed, is held by this open alone.
	h := newScratchHandle(ctx)
	if errno := n.fsys.chargeScratch(ctx, h, int64(len(n.s.data)), "open", n.path); errno != 0 {
		return nil, 0, errno
	}
	return h, fuse.FOPEN_DIRECT_IO, 0
}

func (n *scratchFile) Read(ctx context.Context, _ gofs.FileHandle, dest []byte, off int64) (_ fuse.ReadResult, errno syscall.Errno) {
	defer n.fsys.guard("read", n.path, "", &errno)
	n.s.mu.Lock()
	defer n.s.mu.Unlock()
	if off >= int64(len(n.s.data)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(append([]byte(nil), n.s.data[off:min(int64(len(n.s.data)), off+int64(len(dest)))]...)), 0
}

func (n *scratchFile) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (_ uint32, errno syscall.Errno) {
	defer n.fsys.guard("write", n.path, "", &errno)
	n.s.mu.Lock()
	defer n.s.mu.Unlock()
	end := off + int64(len(data))
	if off < 0 || end > maxCommand {
		return 0, syscall.EFBIG
	}
	if errno := n.fsys.chargeScratch(ctx, fh, max(end, int64(len(n.s.data))), "write", n.path); errno != 0 {
		return 0, errno
	}
	if int64(len(n.s.data)) < end {
		n.s.data = append(n.s.data, make([]byte, end-int64(len(n.s.data)))...)
	}
	copy(n.s.data[off:], data)
	n.s.mtime = time.Now()
	return uint32(len(data)), 0
}

func (n *scratchFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) (errno syscall.Errno) {
	defer n.fsys.guard("getattr", n.path, "", &errno)
	out.Gid = n.fsys.gid
	n.s.mu.Lock()
	defer n.s.mu.Unlock()
	if n.s.promoted && fh == nil {
		return n.fsys.failNoEvent("getattr", n.path, errGone)
	}
	out.Mode = syscall.S_IFREG | n.s.mode
	out.Nlink = 1
	out.Size = uint64(len(n.s.data))
	out.Uid = n.s.uid
	setTimes(&out.Attr, n.s.mtime)
	return 0
}

// Setattr changes what a plain file would: size, mode, times; its owner stays its creator.
func (n *scratchFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) (errno syscall.Errno) {
	defer n.fsys.guard("setattr", n.path, "", &errno)
	n.s.mu.Lock()
	if n.s.promoted && fh == nil {
		n.s.mu.Unlock()
		return n.fsys.failNoEvent("setattr", n.path, errGone)
	}
	if !n.s.mine(ctx) {
		n.s.mu.Unlock()
		return syscall.EACCES
	}
	if uid, ok := in.GetUID(); ok && uid != n.s.uid {
		n.s.mu.Unlock()
		return syscall.EPERM
	}
	if size, ok := in.GetSize(); ok {
		if size > maxCommand {
			n.s.mu.Unlock()
			return syscall.EFBIG
		}
		if errno := n.fsys.chargeScratch(ctx, fh, int64(size), "write", n.path); errno != 0 {
			n.s.mu.Unlock()
			return errno
		}
		n.s.data = append(n.s.data, make([]byte, max(0, int(size)-len(n.s.data)))...)[:size]
	}
	n.s.setModeTimes(in)
	n.s.mu.Unlock()
	return n.Getattr(ctx, fh, out)
}

func (n *scratchFile) Fsync(context.Context, gofs.FileHandle, uint32) syscall.Errno { return 0 }

// Release gives back what the open was counted for.
func (n *scratchFile) Release(_ context.Context, fh gofs.FileHandle) syscall.Errno {
	if h, ok := fh.(*scratchHandle); ok {
		n.fsys.snapshots.discharge(&h.charges)
	}
	return 0
}

// The cockpit directory's scratch side: lookup, create, unlink and rename of names beside config.

// scratchEntries are the caller's scratch files in d (every one, for root): a leaked temp file
// is seen, and can be removed, by whoever made it.
func scratchEntries(ctx context.Context, d *dir) []entry {
	d.fsys.scratch.mu.Lock()
	defer d.fsys.scratch.mu.Unlock()
	var es []entry
	for name, sc := range d.fsys.scratch.m[d.cockpit] {
		if sc.mine(ctx) && !sc.promoted && !strings.Contains(name, "/") {
			es = append(es, scratchEntry(d, name, sc))
		}
	}
	sort.Slice(es, func(i, j int) bool { return es[i].name < es[j].name })
	return es
}

func (cockpitListing) lookup(ctx context.Context, d *dir, name string) (entry, bool, error) {
	if name == "config" {
		if r := d.fsys.replacing.of(ctx, d.cockpit); r != nil {
			e, found := d.replacementEntry(r)
			return e, found, nil
		}
	}
	es, err := cockpitListing{}.entries(ctx, d)
	if err != nil {
		return entry{}, false, err
	}
	for _, e := range es {
		if e.name == name {
			return e, true, nil
		}
	}
	sc := d.fsys.scratch.get(d.cockpit, name)
	if sc == nil || sc.promoted {
		return entry{}, false, nil
	}
	return scratchEntry(d, name, sc), true, nil
}

// scratchEntry is the entry of d's scratch file or directory name.
func scratchEntry(d *dir, name string, sc *scratch) entry {
	if sc.dir {
		return entry{name: name, dir: true, node: &scratchDir{fsys: d.fsys, cockpit: d, name: name, s: sc}}
	}
	return entry{name: name, node: &scratchFile{fsys: d.fsys, path: d.child(name), s: sc}}
}

// create makes a scratch file; editors' own scratch names stay refused, so they save in place.
// A name may be hidden (rsync's `.config.XXXXXX`, mkstemp(prefix=".config.")): a dot, then a
// valid name.
func (cockpitListing) create(ctx context.Context, d *dir, name string, mode uint32) (render, error) {
	if name == "config" {
		return nil, d.createReplacement(ctx, mode)
	}
	if !scratchFileName(name) {
		return nil, errUndefined
	}
	c := caller(ctx, "create", d.child(name))
	// A scratch file is for renaming onto config: only who may write config makes one, so the
	// cockpit's 16 are its owner's, and no other user can fill them and lock sed -i out.
	if err := d.fsys.eng.MayWriteConfig(c, d.cockpit); err != nil {
		return nil, err
	}
	return nil, d.fsys.scratch.create(d.cockpit, name, newScratch(c.UID, mode, nil, time.Now()))
}

func (cockpitListing) unlink(ctx context.Context, d *dir, name string) syscall.Errno {
	sc := d.fsys.scratch.get(d.cockpit, name)
	if sc == nil && name == "config" {
		return d.unlinkConfig(ctx) // see replace.go
	}
	if sc == nil {
		return d.fsys.undefined(ctx, "unlink", d.child(name), d.cockpit, "")
	}
	if !sc.mine(ctx) {
		return syscall.EACCES
	}
	if sc.dir {
		return syscall.EISDIR
	}
	d.fsys.scratch.remove(d.cockpit, name, sc)
	return 0
}

// renameScratch renames the caller's scratch file name: onto config, it applies its content as
// the cockpit's whole config, or refuses and keeps both; onto another free name, it moves.
func (d *dir) renameScratch(ctx context.Context, name, newName string) (bool, syscall.Errno) {
	sc := d.fsys.scratch.get(d.cockpit, name)
	if sc == nil {
		return false, 0
	}
	if !sc.mine(ctx) {
		return true, syscall.EACCES
	}
	if sc.dir {
		return false, 0 // a scratch directory keeps its name: refused as any rename of the tree
	}
	if newName != "config" {
		if !d.scratchTarget(ctx, newName) {
			return false, 0
		}
		return true, d.fsys.scratch.move(d.cockpit, name, newName, sc)
	}
	return true, d.promote(ctx, name, sc)
}

// scratchTarget says a scratch file may be renamed to name in d: no name of the tree and no
// scratch directory has it.
func (d *dir) scratchTarget(ctx context.Context, name string) bool {
	if old := d.fsys.scratch.get(d.cockpit, name); old != nil {
		return !old.dir
	}
	_, fixed, _ := (cockpitListing{}).lookup(ctx, d, name)
	return !fixed
}

// promote applies scratch file key's content as d's whole config, or refuses the rename with its
// events line and keeps both.
func (d *dir) promote(ctx context.Context, key string, sc *scratch) syscall.Errno {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	c := caller(ctx, "rename", d.child(key))
	if err := d.fsys.eng.SetConfig(ctx, c, d.cockpit, sc.data); err != nil {
		return d.fsys.fail(c, d.cockpit, "", err)
	}
	sc.promoted = true
	d.fsys.scratch.remove(d.cockpit, key, sc)
	return 0
}
