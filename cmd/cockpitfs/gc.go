package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	file := filepath.Join(mnt, "gc")
	listing, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if *dryRun {
		_, err := os.Stdout.Write(listing)
		return err
	}
	var drains []string
	for line := range strings.SplitSeq(string(listing), "\n") {
		if strings.HasPrefix(line, "drain ") {
			drains = append(drains, line)
		}
	}
	if len(drains) == 0 {
		return nil
	}
	// The daemon drains what is stale when it reads the command, which may be less (claimed
	// again) or more than the listing: each stack's events say what it did.
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
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
	for _, line := range drains {
		fmt.Println(strings.Replace(line, "drain ", "drained ", 1))
	}
	return nil
}
