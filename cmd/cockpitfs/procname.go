package main

import (
	"os"
	"path/filepath"
	"strings"
)

// This program starts itself again through /proc/self/exe (the background daemon, the gc probe's
// child, exec's gate), which the kernel names after the link: `exe`, so `pgrep cockpitfs`, `top`
// and `ps -o comm` would not find the daemon. Such a process takes the name of the command it
// was started as: its argv[0], which each of those starts sets to ours. (/proc/self/comm is the
// process's main thread's, which any of its threads may name; the kernel keeps 15 bytes.)
func init() {
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil || strings.TrimSpace(string(comm)) != "exe" {
		return
	}
	if name := filepath.Base(os.Args[0]); name != "exe" && name != "." && name != "/" {
		os.WriteFile("/proc/self/comm", []byte(name), 0)
	}
}
