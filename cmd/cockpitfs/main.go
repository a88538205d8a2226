// Command cockpitfs mounts the cockpitfs tree (docs/spec.md §1): mount, unmount, verify, backup,
// restore, exec, mcp, name, gc, git, completion, version, help.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/probe"
)

// command is one subcommand: its usage text and what it does with its arguments.
type command struct {
	usage string // first line: the synopsis; the rest: what it does and its flags
	run   func(args []string) error
}

// commands is filled in init: completion and help read it.
var commands map[string]command

func init() {
	commands = map[string]command{
		"mount": {`usage: cockpitfs mount [flags] MOUNTPOINT

Mount the cockpitfs tree on MOUNTPOINT and serve it until SIGINT, SIGTERM or SIGHUP (or
` + "`cockpitfs unmount`" + `). MOUNTPOINT is created if absent; while no daemon serves it, it is
read-only, so nothing is written beneath the mount by mistake.

flags:
  --data DIR         the store (default $XDG_STATE_HOME/cockpitfs, else ~/.local/state/cockpitfs)
  --daemon           serve in the background; return once serving, printing the pid and the
                     log file (DIR/cockpitfs.log)
  --allow-other      let every user use the mount (needs user_allow_other in /etc/fuse.conf
                     unless root)
  --nonempty         mount even over a directory that holds files (they are hidden meanwhile)
  --max-leases-per-uid N
                     the most active leases the claims of one user may hold, every cockpit
                     counted, so one user cannot take every free port family (default 8;
                     0: no bound); root and the daemon's own user are not bounded
  --max-cockpits-per-uid N
                     the most cockpits one user may have made, so one user cannot fill the
                     store and the daemon's memory (default 32; 0: no bound); root and the
                     daemon's own user are not bounded
  --max-stacks-per-uid N
                     the most stacks one user may have made, every cockpit counted (default
                     1024; 0: no bound); root and the daemon's own user are not bounded
  --max-open-bytes-per-uid N
                     the most bytes the open files and directories of one user may hold
                     (each open keeps the content it saw, each open directory its list of
                     names; opens of one content share it), so one user cannot
                     exhaust the daemon's memory (default 67108864; 0: no bound)
  --max-waits-per-uid N
                     the most reads one user may have waiting in wait files at once (each
                     holds the daemon's memory until something commits) (default 1024; 0: no
                     bound); root and the daemon's own user are not bounded
  --gc-interval D    how often stacks stale for their cockpit's [gc] grace are drained
                     (default 1m; 0: never; docs/worktrees.md)
  --log-level LEVEL  error, info (default) or debug (every FUSE request)
  --proxy PORT       also serve each stack's web entrypoints on loopback PORT as
                     http://<entrypoint>.<stack>.<cockpit>.localhost:PORT/ (docs/proxy.md)
  --proxy-https      serve the proxy with HTTPS, certificates signed by a local CA made in
                     DIR (proxy-ca.pem: trust it once, docs/proxy.md)
` + etcdFlagsUsage, mountCommand},
		"unmount": {`usage: cockpitfs unmount [--lazy] MOUNTPOINT

Unmount a cockpitfs mount and return once the daemon serving it has closed its store and
exited (at most 10 s), so verify, backup or restore may follow at once. A dead mount left by a
killed daemon ("transport endpoint is not connected") is detached. Also spelled umount.

A mount something still uses (files open or a cwd inside: fuser -vm MOUNTPOINT names them) is
refused, exit 1, unless --lazy.

flags:
  --lazy   detach a busy mount now; its daemon exits once nothing uses it any more
`, unmountCommand},
		"verify": {`usage: cockpitfs verify [--data DIR | --store etcd://… [ETCD FLAGS]]

Check every record and index entry of a stopped daemon's store (read-only). Exit 0: clean;
1: violations, each printed; 2: DIR is missing or holds no store. An etcd prefix may be
checked while daemons serve it: one consistent snapshot is read.

flags:
  --data DIR   the store (default $XDG_STATE_HOME/cockpitfs, else ~/.local/state/cockpitfs)
` + etcdFlagsUsage, verifyCommand},
		"migrate": {`usage: cockpitfs migrate [ETCD FLAGS] FROM TO

Copy every record of the store FROM into the empty store TO, then verify the copy. Each is a
data directory or etcd://HOST:PORT[,HOST:PORT…]/PREFIX: a laptop's store into a team's etcd
prefix, or back. Stop the daemons of both first (a data directory in use is refused; etcd
cannot tell). A store that is not empty is refused, and a copy that fails is removed.

flags (for the etcd side):
  --cacert FILE, --cert FILE, --key FILE, --user USER[:PASSWORD], --password PASSWORD
`, migrateCommand},
		"exec": {`usage: cockpitfs exec [--holder NAME] STACK_DIR -- COMMAND [ARG...]

Hold the stack at STACK_DIR (e.g. ~/cockpit/app/stacks/feature-x) for COMMAND's lifetime: claim
it with a holder whose pid is COMMAND's process, run COMMAND with the stack's env added to its
environment, and exit with its status. When COMMAND ends the holder is released, unless it is
the stack's last one (a running stack is stopped by a drain): then it stays, reading state=dead.

flags:
  --holder NAME   the holder's name (default exec-$USER)
`, execCommand},
		"mcp": {`usage: cockpitfs mcp [--mount DIR] [--dir DIR] [--cockpit NAME] [--holder NAME]

Serve the Model Context Protocol on standard input and output for one coding agent's session
(docs/agents.md): the agent host starts it, and the agent claims stacks, checks a port before
binding it, waits and drains through its tools, over the mount at DIR. The session's holders are
bound to this process: released when the host closes standard input (or sends SIGTERM), read dead
if it is killed. Its stack defaults to the checkout's it works from, as cockpitfs name stack names
it.

flags:
  --mount DIR      the cockpitfs mount (default $COCKPITFS_MOUNT, else ~/cockpit)
  --dir DIR        the checkout to work from (default: the working directory), for a host
                   that starts servers elsewhere: its stack is the default stack
  --cockpit NAME   the cockpit a call that names none means (default: each call names one)
  --holder NAME    the session's holder name (default mcp-$USER-<this process's pid>)
`, mcpCommand},
		"gc": {`usage: cockpitfs gc [--dry-run] [MOUNTPOINT]

Drain every stale stack of the mount (default $COCKPITFS_MOUNT, else ~/cockpit) that you may
drain (yours, your cockpits', all for root) now, without waiting for its cockpit's [gc] grace: a
stack is stale when every holder is dead or pid-less and every holder's checkout is gone. Each is
drained with ` + "`down`" + `, stopping what it still runs as you may (docs/worktrees.md). Prints
each stack drained; MOUNTPOINT/gc lists every stack with an active lease, drain or keep, and why.

flags:
  --dry-run   print that list and change nothing
`, gcCommand},
		"git": {`usage: cockpitfs git install-hook [--force] [--mount DIR] --cockpit NAME [REPO]

Install a post-checkout hook in the git repository REPO (default: the working directory's) that
claims each new worktree's stack (git worktree add) in cockpit NAME for a pid-less holder named
after your user, as cockpitfs name stack and name holder name them; gc drains it once the
worktree is removed (docs/worktrees.md). Running it again rewrites the hook; a post-checkout hook
cockpitfs did not write is refused unless --force, which keeps it as post-checkout.local and
runs it first.

flags:
  --cockpit NAME   the cockpit the stacks are in (required)
  --mount DIR      the cockpitfs mount (default $COCKPITFS_MOUNT, else ~/cockpit)
  --force          take the place of a post-checkout hook cockpitfs did not write
`, gitCommand},
		"name": {`usage: cockpitfs name stack [DIR] | holder [USER]

Print the stack name of the checkout at DIR (default: the working directory), or the holder name
of USER (default: this process's user), as exec and the README's Makefile choose them: any
character outside [A-Za-z0-9._-] (and a leading '.' or '-') becomes '_'; a stack's name ends in
'-' and 8 hex digits of its path's SHA-256, so checkouts whose folders share a name never share
a stack. (docs/tools.md, "Names from folders and users")
`, nameCommand},
		"backup": {`usage: cockpitfs backup [--data DIR] FILE

Write a backup of a stopped daemon's store to FILE. (A serving daemon keeps rolling backups of
its own in DIR/backups.)

flags:
  --data DIR   the store (default $XDG_STATE_HOME/cockpitfs, else ~/.local/state/cockpitfs)
`, backupCommand},
		"restore": {`usage: cockpitfs restore [--data DIR] [FILE]

Replace a stopped daemon's store by a backup (default: the newest rolling one, by the sequence
it holds), keeping the replaced store aside, and say what is lost. A restore that was killed
before it ended is finished by running restore again (mount and verify refuse the store until
then).

flags:
  --data DIR   the store (default $XDG_STATE_HOME/cockpitfs, else ~/.local/state/cockpitfs)
`, restoreCommand},
		"completion": {`usage: cockpitfs completion bash

Print a bash completion script for cockpitfs: source <(cockpitfs completion bash)
`, completionCommand},
		"version": {`usage: cockpitfs version

Print the module version, VCS revision and time this binary was built from.
`, versionCommand},
		"help": {`usage: cockpitfs help [COMMAND]

Print the usage of cockpitfs or of one command.
`, helpCommand},
	}
}

