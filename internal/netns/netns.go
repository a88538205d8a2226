// Package netns runs things inside a network namespace of their own, for tests and benchmarks.
//
// Why: a cockpitfs daemon holds each leased port machine-wide (an abstract unix socket, scoped to
// the network namespace like TCP ports), so two test daemons on one machine compete for the same
// ports as two real daemons would — and other people's tests run on this machine too. A test
// daemon started inside its own namespace has holds and listeners of its own, exactly as a
// daemon in a container has; tests that are about two daemons share one namespace on purpose.
//
// A namespace is entered per OS thread: Do locks a thread, moves it into the namespace, runs fn
// and moves it back. A process started by fn (exec.Cmd.Start forks from the calling thread) and a
// socket made by fn belong to the namespace for good.
package netns

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// NS is a network namespace with its loopback up, kept alive by an open file.
type NS struct {
	file *os.File
}

// New makes a network namespace (root only: it needs CAP_SYS_ADMIN).
func New() (*NS, error) {
	var ns *NS
	err := onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
		}
		if err := loopbackUp(); err != nil {
			return err
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			return err
		}
		ns = &NS{file: f}
		return nil
	})
	return ns, err
}

// Do runs fn on a thread inside the namespace. A nil NS runs fn where the caller is.
func (n *NS) Do(fn func() error) error {
	if n == nil {
		return fn()
	}
	return onThread(func() error {
		if err := unix.Setns(int(n.file.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("setns: %w", err)
		}
		return fn()
	})
}

// Enter moves the calling goroutine, locked to its thread, into the namespace until leave is
// called, for work that cannot be handed to Do (a benchmark's loop). A nil NS enters nothing.
func (n *NS) Enter() (leave func(), err error) {
	if n == nil {
		return func() {}, nil
	}
	runtime.LockOSThread()
	home, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	if err := unix.Setns(int(n.file.Fd()), unix.CLONE_NEWNET); err != nil {
		home.Close()
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("setns: %w", err)
	}
	return func() {
		defer home.Close()
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}, nil
}

// Close lets the namespace go once nothing else lives in it.
func (n *NS) Close() error {
	if n == nil {
		return nil
	}
	return n.file.Close()
}

// onThread runs fn on a locked OS thread and puts the thread back into the namespace it came
// from; a thread that cannot go back is never unlocked, so Go ends it with the goroutine.
func onThread(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- err
			return
		}
		defer home.Close()
		ranErr := fn()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- errors.Join(ranErr, fmt.Errorf("back to the home namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		done <- ranErr
	}()
	return <-done
}

// loopbackUp brings lo up in the calling thread's namespace (a new one starts with it down), so
// 127.0.0.1 and ::1 can be listened on.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS lo: %w", err)
	}
	return nil
}
