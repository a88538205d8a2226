// Command cockpitfs mounts the cockpitfs tree (SPEC §1): mount, unmount, verify, version.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `usage:
  cockpitfs mount [--data DIR] [--daemon] [--allow-other] [--debug] MOUNTPOINT
  cockpitfs unmount MOUNTPOINT
  cockpitfs verify [--data DIR]
  cockpitfs backup [--data DIR] FILE
  cockpitfs restore [--data DIR] [FILE]
  cockpitfs version
`

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "cockpitfs:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("see usage above")

func run(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return errUsage
	}
	switch args[0] {
	case "mount":
		return mountCommand(args[1:])
	case "unmount", "umount":
		if len(args) != 2 {
			fmt.Fprint(os.Stderr, usage)
			return errUsage
		}
		return unmount(args[1])
	case "verify":
		return verifyCommand(args[1:])
	case "backup":
		return backupCommand(args[1:])
	case "restore":
		return restoreCommand(args[1:])
	case "version", "--version":
		fmt.Println("cockpitfs", version)
		return nil
	default:
		fmt.Fprint(os.Stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}

// defaultDataDir is $XDG_STATE_HOME/cockpitfs, else ~/.local/state/cockpitfs.
func defaultDataDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "cockpitfs")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/"
	}
	return filepath.Join(home, ".local", "state", "cockpitfs")
}

func dataFlag(fs *flag.FlagSet) *string {
	return fs.String("data", defaultDataDir(), "the store's directory")
}

// parseInterspersed lets flags follow the mountpoint too (`mount MNT --daemon`).
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}
