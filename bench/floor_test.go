package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
)

// The FUSE floor: the least a go-fuse filesystem in cockpitfs's cache mode costs for the same
// syscalls, with no store behind it. As in cockpitfs, ports/HTTP is a frozen file (looked up at
// every open, its attributes and pages kept by the kernel, FOPEN_KEEP_CACHE|FOPEN_NOFLUSH);
// directories and holders are kept an hour, missing holders too; holders open with
// FOPEN_DIRECT_IO|FOPEN_NOFLUSH. It is served by a re-exec of the benchmark binary, a process of
// its own as the daemon is.

// floorContent is what stacks/s/ports/HTTP holds in the shared daemon (its first family).
var floorContent = []byte("20000\n")

// floorFile is a static file that accepts and drops writes.
type floorFile struct {
	fs.Inode
	frozen bool
}

var (
	_ = (fs.NodeOpener)((*floorFile)(nil))
	_ = (fs.NodeReader)((*floorFile)(nil))
	_ = (fs.NodeWriter)((*floorFile)(nil))
	_ = (fs.NodeGetattrer)((*floorFile)(nil))
	_ = (fs.NodeSetattrer)((*floorFile)(nil))
)

// floorKept is how long the floor lets the kernel keep what cockpitfs lets it keep.
const floorKept = time.Hour

func (f *floorFile) Open(context.Context, uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if f.frozen {
		return nil, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH, 0
	}
	return nil, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
}

func (*floorFile) Read(_ context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off >= int64(len(floorContent)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(floorContent[off:]), 0
}

func (*floorFile) Write(_ context.Context, _ fs.FileHandle, data []byte, _ int64) (uint32, syscall.Errno) {
	return uint32(len(data)), 0
}

func (f *floorFile) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o644
	out.Nlink = 1
	out.Size = uint64(len(floorContent))
	if f.frozen {
		out.SetTimeout(floorKept)
	}
	return 0
}

func (f *floorFile) Setattr(ctx context.Context, fh fs.FileHandle, _ *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return f.Getattr(ctx, fh, out)
}

// floorDir is a directory where files can be created and unlinked, like holders/. In a synced one
// (store set) a create returns once one commit of a record-sized value to store is durable, as a
// claim's does: what a claim through FUSE costs with none of the engine's work.
type floorDir struct {
	fs.Inode
	store *kv.DB
}

// syncedValue is what a synced create commits: about a claimed stack's record.
var syncedValue = make([]byte, 1200)

var (
	_ = (fs.NodeLookuper)((*floorDir)(nil))
	_ = (fs.NodeCreater)((*floorDir)(nil))
	_ = (fs.NodeUnlinker)((*floorDir)(nil))
)

// Lookup keeps names as cockpitfs does: a frozen file's not at all, its attributes for good.
func (d *floorDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	child := d.GetChild(name)
	if child == nil {
		return nil, syscall.ENOENT
	}
	if f, ok := child.Operations().(*floorFile); ok {
		var attr fuse.AttrOut
		f.Getattr(ctx, nil, &attr)
		out.Attr = attr.Attr
		if f.frozen {
			out.SetAttrTimeout(floorKept)
			return child, 0
		}
	} else {
		out.Mode = syscall.S_IFDIR | 0o755
	}
	out.SetEntryTimeout(floorKept)
	return child, 0
}

func (d *floorDir) Create(ctx context.Context, name string, _, _ uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if d.store != nil {
		if err := d.store.Update(ctx, func(tx storage.Txn) error { return tx.Set(name, syncedValue) }); err != nil {
			return nil, nil, 0, fs.ToErrno(err)
		}
	}
	out.Mode = syscall.S_IFREG | 0o644
	out.Nlink = 1
	out.SetEntryTimeout(floorKept)
	return d.NewInode(ctx, &floorFile{}, fs.StableAttr{Mode: syscall.S_IFREG}), nil, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
}

func (*floorDir) Unlink(context.Context, string) syscall.Errno { return 0 }

