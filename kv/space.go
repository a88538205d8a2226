package kv

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/storage"
)

// freeReserve is the free space below which Update refuses before committing. badger writes its
// memtable log through a memory map of a sparse file: a page first touched when the disk is full
// is not an error but SIGBUS, which kills the daemon. Refusing while room remains for a new
// memtable log (8 MiB, allocated at the next checkpoint), a flushed table (≤ 4 MiB), the manifest
// and the write-ahead log's next segment (4 MiB, written whole before it is used) keeps badger off
// that edge; reads need no space and go on.
const freeReserve = 24 << 20

// checkSpace refuses with storage.ErrNoSpace when the file system of dir, which f is a file of,
// has less than freeReserve available. It asks through f: a statfs by path walks the path, and a
// commit after the daemon idled paid 25 µs for that walk where fstatfs costs 7 (p50 on 2 vCPUs).
func checkSpace(f *os.File, dir string) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("kv: fstatfs %s: %w", dir, err)
	}
	if free := st.Bavail * uint64(st.Bsize); free < freeReserve {
		return fmt.Errorf("kv: %s has %d KiB free, less than the %d MiB a commit needs to be safe: %w",
			dir, free>>10, freeReserve>>20, storage.ErrNoSpace)
	}
	return nil
}

// allocate gives a sparse memory-mapped file its blocks, so badger's writes through the map
// never meet a full disk. A file already allocated costs one quick call.
func allocate(f *os.File) error {
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, info.Size()); err != nil && err != unix.EOPNOTSUPP {
		return fmt.Errorf("kv: allocate %s: %w", f.Name(), err)
	}
	return nil
}
