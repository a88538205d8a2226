package fs

import (
	"context"
	"errors"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/kv"
)

// panicListing serves a file whose rendering panics beside one that works.
type panicListing struct{}

func (panicListing) entries(_ context.Context, d *dir) ([]entry, error) {
	boom := func() (view, error) { panic("boom") }
	fine := func() (view, error) { return view{data: []byte("fine\n")}, nil }
	return []entry{
		{name: "boom", node: d.fsys.newFile("boom", "", "", boom, nil)},
		{name: "fine", node: d.fsys.newFile("fine", "", "", fine, nil)},
	}, nil
}

// A panic in a handler is EIO and a log line; the mount keeps serving.
func TestPanicIsEIOAndTheMountServesOn(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("/dev/fuse is missing")
		}
		t.Skip("SKIPPING: /dev/fuse is missing")
	}
	db, err := kv.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	logs := &logBuffer{}
	fsys := &FS{eng: engine.New(db), started: time.Now(), log: log.New(logs, "", 0)}
	mnt := t.TempDir()
	var zero time.Duration
	server, err := gofs.Mount(mnt, fsys.newDir("", "", "", panicListing{}), &gofs.Options{
		EntryTimeout: &zero, AttrTimeout: &zero,
		MountOptions: fuse.MountOptions{DirectMount: os.Geteuid() == 0},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Unmount() })

	_, err = os.ReadFile(filepath.Join(mnt, "boom"))
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("reading a panicking file: %v, want EIO", err)
	}
	if data, err := os.ReadFile(filepath.Join(mnt, "fine")); err != nil || string(data) != "fine\n" {
		t.Fatalf("after the panic: %q, %v", data, err)
	}
	if !strings.Contains(logs.String(), "panic in") {
		t.Fatalf("no log line for the panic: %q", logs.String())
	}
}

// logBuffer collects the daemon's log lines; handlers write from many goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
