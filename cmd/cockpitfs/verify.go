package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/portlock"
)

// verifyCommand checks the store's files and every record offline, changing nothing; it exits
// non-zero naming each damaged file or violation.
func verifyCommand(args []string) error {
	fset := newFlags("verify")
	data := dataFlag(fset)
	sf := addStoreFlags(fset)
	positional, err := parseInterspersed(fset, args)
	if err != nil {
		return err
	}
	if len(positional) != 0 {
		return &usageError{command: "verify", msg: fmt.Sprintf("unexpected argument %q (the store is --data DIR)", positional[0])}
	}
	etcdCfg, isEtcd, err := sf.etcd()
	if err != nil {
		return storeError("verify", err)
	}
	if isEtcd {
		return team.verify(etcdCfg, *sf.store, *data)
	}
	// Refused before the store is opened, which would create what is missing.
	if err := isStore(*data); err != nil {
		fmt.Fprintln(os.Stderr, "cockpitfs: verify:", err)
		return &exitError{code: 2}
	}
	db, err := openOffline(*data)
	if err != nil {
		return err
	}
	defer db.Close()
	violations, checked, err := engine.Verify(db)
	if err != nil {
		return err
	}
	held, err := engine.VerifyHolds(db, portlock.Machine)
	if err != nil {
		return err
	}
	violations = append(violations, held...)
	return report(violations, checked)
}

// report prints each violation, or that the records are clean.
func report(violations []string, checked int) error {
	for _, v := range violations {
		fmt.Println(v)
	}
	if len(violations) > 0 {
		return fmt.Errorf("%s in %s", plural(len(violations), "violation"), plural(checked, "record"))
	}
	fmt.Println(plural(checked, "record"), "clean")
	return nil
}

// isStore says why dir is not a cockpitfs store, if it is not one. A directory holding any of the
// store's files is one, damaged or not: opening it says which.
func isStore(dir string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%s does not exist (give the store with --data DIR)", dir)
	case err != nil:
		return err
	case !st.IsDir():
		return fmt.Errorf("%s is not a directory (give the store with --data DIR)", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		switch n := e.Name(); {
		case n == "MANIFEST", n == "cockpitfs.lock", strings.HasSuffix(n, ".sst"), strings.HasSuffix(n, ".vlog"), strings.HasSuffix(n, ".mem"):
			return nil
		}
	}
	return fmt.Errorf("%s holds no cockpitfs store (give the store with --data DIR)", dir)
}