const programUsage = `usage: cockpitfs COMMAND [ARGS...]

cockpitfs mounts a filesystem through which stacks (copies of a development environment running
side by side) lease port families, record their holders and are drained. docs/spec.md in the
repository is the contract.

commands:
  mount MOUNTPOINT           mount and serve the tree
  unmount MOUNTPOINT         unmount it (the daemon exits)
  verify [--data DIR]        check a stopped daemon's store
  migrate FROM TO            copy a store into an empty one (data directory or etcd://…)
  backup [--data DIR] FILE   back a stopped daemon's store up
  restore [--data DIR] [FILE]  restore a stopped daemon's store
  exec STACK_DIR -- CMD...   hold a stack for CMD's lifetime, with its env
  mcp [--mount DIR]          serve the Model Context Protocol to a coding agent (stdio)
  name stack|holder          the stack name of a checkout, the holder name of a user
  gc [--dry-run] [MOUNTPOINT]  drain stale stacks (holders dead, checkouts gone) now
  git install-hook --cockpit NAME  claim each new git worktree's stack
  completion bash            print bash completion
  version                    print the build's version
  help [COMMAND]             print a command's usage (also: COMMAND --help)
`

// usageError is a command line that cannot be run: exit 2, the usage on stderr.
type usageError struct {
	command string
	msg     string
}

