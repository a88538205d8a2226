package agent

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// waitFile reads a stack's wait file, which blocks until the stack's revision moves past the one
// seen at open, and returns the new revision; when ctx ends first, the read is interrupted and
// the error is EINTR.
//
// A blocked FUSE read ends early only by a signal to the thread blocked in it (the kernel then
// asks the daemon to interrupt the request, and the daemon answers EINTR, as for Ctrl-C on cat):
// the read runs on a thread of its own, which is sent SIGURG, a signal the Go runtime receives and
// otherwise ignores. os.File would retry the read after EINTR, so the raw system calls are used.
func waitFile(ctx context.Context, path string) (int64, error) {
	type result struct {
		rev int64
		err error
	}
	tid := make(chan int, 1)
	done := make(chan result, 1)
	var stop chan struct{} = make(chan struct{})
	go func() {
		// The thread ends with the goroutine: it may have been interrupted mid-read.
		runtime.LockOSThread()
		tid <- unix.Gettid()
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- result{err: &os.PathError{Op: "open", Path: path, Err: err}}
			return
		}
		defer unix.Close(fd)
		buf := make([]byte, 64)
		for {
			n, err := unix.Read(fd, buf)
			if err == unix.EINTR {
				select {
				case <-stop:
				default:
					continue // the runtime's own preemption signal, or another one: read on
				}
			}
			if err != nil {
				done <- result{err: &os.PathError{Op: "read", Path: path, Err: err}}
				return
			}
			rev, err := strconv.ParseInt(strings.TrimSpace(string(buf[:n])), 10, 64)
			done <- result{rev: rev, err: err}
			return
		}
	}()
	t := <-tid
	select {
	case r := <-done:
		return r.rev, r.err
	case <-ctx.Done():
	}
	close(stop)
	// The signal may come before the read starts blocking: send it until the read has ended.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		unix.Tgkill(os.Getpid(), t, unix.SIGURG)
		select {
		case r := <-done:
			return r.rev, r.err
		case <-tick.C:
		}
	}
}
