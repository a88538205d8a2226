package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// A daemon trusts its data directory only when no other user controls it, as sshd's StrictModes
// trusts a user's files: a root daemon writing through a link another user planted there (its
// log, a store file) would write wherever that user chose, and a store another user may change
// is not this daemon's. Every file the daemon makes there is its own, 0600 (serve's umask).

// daemonUmask is the daemon's file creation mask: the store's files (badger's tables and value
// logs included), its backups and its log are the daemon's alone.
const daemonUmask = 0o077

// checkDataDir refuses a data directory the daemon must not trust. The directory and every
// directory above it (as named, and with links resolved) must belong to root or to the daemon's uid and be writable
// by no one else, though an ancestor may be a sticky world-writable one such as /tmp, where no
// one else may rename or replace what is not theirs. The directory itself must be no link, and
// everything in it (its subdirectories too) a regular file or directory of root's or the daemon's
// uid, writable by no one else. A directory that does not exist yet passes when its nearest
// existing ancestor does: it is made 0700.
func checkDataDir(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	uid := uint32(os.Geteuid())
	if fi, err := os.Lstat(abs); err == nil {
		if fi.Mode()&fs.ModeSymlink != 0 {
			return untrusted(abs, "is a symbolic link", "name the directory itself")
		}
		if err := trusted(abs, fi, uid, false); err != nil {
			return err
		}
		if err := checkContents(abs, uid); err != nil {
			return err
		}
	} else if !os.IsNotExist(err) {
		return err
	}
	// Each existing ancestor, both as named (a directory holding a link on the way decides where
	// the link leads) and as the links resolve.
	real := filepath.Dir(abs)
	for {
		resolved, err := filepath.EvalSymlinks(real)
		if err == nil {
			real = resolved
			break
		}
		if !os.IsNotExist(err) || real == filepath.Dir(real) {
			return err
		}
		real = filepath.Dir(real)
	}
	for _, start := range []string{filepath.Dir(abs), real} {
		for p := start; ; p = filepath.Dir(p) {
			fi, err := os.Stat(p)
			if err != nil && !os.IsNotExist(err) {
				return err
			}
			if err == nil {
				if err := trusted(p, fi, uid, true); err != nil {
					return fmt.Errorf("%w (it holds the data directory %s)", err, abs)
				}
			}
			if p == filepath.Dir(p) {
				break
			}
		}
	}
	return nil
}

// checkContents applies trusted to everything below dir, refusing links and anything but regular
// files and directories.
func checkContents(dir string, uid uint32) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == dir {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			return untrusted(path, "is a symbolic link in the data directory", "remove it: the daemon never follows a link there")
		case !fi.Mode().IsRegular() && !fi.IsDir():
			return untrusted(path, "is neither a regular file nor a directory", "remove it")
		}
		return trusted(path, fi, uid, false)
	})
}

// trusted refuses fi, path's, when a user other than root and uid owns it or group or others may
// write it (a sticky directory's group and other write bits are allowed where sticky is).
func trusted(path string, fi fs.FileInfo, uid uint32, sticky bool) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner to check", path)
	}
	if st.Uid != 0 && st.Uid != uid {
		return untrusted(path, fmt.Sprintf("belongs to uid %d, not to root or uid %d (the daemon's)", st.Uid, uid),
			"give the daemon a directory of its own (a root daemon: /var/lib/cockpitfs)")
	}
	if fi.Mode().Perm()&0o022 != 0 && !(sticky && fi.IsDir() && fi.Mode()&fs.ModeSticky != 0) {
		return untrusted(path, fmt.Sprintf("is writable by its group or others (mode %04o)", fi.Mode().Perm()), "chmod go-w "+path)
	}
	return nil
}

func untrusted(path, why, fix string) error {
	return fmt.Errorf("refusing the data directory: %s %s; a daemon trusts no directory or file another user controls (fix: %s)", path, why, fix)
}
