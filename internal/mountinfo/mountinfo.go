// Package mountinfo reads what /proc/self/mountinfo says of a mount point. Reading it never
// touches the path, which a dead FUSE mount answers with ENOTCONN.
package mountinfo

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/cockpitfs/cockpitfs/internal/shell"
)

// Info is one line of /proc/self/mountinfo.
type Info struct {
	ID, Parent string // the mount's id and its parent's
	Minor      string // of its device: a FUSE mount's connection number
	Type       string // e.g. fuse.cockpitfs; "" for no mount
	Options    string // the superblock's: a FUSE mount's user_id=N…
}

// Of reads the visible (last) mount on dir; its Type is "" when dir is not a mount point.
func Of(dir string) (Info, error) {
	var m Info
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		if unescape(fields[4]) == dir {
			m = Info{ID: fields[0], Parent: fields[1], Type: fields[sep+1]}
			_, m.Minor, _ = strings.Cut(fields[2], ":")
			if sep+3 < len(fields) {
				m.Options = fields[sep+3]
			}
		}
	}
	return m, nil
}

// unescape undoes the octal escapes (\040 for a space) of mountinfo paths.
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if c, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(c))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// NotMountedNote is the file a daemon leaves in its mountpoint, seen only while no daemon serves
// there, saying why the directory refuses writes and which command starts that daemon again.
const NotMountedNote = "NOT-MOUNTED"

// RestartNeedsNote is what a "start one: cockpitfs mount --daemon MNT" fix adds where a stopped
// daemon left its note in mnt: without that daemon's --data (and --allow-other, --store …) the
// command starts one on another store, an empty namespace, and the note names them. "" where
// there is none (a bare directory). A killed daemon's dead mount hides its note: the fix says
// how to see it, as the bare command would serve the default store.
func RestartNeedsNote(mnt string) string {
	note := filepath.Join(mnt, NotMountedNote)
	fi, err := os.Lstat(note)
	if errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED) {
		return ", with the --data and flags of the daemon that served it, which died: `cockpitfs unmount " + shell.Quote(mnt) +
			"` detaches its dead mount, and " + note + " beneath it then names them"
	}
	if err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	return ", with the --data and flags of the daemon that served it (" + note + " names them)"
}
