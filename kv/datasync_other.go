//go:build !linux

package kv

import "os"

// datasync makes f's data durable (on macOS, os.File.Sync is F_FULLFSYNC).
func datasync(f *os.File) error { return f.Sync() }