// floorRoot builds app/stacks/s/ports/HTTP, app/stacks/s/control, app/stacks/s/holders/ and the
// durable app/stacks/s/synced/, the paths the cockpitfs benchmarks use, so both walk the same
// number of components. synced is the synced directory's store, on the disk the daemon's is on.
type floorRoot struct {
	floorDir
	synced *kv.DB
}

var _ = (fs.NodeOnAdder)((*floorRoot)(nil))

func (r *floorRoot) OnAdd(ctx context.Context) {
	dir := func(parent *fs.Inode, name string, node fs.InodeEmbedder) *fs.Inode {
		ch := parent.NewPersistentInode(ctx, node, fs.StableAttr{Mode: syscall.S_IFDIR})
		parent.AddChild(name, ch, false)
		return ch
	}
	s := dir(dir(dir(&r.Inode, "app", &floorDir{}), "stacks", &floorDir{}), "s", &floorDir{})
	ports := dir(s, "ports", &floorDir{})
	ports.AddChild("HTTP", ports.NewPersistentInode(ctx, &floorFile{frozen: true}, fs.StableAttr{Mode: syscall.S_IFREG}), false)
	// control takes the write floor's writes, with a control file's direct I/O.
	s.AddChild("control", s.NewPersistentInode(ctx, &floorFile{}, fs.StableAttr{Mode: syscall.S_IFREG}), false)
	dir(s, "holders", &floorDir{})
	dir(s, "synced", &floorDir{store: r.synced})
}

// floorMount is the floor filesystem, mounted at first use for the rest of the run.
var floorMount string

// floorEnv names the mount point a re-exec of this binary serves the floor on (see TestMain). The
// floor runs in its own process, as the daemon does: a FUSE round trip between processes costs an
// address-space switch that one within a process does not.
const floorEnv = "COCKPITFS_BENCH_FLOOR"

func floorDirFor(b *testing.B) string {
	b.Helper()
	if floorMount != "" {
		return floorMount
	}
	dir := filepath.Join(workDir, "floor")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), floorEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	cleanups = append(cleanups, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		detach(dir)
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "serving\n" {
		b.Fatalf("floor filesystem did not start: %q, %v", line, err)
	}
	floorMount = dir
	return dir
}

// serveFloor mounts the floor on dir and serves it until SIGTERM.
func serveFloor(dir string) int {
	// Timeouts are floorDir's and floorFile's; missing names are kept, as cockpitfs keeps missing
	// holders (holders/ and synced/ are the floor's directories whose names change at all).
	zero, kept := time.Duration(0), floorKept
	store, err := kv.Open(filepath.Join(filepath.Dir(dir), "floor-store"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		return 1
	}
	defer store.Close()
	server, err := fs.Mount(dir, &floorRoot{synced: store}, &fs.Options{
		AttrTimeout:     &zero,
		NegativeTimeout: &kept,
		MountOptions: fuse.MountOptions{
			FsName:        "floor",
			Name:          "floor",
			DirectMount:   os.Geteuid() == 0,
			MaxBackground: 64,
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		return 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	fmt.Println("serving")
	<-stop
	if server.Unmount() != nil {
		detach(dir)
	}
	return 0
}

// tmpfsDir returns a directory holding app/stacks/s/ports/HTTP on tmpfs (/dev/shm).
var tmpfsRoot string

func tmpfsDirFor(b *testing.B) string {
	b.Helper()
	if tmpfsRoot != "" {
		return tmpfsRoot
	}
	root, err := os.MkdirTemp("/dev/shm", "cockpitfs-bench")
	if err != nil {
		b.Skipf("no tmpfs at /dev/shm: %v", err)
	}
	cleanups = append(cleanups, func() { os.RemoveAll(root) })
	ports := filepath.Join(root, "app", "stacks", "s", "ports")
	if err := os.MkdirAll(ports, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ports, "HTTP"), floorContent, 0o644); err != nil {
		b.Fatal(err)
	}
	tmpfsRoot = root
	return root
}
