package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/internal/mountinfo"
	"github.com/cockpitfs/cockpitfs/internal/shell"
)

const notMountedText = `No cockpitfs daemon is serving this directory. It is kept read-only while none
does, so that nothing is written here by mistake and hidden by the next mount.

Start one:       %s
Remove it:       chmod u+w %s && rm -r %s
`

// restartCommand is the command line that starts a daemon like this one again: on the same store,
// with the same access. An etcd password is left out: it is no file's to keep.
func restartCommand(mnt string, st storeChoice, f *storeFlags, allowOther bool) string {
	args := []string{"cockpitfs", "mount"}
	if st.etcd != nil {
		args = append(args, "--store", st.url)
		for _, fl := range []struct{ name, value string }{{"--cacert", *f.cacert}, {"--cert", *f.cert}, {"--key", *f.key}} {
			if fl.value != "" {
				if abs, err := filepath.Abs(fl.value); err == nil {
					args = append(args, fl.name, abs)
				}
			}
		}
		if user, _, _ := strings.Cut(*f.user, ":"); user != "" {
			args = append(args, "--user", user)
		}
		// What the daemon saw of the store is kept there (keepSeen).
		if data, err := filepath.Abs(st.data); err == nil && data != defaultDataDir() {
			args = append(args, "--data", data)
		}
	} else {
		data, err := filepath.Abs(st.data)
		if err != nil {
			data = st.data
		}
		args = append(args, "--data", data)
	}
	if allowOther {
		args = append(args, "--allow-other")
	}
	args = append(args, mnt)
	for i, a := range args {
		args[i] = shell.Quote(a)
	}
	return strings.Join(args, " ")
}

// checkMountpoint refuses, before anything is made, what prepareMountpoint would: a path that is
// not a directory, and a directory that holds anything (but the note) unless nonempty. A missing
// mnt passes: it is made.
func checkMountpoint(mnt string, nonempty bool) error {
	st, err := os.Stat(mnt)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", mnt)
	}
	dir, err := os.Open(mnt)
	if err != nil {
		return err
	}
	defer dir.Close()
	return checkEmpty(dir, mnt, nonempty)
}

func checkEmpty(dir *os.File, mnt string, nonempty bool) error {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return err
	}
	var there []string
	for _, n := range names {
		if n != mountinfo.NotMountedNote {
			there = append(there, n)
		}
	}
	if len(there) > 0 && !nonempty {
		return fmt.Errorf("%s is not empty (%s): the mount would hide it; move that away, or mount with --nonempty", mnt, listSome(there, 5))
	}
	return nil
}

// prepareMountpoint makes mnt if absent, refuses a directory that holds anything (but the note)
// unless nonempty, leaves the note (with restart, its command to start a daemon), and makes the
// directory writable by its owner, which fusermount3 requires of a mountpoint. It returns the
// directory opened — after the mount, its descriptor still reaches the directory beneath it — and
// undo, which takes back what it made or changed, for a mount that fails.
func prepareMountpoint(mnt string, nonempty bool, restart string) (dir *os.File, undo func(), err error) {
	// The highest directory this call makes, to remove with the rest.
	made := ""
	for p := mnt; ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); !os.IsNotExist(err) || p == filepath.Dir(p) {
			break
		}
		made = p
	}
	var noteMade, modeChanged bool
	var mode os.FileMode
	undo = func() {
		if noteMade {
			os.Remove(filepath.Join(mnt, mountinfo.NotMountedNote))
		}
		if made == "" {
			if modeChanged {
				chmodDir(mnt, uint32(mode))
			}
			return
		}
		for p := mnt; os.Remove(p) == nil && p != made; p = filepath.Dir(p) {
		}
	}
	defer func() {
		if err != nil {
			if dir != nil {
				dir.Close()
			}
			undo()
		}
	}()
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return nil, nil, err
	}
	// Made 0755 whatever the daemon's umask (daemonUmask is for its data): others reach the mount.
	// Through a descriptor of the directory itself, never a link put in its place since.
	for p := mnt; made != ""; p = filepath.Dir(p) {
		if err := chmodDir(p, 0o755); err != nil {
			return nil, nil, err
		}
		if p == made {
			break
		}
	}
	// mnt is resolved (resolveMountpoint): a link there now was put in its place since.
	if dir, err = os.OpenFile(mnt, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0); err != nil {
		return nil, nil, err
	}
	if err := checkEmpty(dir, mnt, nonempty); err != nil {
		return dir, nil, err
	}
	st, err := dir.Stat()
	if err != nil {
		return dir, nil, err
	}
	if err := dir.Chmod(st.Mode().Perm() | 0o200); err != nil {
		log.Printf("%s stays mode %o: %v", mnt, st.Mode().Perm(), err)
		return dir, undo, nil
	}
	mode, modeChanged = st.Mode().Perm(), true
	// Written again when it differs: the daemon may have been started with other flags.
	note := filepath.Join(mnt, mountinfo.NotMountedNote)
	q := shell.Quote(mnt)
	text := fmt.Sprintf(notMountedText, restart, q, q)
	had, readErr := readNote(dir)
	if readErr != nil || string(had) != text {
		unix.Unlinkat(int(dir.Fd()), mountinfo.NotMountedNote, 0)
		if err := writeNote(dir, text); err != nil {
			log.Printf("leaving %s: %v", note, err)
		}
		noteMade = errors.Is(readErr, fs.ErrNotExist)
	}
	return dir, undo, nil
}

