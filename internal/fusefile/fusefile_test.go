package fusefile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// refusing is a file whose every read and write a mount refuses EAGAIN, as cockpitfs does while
// its store cannot answer.
type refusing struct{ gofs.Inode }

func (*refusing) Open(context.Context, uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (*refusing) Read(context.Context, gofs.FileHandle, []byte, int64) (fuse.ReadResult, syscall.Errno) {
	return nil, syscall.EAGAIN
}

func (*refusing) Write(context.Context, gofs.FileHandle, []byte, int64) (uint32, syscall.Errno) {
	return 0, syscall.EAGAIN
}

func (*refusing) Setattr(context.Context, gofs.FileHandle, *fuse.SetAttrIn, *fuse.AttrOut) syscall.Errno {
	return 0
}

type root struct{ gofs.Inode }

func (r *root) OnAdd(ctx context.Context) {
	r.AddChild("refused", r.NewPersistentInode(ctx, &refusing{}, gofs.StableAttr{Mode: syscall.S_IFREG}), false)
}

// serveEnv makes the test binary the mount's server: a process of its own, as cockpitfs is, so a
// call of the test's that waits forever cannot keep the server from answering the test's exit.
const serveEnv = "FUSEFILE_TEST_SERVE"

func TestMain(m *testing.M) {
	if dir := os.Getenv(serveEnv); dir != "" {
		server, err := gofs.Mount(dir, &root{}, &gofs.Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		server.Wait()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestEAGAINIsReturned: through a real FUSE mount that refuses EAGAIN, ReadFile and WriteFile
// fail with it. (os.ReadFile and os.WriteFile wait forever there: Go polls the file.)
func TestEAGAINIsReturned(t *testing.T) {
	dir := t.TempDir()
	server := exec.Command(os.Args[0])
	server.Env = append(os.Environ(), serveEnv+"="+dir)
	server.Stderr = os.Stderr
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if exec.Command("fusermount3", "-uz", dir).Run() != nil {
			syscall.Unmount(dir, syscall.MNT_DETACH)
		}
		server.Process.Kill()
		server.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "refused")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the mount did not serve within 10 s")
		}
	}
	path := filepath.Join(dir, "refused")
	for name, call := range map[string]func() error{
		"ReadFile":  func() error { _, err := ReadFile(path); return err },
		"WriteFile": func() error { return WriteFile(path, []byte("x\n"), 0o644) },
		"OpenFile+Write": func() error {
			f, err := OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.Write([]byte("x\n"))
			return err
		},
	} {
		done := make(chan error, 1)
		go func() { done <- call() }()
		select {
		case err := <-done:
			if !errors.Is(err, syscall.EAGAIN) {
				t.Errorf("%s: %v, want EAGAIN", name, err)
			}
		case <-time.After(time.Minute):
			// Bounded so that a call that waits forever fails the test instead of hanging it.
			t.Fatalf("%s still waits after a minute on a file the mount refuses EAGAIN", name)
		}
	}
}
