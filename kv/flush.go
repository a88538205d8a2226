package kv

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// A round makes its records durable with two device requests where the file system allows it:
// the pages written with O_DIRECT, which returns once the device has them, then a cache flush.
// An fdatasync of the segment itself costs a third on ext4 without a journal: that file system
// writes a file's inode at every fsync, and every write changes the segment's mtime. The flush
// needs no inode of the segment: any fsync on the same file system flushes the device's whole
// cache, and the segment's blocks and size were made durable when it was created.
//
// So on ext4, when the segment is written with direct I/O, the round fdatasyncs a clean regular
// file of the same file system instead, one whose inode lies in another block of the inode
// table than the segment's (a shared block, dirtied by the segment's mtime, would be written
// again). flushTarget picks it, or returns nil: the round then fdatasyncs the segment.
//
// Why this is durable: on ext4 a direct write into written extents inside the file's size goes
// to the device before pwrite returns (where ext4 cannot write directly, as under data=journal,
// statx reports no direct-I/O alignment and flushTarget declines), and a cache flush makes every
// write the device completed before it durable. Nothing else is needed to read the record back.
const flushFileName = "walflush"

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
		sx.Dio_mem_align == 0 || sx.Dio_mem_align > pageSize {
		return nil
	}
	// The most inodes a block of the table can hold (the smallest inode is 128 bytes).
	perBlock := uint64(fs.Bsize) / 128
	for _, candidate := range flushCandidates(dir) {
		f, err := os.Open(candidate)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG &&
			st.Dev == unix.Mkdev(sx.Dev_major, sx.Dev_minor) && (st.Ino-1)/perBlock != (sx.Ino-1)/perBlock {
			return f
		}
		f.Close()
	}
	return nil
}

// flushCandidates are clean files that may serve: one of the store's own, never written, and
// this program's executable, whose inode is usually far from the store's.
func flushCandidates(dir string) []string {
	own := filepath.Join(dir, flushFileName)
	if f, err := os.OpenFile(own, os.O_CREATE|os.O_RDONLY, 0o600); err == nil {
		f.Close()
	}
	candidates := []string{own}
	if exe, err := os.Executable(); err == nil {
		candidates = append(candidates, exe)
	}
	return candidates
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
