package liveness

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Exited returns a channel closed once process pid has exited. It watches a pidfd, so it is that
// very process and never one given its pid later; an error when pid cannot be watched (gone
// already: ESRCH). The wait holds no thread: the runtime's poller waits for the pidfd to become
// readable, which it does when its process exits.
func Exited(pid int) (<-chan struct{}, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	rc, err := f.SyscallConn()
	if err == nil {
		err = f.SetReadDeadline(time.Time{}) // fails unless the runtime's poller took the pidfd
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer f.Close()
		rc.Read(func(fd uintptr) bool {
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return n > 0 || err != nil && err != unix.EINTR
		})
	}()
	return done, nil
}
