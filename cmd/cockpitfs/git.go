package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/internal/shell"
)

// hookMark is the line that makes a post-checkout hook cockpitfs's own: one it may rewrite.
const hookMark = "# cockpitfs post-checkout hook"

// gitCommand is `cockpitfs git install-hook`.
func gitCommand(args []string) error {
	if len(args) == 0 || args[0] != "install-hook" {
		return &usageError{command: "git", msg: "git takes install-hook"}
	}
	fset := newFlags("git")
	cockpit := fset.String("cockpit", "", "")
	mount := fset.String("mount", defaultMount(), "")
	force := fset.Bool("force", false, "")
	positional, err := parseInterspersed(fset, args[1:])
	if err != nil {
		return err
	}
	if len(positional) > 1 {
		return &usageError{command: "git", msg: "install-hook takes at most one REPO"}
	}
	if *cockpit == "" {
		return &usageError{command: "git", msg: "install-hook needs --cockpit NAME"}
	}
	// A hook for a name no cockpit can have would never claim: refused now, not at each checkout.
	if !engine.ValidCockpitName(*cockpit) {
		return &usageError{command: "git", msg: fmt.Sprintf("--cockpit %s is not a cockpit name: %s", engine.Printable(*cockpit), engine.CockpitNameRule)}
	}
	repo := "."
	if len(positional) == 1 {
		repo = positional[0]
	}
	mnt, err := filepath.Abs(*mount)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	out, err := exec.Command("git", "-C", repo, "rev-parse", "--path-format=absolute", "--git-path", "hooks/post-checkout").Output()
	if err != nil {
		return fmt.Errorf("%s is not a git repository (git rev-parse: %v)", repo, err)
	}
	hook := strings.TrimSpace(string(out))
	text := postCheckoutHook(mnt, *cockpit, self)
	existing, err := os.ReadFile(hook)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case bytes.Equal(existing, []byte(text)):
		fmt.Printf("%s: already installed\n", hook)
		return nil
	case !bytes.Contains(existing, []byte(hookMark)):
		if !*force {
			return fmt.Errorf("%s is a hook cockpitfs did not write: left as it is (--force keeps it as %s.local, run first)", hook, filepath.Base(hook))
		}
		if err := os.Rename(hook, hook+".local"); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(hook), 0o755); err != nil {
		return err
	}
	// Written beside it and renamed over it: git never runs half a hook.
	tmp := hook + ".cockpitfs-new"
	if err := os.WriteFile(tmp, []byte(text), 0o755); err != nil {
		return err
	}
	if err := os.Rename(tmp, hook); err != nil {
		os.Remove(tmp)
		return err
	}
	fmt.Printf("%s: installed (cockpit %s on %s)\n", hook, *cockpit, mnt)
	warnNoCockpit(mnt, *cockpit)
	return nil
}

// warnNoCockpit says on stderr when the hook's cockpit is not there now (a typo in --cockpit, a
// --mount left to its default, no daemon serving the mount): the hook is kept, since the daemon
// may start later, but each checkout would only say it could not claim.
func warnNoCockpit(mnt, cockpit string) {
	if fi, err := os.Stat(filepath.Join(mnt, cockpit)); err == nil && fi.IsDir() {
		return
	}
	why := fmt.Sprintf("no cockpit %s in %s (mkdir %s first)", cockpit, mnt, filepath.Join(mnt, cockpit))
	if _, err := os.Stat(filepath.Join(mnt, "status")); err != nil {
		why = fmt.Sprintf("no daemon serves %s (cockpitfs mount %s, or give the mount with --mount DIR)", mnt, mnt)
	}
	fmt.Fprintf(os.Stderr, "cockpitfs: warning: %s: new worktrees are not claimed until it is there\n", why)
}

// postCheckoutHook is the hook's text. git runs post-checkout with the previous HEAD, the new
// HEAD and a flag; a new worktree's checkout (git worktree add) has no previous HEAD: the null
// object id, all zeros. The hook claims that worktree's stack for a pid-less holder whose
// checkout is the worktree, and never fails the git command: a claim refused (no mount, no
// cockpit) is reported on stderr, and the stack's events say why. It makes the stack's directory
// alone (not mkdir -p): a missing cockpit is not made, nor anything in a mountpoint no daemon
// serves, which root's writes would pass.
func postCheckoutHook(mnt, cockpit, self string) string {
	return `#!/bin/sh
` + hookMark + ` (cockpitfs git install-hook): claims each new worktree's stack.
if [ -x "$0.local" ]; then "$0.local" "$@" || exit $?; fi
case "$1" in *[!0]*) exit 0 ;; esac
M=` + shell.Quote(mnt) + `
COCKPIT=` + shell.Quote(cockpit) + `
COCKPITFS=` + shell.Quote(self) + `
[ -x "$COCKPITFS" ] || COCKPITFS=cockpitfs
top=$(pwd -P)
S="$M/$COCKPIT/stacks/$("$COCKPITFS" name stack)" &&
	H=$("$COCKPITFS" name holder) &&
	{ [ -d "$S" ] || mkdir "$S"; } && echo "pid=none checkout=$top" > "$S/holders/$H" ||
	echo "cockpitfs: could not claim $S for $top (see $M/$COCKPIT/events and $S/events)" >&2
exit 0
`
}
