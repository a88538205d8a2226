package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/internal/fusefile"
	"github.com/cockpitfs/cockpitfs/internal/mountinfo"
)

// execCommand holds a stack for a command's lifetime (docs/spec.md §4, "Holding a stack for a
// command").
func execCommand(args []string) error {
	sep := -1
	for i, a := range args {
		if a == "--" {
			sep = i
			break
		}
	}
	if sep < 0 || sep == len(args)-1 {
		return &usageError{command: "exec", msg: "exec needs -- and the command to run after it"}
	}
	fset := newFlags("exec")
	holder := fset.String("holder", defaultHolderName(), "")
	positional, err := parseInterspersed(fset, args[:sep])
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return &usageError{command: "exec", msg: "exec takes one STACK_DIR before --"}
	}
	// The name is joined to the stack's holders/: one with a slash or a dot-dot would name a
	// file elsewhere, which exec would create, write and remove.
	if !engine.ValidName(*holder) {
		return &usageError{command: "exec", msg: fmt.Sprintf("--holder %s is not a holder name: %s", engine.Printable(*holder), engine.NameRule)}
	}
	stack, err := filepath.Abs(positional[0])
	if err != nil {
		return err
	}
	if st, err := os.Stat(filepath.Join(stack, "holders")); err != nil || !st.IsDir() {
		// MOUNTPOINT/COCKPIT/stacks/STACK on a mountpoint no daemon serves, or whose daemon is
		// gone (ENOTCONN): say that.
		mnt := filepath.Dir(filepath.Dir(filepath.Dir(stack)))
		if note, nerr := os.Lstat(filepath.Join(mnt, mountinfo.NotMountedNote)); errors.Is(err, syscall.ENOTCONN) || nerr == nil && note.Mode().IsRegular() {
			return notServed(mnt)
		}
		// A stack not made yet in a cockpit that exists (a fresh worktree's): exec makes none.
		if errors.Is(err, fs.ErrNotExist) && filepath.Base(filepath.Dir(stack)) == "stacks" {
			if st, serr := os.Stat(filepath.Dir(stack)); serr == nil && st.IsDir() {
				return fmt.Errorf("%s is not a stack's directory: there is no stack %s yet (exec makes none): mkdir %s first", stack, filepath.Base(stack), stack)
			}
		}
		return fmt.Errorf("%s is not a stack's directory (it has no holders/): give one like MOUNTPOINT/COCKPIT/stacks/STACK", stack)
	}
	// A command that cannot start is refused before anything is claimed: no holder, no lease.
	path, err := exec.LookPath(args[sep+1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "cockpitfs: exec:", err, "(nothing was claimed)")
		return &exitError{code: 127}
	}
	holderPath := filepath.Join(stack, "holders", *holder)
	if err := claimForExec(stack, holderPath); err != nil {
		return err
	}
	env, err := readEnv(filepath.Join(stack, "env"))
	if err != nil {
		return err
	}
	// SIGINT and SIGQUIT from a terminal reach the whole foreground process group, the command
	// included: passing them on would deliver them twice. They are caught and dropped, not
	// ignored: an ignored signal stays ignored in the command, and Ctrl-C would not stop it.
	// SIGTERM and SIGHUP are sent to this process alone.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGQUIT)
	forward := make(chan os.Signal, 4)
	signal.Notify(forward, syscall.SIGTERM, syscall.SIGHUP)

	cmd, gate, err := startGated(path, args[sep+1:], append(os.Environ(), env...))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cockpitfs: exec:", err)
		releaseAfterExec(holderPath)
		return &exitError{code: 127}
	}
	// The holder lives as long as the command itself from now on, and says so before the
	// command runs.
	if err := fusefile.WriteFile(holderPath, []byte("pid="+strconv.Itoa(cmd.Process.Pid)+"\n"), 0); err != nil {
		fmt.Fprintf(os.Stderr, "cockpitfs: exec: %s keeps this process's pid: %v\n", holderPath, mountGone(holderPath, err))
	}
	gate.Close()
	go func() {
		for s := range forward {
			cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	signal.Stop(forward)
	releaseAfterExec(holderPath)
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return &exitError{code: 128 + int(ws.Signal())}
		}
		return &exitError{code: exit.ExitCode()}
	}
	return err
}

// gateCommand is the hidden command startGated runs: this binary again, which waits until exec
// has written its pid to the holder and then becomes the command (execve keeps the pid).
const gateCommand = "__exec-gate"

// startGated starts argv (its program at path) with env as a process that runs it only once gate
// is closed, so the command never runs, nor reads its holder, before the holder names its pid.
func startGated(path string, argv, env []string) (cmd *exec.Cmd, gate *os.File, err error) {
	wait, gate, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	defer wait.Close()
	// This very binary, even if it was replaced or removed since it started.
	cmd = exec.Command("/proc/self/exe", append([]string{gateCommand, path}, argv...)...)
	cmd.Args[0] = os.Args[0] // its name until it runs argv
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{wait} // fd 3
	if err := cmd.Start(); err != nil {
		gate.Close()
		return nil, nil, err
	}
	return cmd, gate, nil
}