func (e *usageError) Error() string { return e.msg }

// exitError ends the program with a code of its own, having said what it had to say.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func main() {
	if probe.Child() { // the daemon's gc asking whether checkout paths exist
		os.Exit(probe.Serve(os.Stdin, os.Stdout))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes a command line and returns the exit status: 0, 1 for a failure, 2 for a usage
// error.
func run(args []string, stdout, stderr io.Writer) int {
	err := dispatch(args, stdout)
	var usage *usageError
	var exit *exitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errNoTeam):
		fmt.Fprintln(stderr, "cockpitfs:", err)
		return 2
	case errors.As(err, &usage):
		fmt.Fprintln(stderr, "cockpitfs:", usage.msg)
		fmt.Fprint(stderr, usageOf(usage.command))
		return 2
	case errors.As(err, &exit):
		return exit.code
	default:
		fmt.Fprintln(stderr, "cockpitfs:", err)
		return 1
	}
}

func usageOf(name string) string {
	if c, ok := commands[name]; ok {
		return c.usage
	}
	return programUsage
}

func dispatch(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return &usageError{msg: "no command given"}
	}
	name := args[0]
	switch name {
	case "-h", "--help", "-help":
		fmt.Fprint(stdout, programUsage)
		return nil
	case "--version":
		name = "version"
	case "umount":
		name = "unmount"
	case gateCommand:
		return execGate(args[1:])
	}
	c, ok := commands[name]
	if !ok {
		return &usageError{msg: fmt.Sprintf("unknown command %q", args[0])}
	}
	rest := args[1:]
	// Help is asked for before anything else, so `unmount --help` never touches a path.
	for _, a := range rest {
		if a == "--" {
			break
		}
		if a == "-h" || a == "--help" || a == "-help" {
			fmt.Fprint(stdout, c.usage)
			return nil
		}
	}
	return c.run(rest)
}

func helpCommand(args []string) error {
	switch len(args) {
	case 0:
		fmt.Print(programUsage)
		return nil
	case 1:
		if _, ok := commands[args[0]]; !ok {
			return &usageError{command: "help", msg: fmt.Sprintf("unknown command %q", args[0])}
		}
		fmt.Print(usageOf(args[0]))
		return nil
	}
	return &usageError{command: "help", msg: "help takes at most one command"}
}

func versionCommand(args []string) error {
	if len(args) != 0 {
		return &usageError{command: "version", msg: "version takes no arguments"}
	}
	mode := "with team mode (etcd)"
	if team == nil {
		mode = "without team mode (etcd: build with -tags team)"
	}
	fmt.Println(buildVersion() + ", " + mode)
	return nil
}

