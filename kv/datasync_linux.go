package kv

import (
	"os"

	"golang.org/x/sys/unix"
)

// datasync makes f's data durable; its timestamps, which every write to a mapped log changes,
// need not be.
func datasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
