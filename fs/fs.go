// Package fs maps the cockpitfs tree (SPEC §2) onto the engine: each file operation is one engine
// call, its refusal one errno and one events line. No domain rule lives here.
package fs

import (
	"context"
	"hash/fnv"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/liveness"
	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/executor"
)

// maxCommand bounds one control write and a config document (SPEC §2): the same 64 KiB the
// config parser accepts.
const maxCommand = portdecl.MaxDocumentBytes

// FS is the mounted tree's shared state.
type FS struct {
	eng     *engine.Engine
	started time.Time
	uid     uint32 // the daemon's uid: owner of what no one else owns
	gid     uint32 // the daemon's gid: every file's group (a user's own daemon shows theirs)
	log     *log.Logger
	// refusalLines bounds each uid's log lines of refusals no events file takes (see fail).
	refusalLines refusalLimiter
	// eventLines bounds each uid's events lines of refusals (see logRefusal).
	eventLines eventBudget
	byPath     sync.Map // cancel channels of the GETATTRs in flight that carry no file handle
	// followers are the opens of events files (see file.follows).
	followers followers
	// scratch are the files beside each cockpit's config (see scratch.go).
	scratch scratchFiles
	// replacing are the processes replacing a cockpit's config by taking it away first (see
	// replace.go).
	replacing replacements
	// frozen are the frozen nodes that keep their content (see frozen.go).
	frozen frozenNodes
	// contentTimes keep a record-derived file's mtime while its content stays.
	contentTimes contentTimes
	// snapshots are the opens' shared contents and what each uid's opens hold.
	snapshots snapshots
	// waiting counts each uid's reads blocked in wait files.
	waiting waiting
	// made are the stacks just made, and by whom (see nested.go).
	made madeStacks
	// dir is the mount point, absolute: a path of the tree as /proc/<pid>/fd names it is under it.
	dir string
	// exec is the daemon's own drain executor: gc and the stop step (executor package).
	exec *executor.Executor
	// root is the tree's root inode, below which the kernel's names are found (see forget.go).
	root *gofs.Inode
	// forget looks holder names a commit released up again (see forget.go); nil: nothing does.
	forget *forgetter
}

// Options configure a mount.
type Options struct {
	AllowOther bool
	Debug      bool
	Logger     *log.Logger // nil: stderr
	// MaxOpenBytesPerUID bounds the snapshot bytes one uid's opens may hold (see snapshots.go);
	// 0: no bound.
	MaxOpenBytesPerUID int64
	// MaxWaitsPerUID bounds the reads one uid may have waiting in wait files at once, root's and
	// the daemon's own user's aside (see wait.go); 0: no bound.
	MaxWaitsPerUID int
	// GCInterval is how often the daemon drains the stacks stale for their cockpit's [gc] grace
	// (executor.Sweeper); 0: never.
	GCInterval time.Duration
}

// fsName is every cockpitfs mount's source and FUSE subtype.
const fsName = "cockpitfs"

// MountType is the type /proc/self/mountinfo gives a cockpitfs mount, live or dead: the command
// line unmounts, and clears, no other.
const MountType = "fuse." + fsName

// Mount serves the tree for eng at dir. The kernel has the mount when it returns; requests that
// arrive before the server has answered the kernel's INIT wait for it.
//
// gofs.Mount is not used: its WaitMount opens and polls a file on the new mount from this process
// (go-fuse's poll hack). A daemon killed during that holds a request to itself that nothing will
// answer, and lingers as a zombie keeping the mount and the store's lock. The daemon never opens
// its own files, so the hack buys it nothing.
func Mount(dir string, eng *engine.Engine, o Options) (*fuse.Server, error) {
	logger := o.Logger
	if logger == nil {
		logger = log.New(os.Stderr, "cockpitfs: ", log.LstdFlags)
	}
	fsys := &FS{eng: eng, started: time.Now(), uid: uint32(os.Getuid()), gid: uint32(os.Getgid()), log: logger,
		snapshots: snapshots{limit: o.MaxOpenBytesPerUID}, waiting: waiting{bound: engine.NewUIDBound(o.MaxWaitsPerUID, []uint32{uint32(os.Getuid())})}, dir: dir}
	// As the kernel names it in /proc/<pid>/fd: absolute, through no symbolic link.
	if abs, err := filepath.Abs(dir); err == nil {
		fsys.dir = abs
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			fsys.dir = real
		}
	}
	fsys.exec = executor.New(eng, fsys.dir)
	// Zero attribute timeouts and direct I/O: every open, stat and readdir reaches us, so a change
	// by anyone is visible at the next one whatever the kernel cached. Frozen files are the
	// exception: their nodes never change, and their names are looked up at every open (see
	// entry.frozen). Other names are kept (see entryTimeout), and so are missing ones where only
	// this mount's own operations create names (see ownNames). No NegativeTimeout: with one,
	// go-fuse's bridge would override Lookup's.
	var zero time.Duration
	options := &gofs.Options{
		AttrTimeout: &zero,
		MountOptions: fuse.MountOptions{
			AllowOther:    o.AllowOther,
			FsName:        fsName,
			Name:          fsName,
			DirectMount:   os.Geteuid() == 0,
			Debug:         o.Debug,
			MaxBackground: 64,
			// The tree has no extended attributes. ENOSYS says so to the kernel once, and it
			// answers every later getxattr and setxattr itself: ls -l asks twice a name, and every
			// write asks whether the file carries capabilities to drop. setxattr then fails
			// EOPNOTSUPP, and cp -p restores a mode rather than an ACL.
			DisableXAttrs: true,
			// READDIRPLUS has go-fuse look every name up after listing it, and a listing renders
			// every frozen file already (its inode number is its content's): each was rendered
			// twice, and for names the kernel does not keep (holders, frozen files) the lookup
			// bought nothing, the next stat or open looking the name up again.
			DisableReadDirPlus: true,
		},
	}
	root := fsys.newDir("", "", "", rootListing{})
	raw := rawLayer{gofs.NewNodeFS(root, options), fsys}
	fsys.root = root.EmbeddedInode()
	server, err := fuse.NewServer(raw, dir, &options.MountOptions)
	if err != nil {
		return nil, err
	}
	fsys.followers.ss = &fsys.snapshots
	fsys.forget = startForgetter(fsys.dir, logger.Printf)
	eng.OnVanished(fsys.forgetVanished)
	go server.Serve()
	go func() { server.Wait(); fsys.forget.stop() }()
	if o.GCInterval > 0 {
		sweeper := executor.NewSweeper(fsys.exec, func(c engine.Caller, cockpit, stack string, err error) {
			fsys.fail(c, cockpit, stack, err)
		})
		ctx, stop := context.WithCancel(context.Background())
		go sweeper.Run(ctx, o.GCInterval)
		go func() { server.Wait(); stop() }()
	}
	return server, nil
}