// buildVersion describes the build from what the go command recorded in the binary: the module
// version, and for a build from a checkout the VCS revision, its time and whether the tree had
// uncommitted changes.
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "cockpitfs (no build information)"
	}
	s := "cockpitfs " + info.Main.Version
	settings := map[string]string{}
	for _, kv := range info.Settings {
		settings[kv.Key] = kv.Value
	}
	var vcs []string
	if r := settings["vcs.revision"]; r != "" {
		vcs = append(vcs, "revision "+r)
	}
	if t := settings["vcs.time"]; t != "" {
		vcs = append(vcs, "committed "+t)
	}
	if settings["vcs.modified"] == "true" {
		vcs = append(vcs, "with uncommitted changes")
	}
	if len(vcs) > 0 {
		s += " (" + strings.Join(vcs, ", ") + ")"
	}
	return s + " " + info.GoVersion
}

// defaultDataDir is $XDG_STATE_HOME/cockpitfs, else ~/.local/state/cockpitfs.
func defaultDataDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "cockpitfs")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		// HOME unset (cron, some containers): the account's home, which a login would set.
		home = "/"
		if u, err := user.Current(); err == nil && u.HomeDir != "" {
			home = u.HomeDir
		}
	}
	return filepath.Join(home, ".local", "state", "cockpitfs")
}

// newFlags makes a command's flag set; errors come back to run, which prints the usage.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func dataFlag(fs *flag.FlagSet) *string {
	return fs.String("data", defaultDataDir(), "the store's directory")
}

// parseInterspersed lets flags follow positional arguments too (`mount MNT --daemon`); after
// "--" everything is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			msg := err.Error()
			// The flag package names a flag with one dash; every flag here is written with two.
			if name, unknown := strings.CutPrefix(msg, "flag provided but not defined: -"); unknown {
				msg = "unknown flag --" + strings.TrimPrefix(name, "-")
			}
			msg = flagError(fs, msg)
			return nil, &usageError{command: fs.Name(), msg: msg}
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// flagError rewrites the flag package's other complaints (`invalid value "5" for flag
// -gc-interval: parse error`, `flag needs an argument: -cockpit`) with the flag as it is written
// here, two dashes, and, for a duration or a number, what the value should look like.
func flagError(fs *flag.FlagSet, msg string) string {
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return "--" + strings.TrimPrefix(name, "-") + " needs a value"
	}
	var value, name string
	if n, _ := fmt.Sscanf(msg, "invalid value %q for flag -%s", &value, &name); n == 2 {
		name = strings.TrimSuffix(name, ":")
	} else if n, _ := fmt.Sscanf(msg, "invalid boolean value %q for -%s", &value, &name); n == 2 {
		return fmt.Sprintf("--%s takes no value, or true or false: %q", strings.TrimSuffix(name, ":"), value)
	} else {
		return msg
	}
	want := "a valid value"
	if f := fs.Lookup(name); f != nil {
		if g, ok := f.Value.(flag.Getter); ok {
			switch g.Get().(type) {
			case time.Duration:
				want = "a duration (e.g. 30s, 1m, 2h)"
			case int, int64, uint, uint64:
				want = "a whole number"
			}
		}
	}
	return fmt.Sprintf("--%s %q is not %s", name, value, want)
}

// flagNames lists a command's flags as --name, for completion: those its usage's flag lines begin
// with, each line naming one or more (`--cert FILE, --key FILE`) before its description.
func flagNames(name string) []string {
	names := []string{"--help"}
	for _, line := range strings.Split(usageOf(name), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "--") {
			continue
		}
		synopsis, _, _ := strings.Cut(line, "  ")
		for _, flag := range strings.Split(synopsis, ", ") {
			if f := strings.Fields(flag); len(f) > 0 && strings.HasPrefix(f[0], "--") && !slices.Contains(names, f[0]) {
				names = append(names, f[0])
			}
		}
	}
	sort.Strings(names)
	return names
}

// plural is "1 record" or "n records".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// etcdFlagsUsage is the help of the flags mount and verify share for an etcd store.
const etcdFlagsUsage = `  --store etcd://HOST:PORT[,HOST:PORT…]/PREFIX
                     share the namespace with every daemon mounting PREFIX of that etcd
                     cluster instead of --data (docs/teams.md; a build with -tags team);
                     with etcdctl's flags:
  --cacert FILE      verify the members' certificates with this CA bundle
  --cert FILE, --key FILE
                     the client certificate and its key
  --user USER[:PASSWORD], --password PASSWORD
                     etcd authentication
  --command-timeout DURATION
                     how long an operation waits for an etcd quorum, and retries
                     conflicts, before it refuses with EAGAIN (default 2s)
`