// notServed is what a command that works through the mount says of a mountpoint no daemon serves.
func notServed(mnt string) error {
	return fmt.Errorf("no cockpitfs daemon serves %s: start one with cockpitfs mount --daemon %s%s", mnt, shell.Quote(mnt), mountinfo.RestartNeedsNote(mnt))
}

// chmodDir sets the mode of the directory at path, failing on anything else there.
func chmodDir(path string, mode uint32) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "chmod", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, mode); err != nil {
		return &fs.PathError{Op: "chmod", Path: path, Err: err}
	}
	return nil
}

// readNote and writeNote reach the note through the mountpoint's descriptor and never through a
// link: the directory may be another user's, who can leave anything under the note's name there,
// for root's daemon to write into or chmod.

// readNote reads the note as it is, when it is a regular file: a FIFO or a device would hold the
// mount up.
func readNote(dir *os.File) ([]byte, error) {
	fd, err := unix.Openat(int(dir.Fd()), mountinfo.NotMountedNote, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: mountinfo.NotMountedNote, Err: err}
	}
	f := os.NewFile(uintptr(fd), mountinfo.NotMountedNote)
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", mountinfo.NotMountedNote)
	}
	return io.ReadAll(io.LimitReader(f, 1<<16))
}

// writeNote makes the note anew (O_EXCL: whatever took its name since the unlink stays as it is)
// with mode 0444 whatever the umask: everyone reads it.
func writeNote(dir *os.File, text string) error {
	fd, err := unix.Openat(int(dir.Fd()), mountinfo.NotMountedNote, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), mountinfo.NotMountedNote)
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o444); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// protectMountpoint clears every write bit of the directory beneath the mount, so that while no
// daemon serves, writes into it are refused (EACCES) rather than landing beneath the next mount.
// Root's writes pass mode bits; for root the note and the non-empty check remain.
func protectMountpoint(dir *os.File) {
	st, err := dir.Stat()
	if err == nil {
		err = dir.Chmod(st.Mode().Perm() &^ 0o222)
	}
	if err != nil {
		log.Printf("%s stays writable while unmounted: %v", dir.Name(), err)
	}
}

// listSome names up to n of names, sorted, and how many more there are.
func listSome(names []string, n int) string {
	sort.Strings(names)
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}

// resolveMountpoint makes path absolute and resolves its symlinks, as the kernel does when it
// mounts: /proc/self/mountinfo lists a mount under that path. Only the existing part is resolved,
// the rest (which mount creates) is kept; the last name is read with readlink, which never asks
// the mount a daemon may have left there, dead or hung.
func resolveMountpoint(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	for range 40 {
		dir := resolveExisting(filepath.Dir(abs))
		resolved := filepath.Join(dir, filepath.Base(abs))
		link, err := os.Readlink(resolved)
		if err != nil {
			return resolved, nil
		}
		if !filepath.IsAbs(link) {
			link = filepath.Join(dir, link)
		}
		abs = link
	}
	return "", fmt.Errorf("%s: too many levels of symbolic links", path)
}

// resolveExisting resolves the symlinks of the longest part of dir that exists, keeping the rest.
func resolveExisting(dir string) string {
	rest := ""
	for {
		if resolved, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(resolved, rest)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return filepath.Join(dir, rest)
		}
		rest = filepath.Join(filepath.Base(dir), rest)
		dir = parent
	}
}
