package kv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// lockFileName sits beside badger's own LOCK. We take ours first because badger's
// message does not say who holds the directory, and ours records the pid.
const lockFileName = "cockpitfs.lock"

// selfHeldWait is how long a lock this process's own pid holds is tried again (see lockDir).
const selfHeldWait = time.Second

// HeldError reports that another process holds the data directory.
type HeldError struct {
	Dir string
	PID int // 0 when the holder's pid could not be read
}

func (e *HeldError) Error() string {
	if e.PID == 0 {
		return fmt.Sprintf("data directory %s is in use by another cockpitfs process", e.Dir)
	}
	return fmt.Sprintf("data directory %s is in use by cockpitfs process %d", e.Dir, e.PID)
}

// lockDir takes an exclusive, non-blocking flock on dir/cockpitfs.lock and writes
// our pid into it. The returned file holds the lock until it is closed; the kernel
// releases it if the process dies, so a kill -9 never leaves the directory stuck.
// flock belongs to the open file description, so a second Open in the same
// process conflicts too.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("kv: open lock file: %w", err)
	}
	// A lock this process let go can stay taken a moment: a child it was starting when the lock's
	// file was closed holds a copy of the descriptor until it execs (fork copies every descriptor,
	// and close-on-exec closes it only at the exec). So a lock held by this pid is tried again for
	// a while, and one held by another process is refused at once.
	for deadline := time.Now().Add(selfHeldWait); ; time.Sleep(5 * time.Millisecond) {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		pid := readHolderPID(path)
		if errors.Is(err, unix.EWOULDBLOCK) && pid == os.Getpid() && time.Now().Before(deadline) {
			continue
		}
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &HeldError{Dir: dir, PID: pid}
		}
		return nil, fmt.Errorf("kv: lock %s: %w", path, err)
	}
	if err := writePID(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("kv: write pid to %s: %w", path, err)
	}
	return f, nil
}

func writePID(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return err
}

// readHolderPID returns 0 when the file is unreadable or the holder has locked it
// but not yet written its pid.
func readHolderPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