// rawLayer does on raw requests what go-fuse's node API cannot express.
type rawLayer struct {
	fuse.RawFileSystem
	fsys *FS
}

// GetAttr marks the GETATTRs the kernel sends without a file handle: a stat by path. go-fuse
// answers those with any handle open on the inode (libfuse#62), which here would be another
// open's snapshot, so a stat would show what that open saw rather than the current state. Only
// the raw request carries the kernel's flag; it reaches Getattr keyed by the request's cancel
// channel, which is the request's own while it is in flight.
func (s rawLayer) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	if in.Flags()&fuse.FUSE_GETATTR_FH == 0 {
		s.fsys.byPath.Store(cancel, struct{}{})
		defer s.fsys.byPath.Delete(cancel)
	}
	return s.RawFileSystem.GetAttr(cancel, in, out)
}

// Lookup answers a missing name that Lookup gave an entry timeout as FUSE's negative entry
// (success with node id 0), which the kernel keeps; an ENOENT it would not.
func (s rawLayer) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	status := s.RawFileSystem.Lookup(cancel, header, name, out)
	if status == fuse.ENOENT && out.EntryTimeout() > 0 {
		out.NodeId = 0
		return fuse.OK
	}
	return status
}

// openedHandle is the handle a Getattr is about: fh, unless the request is a stat by path.
func (f *FS) openedHandle(ctx context.Context, fh gofs.FileHandle) (*handle, bool) {
	h, ok := fh.(*handle)
	if !ok {
		return nil, false
	}
	if fc, isRequest := ctx.(*fuse.Context); isRequest {
		if _, byPath := f.byPath.Load(fc.Cancel); byPath {
			return nil, false
		}
	}
	return h, true
}

// caller is who the kernel says asked: FUSE reports the calling thread, resolved here to its
// process. A pid that cannot be resolved is reported as 0, never trusted.
func caller(ctx context.Context, op, path string) engine.Caller {
	c := engine.Caller{Op: op, Path: path}
	if fc, ok := fuse.FromContext(ctx); ok {
		c.UID, c.GID = fc.Uid, fc.Gid
		if pid, err := liveness.ProcessOf(int(fc.Pid)); err == nil {
			c.PID = pid
		}
	}
	return c
}

// undefined refuses creating a name the tree does not define, so editors fall back to saving in
// place.
// An editor's own scratch names (swap, lock, backup and autosave files) are refused without an
// events line: editors try them on every save and fall back by themselves.
func (f *FS) undefined(ctx context.Context, op, path, cockpit, stack string) syscall.Errno {
	if editorScratch(filepath.Base(path)) {
		return syscall.EPERM
	}
	c := caller(ctx, op, path)
	return f.fail(c, cockpit, stack, &engine.Refusal{Code: engine.UndefinedName,
		Message: "the tree does not define " + path, Fix: "write to an existing file instead"})
}

// editorScratch says name is one an editor makes beside the file it edits: vim's swap files
// (.name.swp, .swo … .swa, .swx) and its writability probe (4913 and up), nano's lock file
// (.name.swp) and emergency save (name.save), emacs's autosave (#name#) and lock (.#name), and
// backups (name~).
func editorScratch(name string) bool {
	switch {
	case strings.HasSuffix(name, "~"), strings.HasPrefix(name, ".#"), strings.HasSuffix(name, ".save"):
		return true
	case len(name) > 2 && strings.HasPrefix(name, "#") && strings.HasSuffix(name, "#"):
		return true
	case strings.HasPrefix(name, ".") && len(name) > 4 && name[len(name)-4:len(name)-1] == ".sw":
		last := name[len(name)-1]
		return last >= 'a' && last <= 'z'
	}
	// vim's write test, 4913 and on: four digits, which compare as their numbers do.
	return len(name) == 4 && strings.Trim(name, "0123456789") == "" && name >= "4913" && name <= "5012"
}

// ino gives every path a stable inode number, so a node looked up again is the same node.
func ino(path string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(path))
	n := h.Sum64()
	if n <= 1 {
		n += 2
	}
	return n
}

func setTimes(a *fuse.Attr, t time.Time) {
	a.SetTimes(&t, &t, &t)
}
