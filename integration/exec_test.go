package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// `cockpitfs exec` claims the stack with the command's own process as the holder's pid, runs it
// with the stack's env, exits with its status, and releases the holder unless it is the last.
func TestExecHoldsStackForCommand(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(3, map[string]int{"HTTP": 37640}, "s")
	run := `"$B" exec --holder job "$M/app/stacks/s" -- bash -c 'echo "HTTP=$HTTP"; grep -E "^(pid|state)=" "$M/app/stacks/s/holders/job"; echo "self=$$"; exit 3'`
	r := shIn(t, t.TempDir(), run, "M="+m.Dir, "B="+binary)
	lines := strings.Split(r.Stdout, "\n")
	if r.Code != 3 || len(lines) < 4 || lines[0] != "HTTP=37640" || lines[1] != "pid="+strings.TrimPrefix(lines[3], "self=") || lines[2] != "state=live" {
		t.Fatalf("exec: exit %d (want the command's 3)\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	// The stack's only holder stays, dead with its command, and exec says why.
	if !strings.Contains(r.Stderr, "stays, the stack's last holder") {
		t.Errorf("exec did not say why the holder stays: %q", r.Stderr)
	}
	if got := m.ok(`grep '^state=' $M/app/stacks/s/holders/job`); got != "state=dead\n" {
		t.Fatalf("the last holder after its command ended: %q", got)
	}

	// With a co-tenant the holder goes when the command ends; killed by a signal, exec exits
	// 128 + its number, like a shell.
	m.ok("touch $M/app/stacks/s/holders/me")
	r = shIn(t, t.TempDir(), `"$B" exec --holder job "$M/app/stacks/s" -- bash -c 'kill -TERM $$'`, "M="+m.Dir, "B="+binary)
	if r.Code != 128+15 {
		t.Fatalf("exec of a command killed by SIGTERM: exit %d\n%s", r.Code, r.Stderr)
	}
	if got := m.ok("ls $M/app/stacks/s/holders"); got != "me\n" {
		t.Fatalf("holders after exec with a co-tenant: %q", got)
	}
	if ev := m.lastEvent("app/stacks/s/events"); !strings.Contains(ev, `"op":"unlink"`) || !strings.Contains(ev, `"result":"ok"`) {
		t.Fatalf("the release is not the last event: %s", ev)
	}
}

// A claim exec cannot make: exit 1 with the refusal's errno, message and fix; nothing runs.
func TestExecRefusedClaim(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app $M/app/stacks/s")
	r := shIn(t, t.TempDir(), `"$B" exec "$M/app/stacks/s" -- echo ran`, "M="+m.Dir, "B="+binary)
	if r.Code != 1 || strings.Contains(r.Stdout, "ran") || !strings.Contains(r.Stderr, "invalid argument") || !strings.Contains(r.Stderr, "fix: write app/config first") {
		t.Fatalf("exec on a cockpit without config: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if got := m.ok("ls $M/app/stacks/s/holders"); got != "" {
		t.Fatalf("a refused exec left holders: %q", got)
	}
}

// A command exec cannot start (not on the PATH, not executable) exits 127 as a shell's would,
// and leaves nothing behind: no holder, no lease, no events line of a claim.
func TestExecCommandThatCannotStart(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(3, map[string]int{"HTTP": 37680}, "s")
	before := m.read("app/stacks/s/events")
	notExecutable := t.TempDir() + "/script"
	if err := os.WriteFile(notExecutable, []byte("echo ran\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, command := range []string{"nosuchcmd", notExecutable} {
		r := shIn(t, t.TempDir(), `"$B" exec "$M/app/stacks/s" -- "$C"`, "M="+m.Dir, "B="+binary, "C="+command)
		if r.Code != 127 || !strings.Contains(r.Stderr, command) || !strings.Contains(r.Stderr, "nothing was claimed") {
			t.Errorf("exec -- %s: exit %d, want 127 naming it\nstderr: %s", command, r.Code, r.Stderr)
		}
	}
	if got := m.ok("ls -A $M/app/stacks/s/holders"); got != "" {
		t.Errorf("holders after exec of commands that cannot start: %q", got)
	}
	if got := m.read("app/stacks/s/lease"); strings.Contains(got, "37680") {
		t.Errorf("a lease after exec of commands that cannot start:\n%s", got)
	}
	if got := m.read("app/stacks/s/events"); got != before {
		t.Errorf("events changed by exec of commands that cannot start:\n%s", strings.TrimPrefix(got, before))
	}
}

// A --holder that is not a holder's name is refused before anything happens: one with a slash
// or a dot-dot would name a file outside holders/, which exec would otherwise create, overwrite
// with its pid and remove. Exit 2; the file, the stack and its events are unchanged.
func TestExecHolderNameOutsideHolders(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(3, map[string]int{"HTTP": 37690}, "s")
	before := m.read("app/stacks/s/events")
	config := m.read("app/config")
	outside := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(outside, []byte("precious\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{strings.Repeat("../", 12) + strings.TrimPrefix(outside, "/"), "../../../config", "a/b", "..", ".hidden", "-x", "a\x1bb"} {
		r := shIn(t, t.TempDir(), `"$B" exec --holder "$H" "$M/app/stacks/s" -- echo ran`, "M="+m.Dir, "B="+binary, "H="+name)
		if r.Code != 2 || strings.Contains(r.Stdout, "ran") || !strings.Contains(r.Stderr, "is not a holder name") || strings.Contains(r.Stderr, "\x1b") {
			t.Errorf("exec --holder %q: exit %d\nstdout: %s\nstderr: %q", name, r.Code, r.Stdout, r.Stderr)
		}
	}
	if got, err := os.ReadFile(outside); err != nil || string(got) != "precious\n" {
		t.Errorf("the file outside the mount after exec --holder ../…: %q, %v", got, err)
	}
	if got := m.read("app/config"); got != config {
		t.Errorf("config changed by exec --holder ../../../config:\n%s", got)
	}
	if got := m.ok("ls -A $M/app/stacks/s/holders"); got != "" {
		t.Errorf("holders after refused execs: %q", got)
	}
	if got := m.read("app/stacks/s/events"); got != before {
		t.Errorf("events changed by refused execs:\n%s", strings.TrimPrefix(got, before))
	}
}

// exec of a directory that is no stack's (a typo, the cockpit's, a checkout's): exit 1 naming
// what to give; nothing runs and nothing is created.
func TestExecNotAStackDirectory(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app")
	elsewhere := t.TempDir()
	for _, dir := range []string{m.Path("app"), m.Path("app", "stacks", "missing"), elsewhere} {
		r := shIn(t, t.TempDir(), `"$B" exec "$D" -- echo ran`, "B="+binary, "D="+dir)
		if r.Code != 1 || strings.Contains(r.Stdout, "ran") || !strings.Contains(r.Stderr, dir+" is not a stack's directory") {
			t.Errorf("exec %s: exit %d\nstdout: %s\nstderr: %s", dir, r.Code, r.Stdout, r.Stderr)
		}
		// A stack not made yet, in a cockpit that exists, is named with the mkdir it needs.
		if missing := strings.HasSuffix(dir, "missing"); missing != strings.Contains(r.Stderr, "mkdir "+dir+" first") {
			t.Errorf("exec %s: the refusal names the mkdir only for a missing stack: %s", dir, r.Stderr)
		}
	}
	if got := m.ok("ls -A $M/app/stacks"); got != "" {
		t.Errorf("a refused exec created %q", got)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Errorf("a refused exec created %v in %s", entries, elsewhere)
	}
	// With no daemon serving the mount, exec says so.
	m.Stop()
	r := shIn(t, t.TempDir(), `"$B" exec "$D" -- echo ran`, "B="+binary, "D="+m.Path("app", "stacks", "s"))
	if r.Code != 1 || strings.Contains(r.Stdout, "ran") || !strings.Contains(r.Stderr, "no cockpitfs daemon serves "+m.Dir+": start one with cockpitfs mount --daemon "+m.Dir) {
		t.Errorf("exec with no daemon serving: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
}

// Ctrl-C at a terminal reaches the whole foreground process group: the command gets SIGINT as it
// would without exec (exec drops its own copy rather than pass it on twice), and exec exits 130.
// The command starts with no signal ignored.
func TestExecCommandStopsOnCtrlC(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(3, map[string]int{"HTTP": 37650}, "s")
	// set -m: the job gets a process group of its own, as a terminal's foreground job has.
	run := `set -m
"$B" exec --holder job "$M/app/stacks/s" -- bash -c 'grep ^SigIgn: /proc/self/status; exec sleep 30' > out &
for i in $(seq 200); do grep -q SigIgn out && break; sleep 0.05; done
kill -INT -$!
wait $!
echo "exit=$?"
cat out`
	r := shIn(t, t.TempDir(), run, "M="+m.Dir, "B="+binary)
	if !strings.Contains(r.Stdout, "exit=130\n") || !strings.Contains(r.Stdout, "SigIgn:\t0000000000000000\n") {
		t.Fatalf("exec under Ctrl-C:\nstdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	}
}

// The mount goes away under a running exec (unmounted, its daemon stopped): when the command
// ends, exec says that is why nothing was released, not "no such file or directory".
func TestExecMountWentAway(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(3, map[string]int{"HTTP": 37690}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	dir := t.TempDir()
	running, done := filepath.Join(dir, "running"), filepath.Join(dir, "done")
	// The command runs only once its holder names it (exec's gate): running says it is held.
	cmd := exec.Command(binary, "exec", "--holder", "job", m.Path("app/stacks/s"), "--",
		"bash", "-c", `touch "$1"; while [ ! -e "$2" ]; do sleep 0.05; done`, "-", running, done)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(running); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("exec's command never ran\n%s", stderr.String())
		}
	}
	m.Stop()
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exec: %v\n%s", err, stderr.String())
	}
	if got := stderr.String(); !strings.Contains(got, "the mount it was on went away") || strings.Contains(got, "no such file or directory") {
		t.Fatalf("exec's words when the mount went away: %q", got)
	}
}
