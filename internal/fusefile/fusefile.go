// Package fusefile opens files of a FUSE mount for Go programs that must see each error the
// mount answers, EAGAIN among them.
//
// os.OpenFile hands a file to Go's poller whenever epoll accepts it, and a FUSE file is one
// (the kernel's fuse_file_poll). A read or write the mount then refuses EAGAIN (STATE_LOCKED,
// MACHINE_UNANNOUNCED: a store that did not answer in time) is taken for "would block": Go waits
// for the file to become ready, an edge a FUSE file without poll support never sends, and the
// program hangs instead of failing. A descriptor Go did not open, in blocking mode, is never
// polled (os.NewFile), so each call returns what the mount answered.
package fusefile

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// OpenFile is os.OpenFile for a file the caller's reads and writes must not be polled on.
func OpenFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	fd, err := unix.Open(name, flag|unix.O_CLOEXEC, uint32(perm.Perm()))
	for err == unix.EINTR {
		fd, err = unix.Open(name, flag|unix.O_CLOEXEC, uint32(perm.Perm()))
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// Open is OpenFile for reading.
func Open(name string) (*os.File, error) { return OpenFile(name, os.O_RDONLY, 0) }

// ReadFile is os.ReadFile through Open.
func ReadFile(name string) ([]byte, error) {
	f, err := Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// WriteFile is os.WriteFile through OpenFile; the close's error (where the mount applies a whole
// document) is returned too.
func WriteFile(name string, data []byte, perm os.FileMode) error {
	f, err := OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
