package fs

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/kv"
)

func TestErrnoOf(t *testing.T) {
	cases := []struct {
		err  error
		want syscall.Errno
	}{
		{nil, 0},
		{errGone, syscall.ESTALE},
		{gone(&engine.Refusal{Code: engine.NotFound}), syscall.ESTALE},
		{gone(&engine.Refusal{Code: engine.ClaimCoTenant}), syscall.EBUSY},
		{fmt.Errorf("wait: %w", context.Canceled), syscall.EINTR},
		{&engine.Refusal{Code: engine.StateLocked}, syscall.EAGAIN},
		{fmt.Errorf("claim: %w", &engine.Refusal{Code: engine.PortLeaseExhausted}), syscall.ENOSPC},
		{&engine.Refusal{Code: "NO_SUCH_CODE"}, syscall.EIO},
		{errors.New("fdatasync: input/output error"), syscall.EIO},
	}
	for _, tc := range cases {
		if got := errnoOf(tc.err); got != tc.want {
			t.Errorf("errnoOf(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// Every handler is guarded: with no engine behind it, each one that reaches the engine panics,
// and the caller gets EIO and the log a line, instead of the daemon dying.
func TestEveryHandlerIsGuarded(t *testing.T) {
	logs := &logBuffer{}
	f := &FS{started: time.Now(), log: log.New(logs, "", 0)} // eng nil: any call into it panics
	ctx := context.Background()
	boom := func() (view, error) { panic("render") }
	writable := f.newFile("c/config", "c", "", boom, configWriter{})
	d := f.newDir("c", "c", "", cockpitListing{})
	w := f.newWaitFile("c/stacks/s/wait", "c", "s")
	var nilHandle *handle
	handlers := map[string]func() syscall.Errno{
		"dir.Getattr":      func() syscall.Errno { return d.Getattr(ctx, nil, &fuse.AttrOut{}) },
		"dir.Lookup":       func() syscall.Errno { _, errno := d.Lookup(ctx, "config", &fuse.EntryOut{}); return errno },
		"dir.Readdir":      func() syscall.Errno { _, errno := d.Readdir(ctx); return errno },
		"dir.Rename":       func() syscall.Errno { return d.Rename(ctx, "config", d, "other", 0) },
		"dir.Mknod":        func() syscall.Errno { _, errno := d.Mknod(ctx, "x", 0, 0, &fuse.EntryOut{}); return errno },
		"dir.Symlink":      func() syscall.Errno { _, errno := d.Symlink(ctx, "t", "x", &fuse.EntryOut{}); return errno },
		"dir.Link":         func() syscall.Errno { _, errno := d.Link(ctx, d, "x", &fuse.EntryOut{}); return errno },
		"file.Open":        func() syscall.Errno { _, _, errno := writable.Open(ctx, syscall.O_RDONLY); return errno },
		"file.Getattr":     func() syscall.Errno { return writable.Getattr(ctx, nil, &fuse.AttrOut{}) },
		"file.Setattr":     func() syscall.Errno { return writable.Setattr(ctx, nilHandle, &fuse.SetAttrIn{}, &fuse.AttrOut{}) },
		"file.Read":        func() syscall.Errno { _, errno := writable.Read(ctx, nilHandle, nil, 0); return errno },
		"file.Write":       func() syscall.Errno { _, errno := writable.Write(ctx, nilHandle, []byte("x"), 0); return errno },
		"waitFile.Open":    func() syscall.Errno { _, _, errno := w.Open(ctx, syscall.O_RDONLY); return errno },
		"waitFile.Read":    func() syscall.Errno { _, errno := w.Read(ctx, &waitHandle{}, nil, 0); return errno },
		"waitFile.Getattr": func() syscall.Errno { return w.Getattr(ctx, nil, &fuse.AttrOut{}) },
	}
	for name, h := range handlers {
		before := strings.Count(logs.String(), "panic in")
		if errno := h(); errno != syscall.EIO {
			t.Errorf("%s: errno %v, want EIO", name, errno)
		}
		if strings.Count(logs.String(), "panic in") != before+1 {
			t.Errorf("%s: no log line for its panic", name)
		}
	}
}

// A failure of the store under `wait` is EIO and a log line, not a missing stack.
func TestWaitReportsAStoreFailure(t *testing.T) {
	db, err := kv.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(db)
	db.Close()
	logs := &logBuffer{}
	f := &FS{eng: eng, started: time.Now(), log: log.New(logs, "", 0)}
	w := f.newWaitFile("app/stacks/s/wait", "app", "s")
	if _, _, errno := w.Open(context.Background(), syscall.O_RDONLY); errno != syscall.EIO {
		t.Fatalf("open of wait over a closed store: %v, want EIO", errno)
	}
	if !strings.Contains(logs.String(), "open app/stacks/s/wait: ") || strings.Contains(logs.String(), "panic") {
		t.Fatalf("the failure was not logged: %q", logs.String())
	}
}