// execGate is the gated process: it waits for its gate (fd 3) to close, then executes path with
// argv in its place. The exec fails only as the command's own start would (exit 126, as a shell).
func execGate(args []string) error {
	if len(args) < 2 {
		return &usageError{msg: "the exec gate is cockpitfs exec's own"}
	}
	wait := os.NewFile(3, "exec gate")
	io.Copy(io.Discard, wait)
	wait.Close()
	err := syscall.Exec(args[0], args[1:], os.Environ())
	fmt.Fprintf(os.Stderr, "cockpitfs: exec: %s: %v\n", args[1], err)
	return &exitError{code: 126}
}

// defaultHolderName is exec-<user>, as engine.NameFor maps it.
func defaultHolderName() string {
	return engine.NameFor("exec-" + currentUserName())
}

// claimForExec creates the holder bound to this process (the command's pid follows once it
// runs). An existing holder of that name is taken over only when its process is gone.
func claimForExec(stack, holderPath string) error {
	self := []byte("pid=" + strconv.Itoa(os.Getpid()) + "\n")
	f, err := fusefile.OpenFile(holderPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, os.ErrExist) {
		state, pid := holderState(holderPath)
		if state == "live" {
			return fmt.Errorf("%s is held by the live process %s: choose another name with --holder", holderPath, pid)
		}
		f, err = fusefile.OpenFile(holderPath, os.O_WRONLY, 0)
	}
	if err != nil {
		return claimError(stack, err)
	}
	_, err = f.Write(self)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return claimError(stack, err)
	}
	return nil
}

// claimError adds the refusal's message and fix from the stack's events file to the errno.
func claimError(stack string, err error) error {
	data, rerr := fusefile.ReadFile(filepath.Join(stack, "events"))
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if rerr != nil || len(lines) == 0 {
		return fmt.Errorf("claim: %w", err)
	}
	last := lines[len(lines)-1]
	msg, fix := jsonField(last, "message"), jsonField(last, "fix")
	if msg == "" {
		return fmt.Errorf("claim: %w", err)
	}
	return fmt.Errorf("claim: %w: %s (fix: %s)", err, msg, fix)
}

// jsonField extracts a string field of an events line without decoding the whole line.
func jsonField(line, key string) string {
	m := regexp.MustCompile(`"` + key + `":"((?:[^"\\]|\\.)*)"`).FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	s, err := strconv.Unquote(`"` + m[1] + `"`)
	if err != nil {
		return m[1]
	}
	return s
}

// holderState reads state= and pid= of a holder file.
func holderState(path string) (state, pid string) {
	data, err := fusefile.ReadFile(path)
	if err != nil {
		return "", ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "state="); ok {
			state = v
		}
		if v, ok := strings.CutPrefix(line, "pid="); ok {
			pid = v
		}
	}
	return state, pid
}

// releaseAfterExec releases the holder; the stack's last holder is refused release (a running
// stack is stopped by a drain) and stays, reading dead.
func releaseAfterExec(holderPath string) {
	err := os.Remove(holderPath)
	if errors.Is(err, syscall.EBUSY) {
		fmt.Fprintf(os.Stderr, "cockpitfs: exec: %s stays, the stack's last holder (dead now): drain the stack to stop it, or claim it again\n", holderPath)
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cockpitfs: exec: release:", mountGone(holderPath, err))
	}
}

// mountGone says so when err came of the mount having gone away under path (unmounted: the
// name is missing from the bare mountpoint; its daemon killed: ENOTCONN), instead of the bare
// "no such file or directory".
func mountGone(path string, err error) error {
	if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTCONN) {
		return err
	}
	stack := filepath.Dir(filepath.Dir(path))
	if _, serr := os.Stat(filepath.Join(stack, "holders")); serr == nil {
		return err
	}
	return fmt.Errorf("%s: the mount it was on went away (unmounted, or its daemon stopped): nothing was released; the holder reads dead once a daemon serves the store again", path)
}

// readEnv reads a stack's env file: KEY=value lines. A name the command's own programs read to
// decide what to run or load (PATH, LD_PRELOAD …: portdecl.CheckExported) is never set, whatever
// served the file: it is named on stderr and the caller's value stays.
func readEnv(path string) ([]string, error) {
	f, err := fusefile.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var env []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		name, _, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if err := portdecl.CheckExported(name); err != nil {
			fmt.Fprintf(os.Stderr, "cockpitfs: exec: %s: not setting %v\n", path, err)
			continue
		}
		env = append(env, line)
	}
	return env, sc.Err()
}
