package main

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	cfs "github.com/cockpitfs/cockpitfs/fs"
	"github.com/cockpitfs/cockpitfs/internal/fusefile"
)

// gcCommand drains the stale stacks of a mount through its gc file (docs/worktrees.md): the
// daemon judges and drains them, for this process's user.
func gcCommand(args []string) error {
	fset := newFlags("gc")
	dryRun := fset.Bool("dry-run", false, "")
	positional, err := parseInterspersed(fset, args)
	if err != nil {
		return err
	}
	if len(positional) > 1 {
		return &usageError{command: "gc", msg: "gc takes at most one MOUNTPOINT"}
	}
	mnt := defaultMount()
	if len(positional) == 1 {
		mnt = positional[0]
	}
	// A mountpoint no daemon serves holds only NOT-MOUNTED: say so, not that gc is missing.
	if mnt, err = resolveMountpoint(mnt); err != nil {
		return err
	}
	if typ, err := mountType(mnt); err != nil || typ != cfs.MountType {
		return notServed(mnt)
	}
	file := filepath.Join(mnt, "gc")
	listing, err := fusefile.ReadFile(file)
	if errors.Is(err, syscall.ENOTCONN) { // its daemon is gone
		return notServed(mnt)
	}
	if err != nil {
		return err
	}
	if *dryRun {
		_, err := os.Stdout.Write(listing)
		return err
	}
	drains := drainLines(listing)
	if len(drains) == 0 {
		return nil
	}
	// The daemon drains what is stale, and yours, when it reads the command: each stack's events
	// say what it did, and the list read again says which are drained.
	f, err := fusefile.OpenFile(file, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	w.WriteString("run\n")
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("gc: %w (each stack's events say why)", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("gc: %w (each stack's events say why)", err)
	}
	after, err := fusefile.ReadFile(file)
	if err != nil {
		return err
	}
	left := drainLines(after)
	for _, stack := range slices.Sorted(maps.Keys(drains)) {
		if _, still := left[stack]; !still {
			fmt.Println("drained " + strings.TrimPrefix(drains[stack], "drain "))
		}
	}
	return nil
}

// drainLines are the gc file's drain lines by stack ("app/stacks/x").
func drainLines(listing []byte) map[string]string {
	out := map[string]string{}
	for line := range strings.SplitSeq(string(listing), "\n") {
		if rest, ok := strings.CutPrefix(line, "drain "); ok {
			stack, _, _ := strings.Cut(rest, ":")
			out[stack] = line
		}
	}
	return out
}
