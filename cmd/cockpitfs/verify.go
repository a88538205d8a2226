package main

import (
	"flag"
	"fmt"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/portlock"
)

// verifyCommand checks the store's files and every record offline, changing nothing; it exits
// non-zero naming each damaged file or violation.
func verifyCommand(args []string) error {
	fset := flag.NewFlagSet("verify", flag.ContinueOnError)
	data := dataFlag(fset)
	if err := fset.Parse(args); err != nil {
		return err
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
	for _, v := range violations {
		fmt.Println(v)
	}
	if len(violations) > 0 {
		return fmt.Errorf("%d violations in %d records", len(violations), checked)
	}
	fmt.Printf("%d records clean\n", checked)
	return nil
}
