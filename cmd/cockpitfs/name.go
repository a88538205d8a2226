package main

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"github.com/cockpitfs/cockpitfs/engine"
)

// nameCommand prints the stack of a checkout or the holder name of a user: engine's one mapping
// from any folder or user name to a valid name, for Makefiles, hooks and scripts.
func nameCommand(args []string) error {
	if len(args) == 0 || len(args) > 2 {
		return &usageError{command: "name", msg: "name takes stack [DIR] or holder [USER]"}
	}
	switch args[0] {
	case "stack":
		dir := "."
		if len(args) == 2 {
			dir = args[1]
		}
		abs, err := filepath.Abs(dir)
		if err != nil {
			return err
		}
		fmt.Println(engine.StackNameFor(abs))
	case "holder":
		name := currentUserName()
		if len(args) == 2 {
			name = args[1]
		}
		fmt.Println(engine.NameFor(name))
	default:
		return &usageError{command: "name", msg: fmt.Sprintf("name %q: want stack or holder", args[0])}
	}
	return nil
}

// currentUserName is this process's user's name: USER, else (it is unset under cron and in
// many containers) the user database's, else its uid. A holder's name is a label, not who owns
// it: the daemon records the caller's uid.
func currentUserName() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return strconv.Itoa(os.Getuid())
}
