package kv

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A round makes its records durable with two device requests where the file system allows it:
// the pages written with O_DIRECT, which returns once the device has them, then a cache flush.
// On ext4 without a journal (this project's benchmark disk) an fdatasync of the segment itself
// costs a third: there, every fsync writes the file's inode when it is dirty, and every write
// changes the segment's mtime. (With a journal, an fdatasync commits nothing for a changed mtime:
// it already is the data and a flush.) The flush needs no inode of the segment: any fsync on the
// file system flushes the device's whole cache, and the segment's blocks and size were made
// durable when it was created.
//
// So there, when the segment is written with direct I/O, the round fdatasyncs a directory of the
// same file system instead, one whose inode lies in another block of the inode table than the
// segment's (a shared block, dirtied by the segment's mtime, would be written again): an
// ancestor of the data directory, or the data directory. flushTarget picks it, or returns nil:
// the round then fdatasyncs the segment. A directory written to since its last fsync (an entry added or removed)
// costs that round its blocks: never wrong, rarely slower.
//
// Why this is durable: on ext4 a direct write into written extents inside the file's size goes to
// the device before pwrite returns (where ext4 cannot write directly, as under data=journal,
// statx reports no direct-I/O alignment and flushTarget declines), and a cache flush makes every
// write the device completed before it durable. Nothing else is needed to read the record back.

// flushTarget returns the file whose fdatasync flushes the device for seg's rounds, or nil.
func flushTarget(dir string, seg *segment) *os.File {
	if !seg.direct {
		return nil
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(seg.file.Fd()), &fs); err != nil || fs.Type != unix.EXT4_SUPER_MAGIC {
		return nil
	}
	var sx unix.Statx_t
	if err := unix.Statx(int(seg.file.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN|unix.STATX_INO, &sx); err != nil ||
		sx.Mask&unix.STATX_DIOALIGN == 0 || sx.Dio_offset_align == 0 || sx.Dio_offset_align > pageSize ||
		sx.Dio_mem_align == 0 || sx.Dio_mem_align > pageSize || hasJournal(sx.Dev_major, sx.Dev_minor) {
		return nil
	}
	// Inodes a block of the table holds at ext4's default inode size, 256 bytes. (Should they be
	// 128, two inodes told apart here may share a block: one more write, never a wrong one.)
	perBlock := uint64(fs.Bsize) / 256
	for _, candidate := range flushCandidates(dir) {
		f, err := os.Open(candidate)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err == nil && st.Dev == unix.Mkdev(sx.Dev_major, sx.Dev_minor) &&
			(st.Ino-1)/perBlock != (sx.Ino-1)/perBlock {
			return f
		}
		f.Close()
	}
	return nil
}

// flushCandidates are the directories whose fsync may flush for the log in dir, the quietest
// first: its ancestors from the top down, then dir, to which badger adds files. An fsync writes
// the block of the inode table holding the file's inode whenever any of the inodes in that block
// changed, so what makes a candidate quiet is its neighbours. The top of the file system comes
// first: its root's inode shares a block with the file system's reserved inodes and the first
// directories made on it, which rarely change. A nearer ancestor shares its block with whatever
// was made beside it: in the benchmark, the peer's directory, changed by every peer commit, made
// every round write that block too, three device requests instead of two. (Ancestors on another
// file system are skipped by flushTarget.)
func flushCandidates(dir string) []string {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	var out []string
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		out = append(out, d)
		if d == filepath.Dir(d) {
			slices.Reverse(out)
			return append(out, dir)
		}
	}
}

// hasJournal says whether the ext4 file system on device major:minor has a journal, or whether
// that cannot be told (sysfs names the journal's thread, or "<none>").
func hasJournal(major, minor uint32) bool {
	dev, err := filepath.EvalSymlinks(fmt.Sprintf("/sys/dev/block/%d:%d", major, minor))
	if err != nil {
		return true
	}
	task, err := os.ReadFile(filepath.Join("/sys/fs/ext4", filepath.Base(dev), "journal_task"))
	return err != nil || strings.TrimSpace(string(task)) != "<none>"
}

// syncRound makes a round's writes durable: one fdatasync of a flush target if every segment
// written has one, else an fdatasync of each segment.
func syncRound(writes []pageWrite) error {
	if len(writes) == 0 {
		return nil
	}
	for _, w := range writes {
		if w.seg.flush == nil {
			for _, w := range writes {
				if err := datasync(w.seg.file); err != nil {
					return fmt.Errorf("kv: sync the log: %w", err)
				}
			}
			return nil
		}
	}
	if err := datasync(writes[0].seg.flush); err != nil {
		return fmt.Errorf("kv: flush the log's device: %w", err)
	}
	return nil
}
