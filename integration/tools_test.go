package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// Everyday tools on the tree, each the real binary, each judged by what its user sees.

// toolsSetup mounts a cockpit app with one claimed stack s (HTTP and DB from base).
func toolsSetup(t *testing.T, base int) *mount {
	t.Helper()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": base, "DB": base + 1}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	return m
}

// toolsHelper is the absolute path of a helper script in testdata (scripts run in the mount).
func toolsHelper(t *testing.T, name string) string {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// Tree walkers read everything they list: none blocks, and `wait` still blocks when asked for by
// name, for a stack and for a cockpit.
func TestToolsTreeWalkersDoNotBlock(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "rg", "rsync", "tar")
	m := toolsSetup(t, 26600)
	dest := t.TempDir()
	for _, script := range []string{
		"grep -r -l HTTP $M/app",
		"rg -l HTTP $M/app",
		"cp -r $M/app " + dest + "/cp",
		"rsync -a $M/app/ " + dest + "/rsync/",
		"tar cf " + dest + "/app.tar -C $M app",
		"find $M/app -type f -exec cat {} + > /dev/null",
		"ls -R $M > /dev/null",
	} {
		t.Run(strings.Fields(script)[0], func(t *testing.T) {
			// timeout: a walker that blocks fails here rather than hanging the suite.
			if r := m.sh("timeout 20 " + script); r.Code != 0 {
				t.Fatalf("%s: exit %d\n%s", script, r.Code, r.Stderr)
			}
		})
	}
	if got := m.read("app/stacks/s/ports/HTTP"); got != "26600\n" {
		t.Fatalf("ports/HTTP = %q", got)
	}
	for _, copied := range []string{"/cp/stacks/s/env", "/rsync/stacks/s/env"} {
		if out := m.ok("cat " + dest + copied); !strings.Contains(out, "HTTP=26600\n") {
			t.Fatalf("%s = %q", copied, out)
		}
	}
	if listed := m.ok("ls -a $M/app $M/app/stacks/s"); strings.Contains(listed, "wait") {
		t.Fatalf("wait is listed:\n%s", listed)
	}

	// By name, a stack's wait blocks until the stack changes, and prints its revision.
	rev := strings.TrimSpace(m.read("app/stacks/s/revision"))
	stackWait := startReader(t, m, "cat $M/app/stacks/s/wait")
	cockpitWait := startReader(t, m, "cat $M/app/wait")
	time.Sleep(200 * time.Millisecond)
	if stackWait.done() || cockpitWait.done() {
		t.Fatalf("a wait returned with nothing changed: %q %q", stackWait.output(), cockpitWait.output())
	}
	m.ok("cd /tmp && touch $M/app/stacks/s/holders/you")
	if got, want := stackWait.wait(t), strings.TrimSpace(rev); got == want+"\n" || got == "" {
		t.Fatalf("stack wait printed %q after revision %s", got, want)
	}
	if got := cockpitWait.wait(t); got != "stacks/s/events\n" {
		t.Fatalf("cockpit wait printed %q, want where the change is recorded", got)
	}
}

// reader is a command running in the background, its output collected.
type reader struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	exit chan struct{}
}

func startReader(t *testing.T, m *mount, script string, env ...string) *reader {
	t.Helper()
	r := &reader{cmd: exec.Command("bash", "-c", script), out: &syncBuffer{}, exit: make(chan struct{})}
	r.cmd.Env = append(append(r.cmd.Environ(), "M="+m.Dir), env...)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	// A group of its own, killed whole: a child left blocked in the mount would keep the output
	// pipe, and Wait with it, open.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	signal := testtool.GroupSignaler(t, r.cmd.Process.Pid)
	go func() { r.cmd.Wait(); close(r.exit) }()
	t.Cleanup(func() { signal(syscall.SIGKILL); <-r.exit })
	return r
}

func (r *reader) done() bool {
	select {
	case <-r.exit:
		return true
	default:
		return false
	}
}

func (r *reader) output() string { return r.out.String() }

// wait returns the output once the command exits (failing the test after 20 s).
func (r *reader) wait(t *testing.T) string {
	t.Helper()
	select {
	case <-r.exit:
	case <-time.After(20 * time.Second):
		t.Fatalf("still running after 20s: %s\n%s", r.cmd, r.output())
	}
	return r.output()
}

// The tree has no extended attributes, and the kernel is told so once: getxattr and setxattr of
// any file or directory fail EOPNOTSUPP (the kernel answers them itself, so ls -l, which asks twice
// a name, and every write, which asks whether the file carries capabilities, cost no request),
// and what reads them carries on.
func TestToolsNoExtendedAttributes(t *testing.T) {
	t.Parallel()
	m := toolsSetup(t, 26680)
	buf := make([]byte, 256)
	for _, p := range []string{m.Path("app", "config"), m.Path("app", "stacks", "s", "holders", "me"), m.Path("app", "stacks", "s")} {
		for _, name := range []string{"user.note", "security.capability"} { // ACLs: the kernel answers ENODATA, no ACL
			if _, err := unix.Getxattr(p, name, buf); err != unix.EOPNOTSUPP {
				t.Errorf("getxattr %s %s: %v, want EOPNOTSUPP", p, name, err)
			}
		}
		if err := unix.Setxattr(p, "user.note", []byte("x"), 0); err != unix.EOPNOTSUPP {
			t.Errorf("setxattr %s: %v, want EOPNOTSUPP", p, err)
		}
	}
	m.ok("ls -l $M/app/stacks/s/holders && echo pid=none > $M/app/stacks/s/holders/me")
	if got := m.read("app", "stacks", "s", "holders", "me"); !strings.Contains(got, "pid=none\n") {
		t.Fatalf("holder after writing pid=none:\n%s", got)
	}
}

// ls -a lists . and .. in every directory.
func TestToolsListDotAndDotDot(t *testing.T) {
	t.Parallel()
	m := toolsSetup(t, 26610)
	for _, d := range []string{"", "/app", "/app/stacks", "/app/stacks/s", "/app/stacks/s/holders", "/ports"} {
		if got := m.ok("ls -a $M" + d + " | head -2"); got != ".\n..\n" {
			t.Errorf("ls -a %s starts %q", d, got)
		}
	}
}

// Attribute changes the tree cannot make are refused with EPERM, one events line each, and change
// nothing; setting what a file already has is accepted.
func TestToolsRefusedAttributeChanges(t *testing.T) {
	t.Parallel()
	m := toolsSetup(t, 26620)
	h := "$M/app/stacks/s/holders/me"
	state := func() string {
		return m.ok("cd $M/app/stacks/s && stat -c '%n %a %u %Y %s' holders holders/me record ../../config && ls holders && cat holders/me record ../../config")
	}
	before := state()
	for _, tc := range []struct{ script, events, op string }{
		{"chmod 600 " + h, "app/stacks/s/events", "chmod"},
		{"chown 1 " + h, "app/stacks/s/events", "chown"},
		{"chgrp 1 " + h, "app/stacks/s/events", "chown"},
		{"touch -d yesterday " + h, "app/stacks/s/events", "utimes"},
		{"touch -r /etc/hostname " + h, "app/stacks/s/events", "utimes"},
		{"truncate -s 3 " + h, "app/stacks/s/events", "truncate"},
		{"mv " + h + " $M/app/stacks/s/holders/you", "app/stacks/s/events", "rename"},
		{"touch $M/app/stacks/s/holders/", "app/stacks/s/events", "utimes"},
		{"chmod 700 $M/app/stacks/s", "app/stacks/s/events", "chmod"},
		{"touch $M/app/config", "app/events", "utimes"},
		{"mv $M/app/config $M/app/config.old", "app/events", "rename"},
	} {
		t.Run(tc.script, func(t *testing.T) {
			n := claimsEventCount(m, tc.events)
			r := m.refused(tc.script, syscall.EPERM)
			if got := claimsEventCount(m, tc.events); got != n+1 {
				t.Fatalf("%d events lines for one refusal (stderr %q)", got-n, r.Stderr)
			}
			ev := claimsRefusalEvent(t, m, tc.events, "UNSUPPORTED_OPERATION", "EPERM")
			if ev["op"] != tc.op || ev["fix"] == "" {
				t.Fatalf("events line %v, want op %s with a fix", ev, tc.op)
			}
		})
	}
	if after := state(); after != before {
		t.Fatalf("refused changes changed the tree:\n%s\n->\n%s", before, after)
	}
	// Setting the mode or owner a file already has changes nothing, and says so by succeeding.
	n := claimsEventCount(m, "app/stacks/s/events")
	m.ok("chmod 644 " + h + " && chown 0:0 " + h + " && chmod 755 $M/app/stacks/s")
	if got := claimsEventCount(m, "app/stacks/s/events"); got != n {
		t.Fatalf("setting unchanged modes and owners left %d events lines", got-n)
	}
}

// An editor's swap, lock and backup names are refused without an events line; the save itself is
// applied and logged once.
func TestToolsEditorScratchNotLogged(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "vim")
	m := toolsSetup(t, 26630)
	n := claimsEventCount(m, "app/events")
	// -i NONE: parallel tests running vim would otherwise race on ~/.viminfo, and vim -es exits 1 when it cannot write it.
	m.ok("cd /tmp && vim -es -i NONE -c '%s/26630/26640/' -c wq $M/app/config")
	if got := m.read("app/config"); !strings.Contains(got, "HTTP = 26640") {
		t.Fatalf("vim's save was not applied: %q", got)
	}
	lines := strings.Split(strings.TrimSpace(m.read("app/events")), "\n")[n:]
	if len(lines) != 1 || !strings.Contains(lines[0], `"op":"write"`) || !strings.Contains(lines[0], `"result":"ok"`) {
		t.Fatalf("events after a vim save:\n%s", strings.Join(lines, "\n"))
	}
	n = claimsEventCount(m, "app/stacks/s/events")
	for _, name := range []string{".me.swp", ".me.swx", "me~", "#me#", ".#me", "4913", "me.save"} {
		m.refused(`touch "$M/app/stacks/s/`+name+`"`, syscall.EPERM)
	}
	if got := claimsEventCount(m, "app/stacks/s/events"); got != n {
		t.Fatalf("editor scratch names left %d events lines", got-n)
	}
	// Beside a holder too: vim editing one makes no claim and leaves no line for its swap file.
	for _, name := range []string{".me.swp", ".me.swx", "#me#", ".#me", "me~"} {
		m.refused(`touch "$M/app/stacks/s/holders/`+name+`"`, syscall.EPERM)
	}
	m.ok("cd /tmp && vim -es -i NONE -c 'q' $M/app/stacks/s/holders/me")
	if got := claimsEventCount(m, "app/stacks/s/events"); got != n {
		t.Fatalf("editor scratch names beside a holder left %d events lines", got-n)
	}
	// Any other undefined name is one refusal, one line.
	m.refused("touch $M/app/stacks/s/notes.txt", syscall.EPERM)
	if got := claimsEventCount(m, "app/stacks/s/events"); got != n+1 {
		t.Fatalf("one refused create left %d events lines", got-n)
	}
}

// Every health observation says pass or fail; the code names what it checks for either way.
func TestToolsHealthSaysPassOrFail(t *testing.T) {
	t.Parallel()
	m := toolsSetup(t, 26650)
	results := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(m.read("app/stacks/s/health")), "\n") {
		var o struct{ Code, Target, Result string }
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			t.Fatal(err)
		}
		results[o.Code+" "+o.Target] = o.Result
	}
	for key, want := range map[string]string{
		"CLAIM_STATE_UNHEALTHY ":          "pass",
		"PORT_FAMILY_COLLISION ":          "pass",
		"PORT_LISTENER_ABSENT HTTP=26650": "fail", // nothing listens: the stack is not up
		"PORT_FAMILY_EPHEMERAL_OVERLAP ":  "pass",
		"PORT_LISTENER_ABSENT DB=26651":   "fail",
	} {
		if results[key] != want {
			t.Errorf("%s: result %q, want %q (all: %v)", key, results[key], want, results)
		}
	}
}

// tail -f, tail -F and less +F show each line appended to an events file once, in order, while
// the bounded window slides under them; a follower stopped while more than the window went by
// resumes without a broken or repeated line; cat still shows the window. For a stack's events and
// a cockpit's.
func TestToolsFollowEvents(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "less", "python3")
	m := toolsSetup(t, 26660)
	for _, tc := range []struct{ events, refused string }{
		{"app/stacks/s/events", "$M/app/stacks/s/"},
		{"app/events", "$M/app/"},
	} {
		t.Run(tc.events, func(t *testing.T) {
			t.Parallel()
			// Nearly a window of lines first, so the window slides while they follow.
			m.ok(`for i in {1..250}; do : > ` + tc.refused + `w$i; done 2>/dev/null; true`)
			events := "$M/" + tc.events
			followers := map[string]*reader{
				"tail -f": startReader(t, m, "tail -f "+events),
				"tail -F": startReader(t, m, "tail -F "+events),
				"less +F": startReader(t, m, "python3 testdata/pty-less.py "+m.Path(tc.events)+" '/y60\"' 30"),
			}
			stopped := startReader(t, m, "tail -f -n 0 "+events)
			less := followers["less +F"]
			waitFor(t, func() string { return "less to follow: " + less.output() }, func() bool { return strings.Contains(less.output(), "following\n") })
			time.Sleep(1500 * time.Millisecond) // every tail has printed its last lines
			stopped.cmd.Process.Signal(syscall.SIGSTOP)
			for batch := 0; batch < 3; batch++ {
				m.ok(fmt.Sprintf(`for i in {%d..%d}; do : > %sy$i; done 2>/dev/null; true`, batch*20+1, batch*20+20, tc.refused))
				time.Sleep(1100 * time.Millisecond) // tail's and less's own polling interval
			}
			m.ok(`for i in {1..300}; do : > ` + tc.refused + `z$i; done 2>/dev/null; true`)
			stopped.cmd.Process.Signal(syscall.SIGCONT)
			for name, f := range followers {
				var want []string
				for i := 1; i <= 60; i++ {
					want = append(want, fmt.Sprintf("y%d", i))
				}
				waitFor(t, func() string { return name + " to show y60: " + f.output() }, func() bool { return strings.Contains(f.output(), `/y60"`) })
				if got := followedNames(f.output(), "y"); strings.Join(got, " ") != strings.Join(want, " ") {
					t.Errorf("%s showed %v, want y1 … y60 once each, in order", name, got)
				}
			}
			// Its whole line: tail may have written part of it so far.
			waitFor(t, func() string { return "the stopped follower to show z300: " + stopped.output() }, func() bool {
				out := stopped.output()
				return strings.Contains(out, `/z300"`) && strings.HasSuffix(out, "\n")
			})
			lines := strings.Split(strings.TrimSuffix(stopped.output(), "\n"), "\n")
			seen := map[string]bool{}
			for _, line := range lines {
				var ev struct{ Path string }
				if err := json.Unmarshal([]byte(line), &ev); err != nil {
					t.Fatalf("the stopped follower read a broken line %q: %v", line, err)
				}
				if seen[ev.Path] {
					t.Fatalf("the stopped follower read %s twice", ev.Path)
				}
				seen[ev.Path] = true
			}
			if z := followedNames(stopped.output(), "z"); len(z) == 0 || z[len(z)-1] != "z300" {
				t.Fatalf("the stopped follower ended with %v", z)
			}
			// Refusals keep a window of their own per uid: cat shows root's last 32, z269 … z300.
			var want []string
			for i := 269; i <= 300; i++ {
				want = append(want, fmt.Sprintf("z%d", i))
			}
			window := m.read(tc.events)
			got := append(append(followedNames(window, "w"), followedNames(window, "y")...), followedNames(window, "z")...)
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Fatalf("cat shows the refused names %v, want z269 … z300", got)
			}
			// The followers are still open, and past the window: everyone else's stat is the
			// size of what a new open reads, so tools that read exactly the size agree.
			copied := t.TempDir()
			r := m.sh(`stat -c %s ` + events + `; wc -c < ` + events + `; tail -c 100 ` + events + ` | wc -c; rsync -a ` + events + ` ` + copied + `/ && cmp ` + events + ` ` + copied + `/events && echo copied`)
			if f := strings.Fields(r.Stdout); r.Code != 0 || len(f) != 4 || f[0] != f[1] || f[2] != "100" || f[3] != "copied" {
				t.Fatalf("stat, wc -c, tail -c 100, rsync -a while followers are open: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
		})
	}
}

// A stack drained and removed while tail -f follows its events, within one of tail's polls: tail
// shows the drain's lines, and goes on following, as it would a removed file on a disk.
func TestToolsFollowEventsOfARemovedStack(t *testing.T) {
	t.Parallel()
	m := toolsSetup(t, 26760)
	m.ok("mkdir $M/app/stacks/gone && touch $M/app/stacks/gone/holders/me")
	tail := startReader(t, m, "tail -f $M/app/stacks/gone/events")
	waitFor(t, func() string { return "tail to show the claim: " + tail.output() }, func() bool { return strings.Contains(tail.output(), "holders/me") })
	m.ok("S=$M/app/stacks/gone && " + machineDrain + " && rmdir $S")
	waitFor(t, func() string { return "tail to show the drain's outcome: " + tail.output() }, func() bool {
		return strings.Contains(tail.output(), `"path":"app/stacks/gone/drain/outcome"`)
	})
	time.Sleep(2500 * time.Millisecond) // two more of tail's polls, the stack gone
	if tail.done() || strings.Contains(tail.output(), "No such file") {
		t.Fatalf("tail -f of a removed stack's events stopped:\n%s", tail.output())
	}
}

// followedNames are the names (prefix and a number) of the refused paths in events lines, in order.
func followedNames(output, prefix string) []string {
	var names []string
	for _, line := range strings.Split(output, "\n") {
		i := strings.Index(line, `"path":"`)
		if i < 0 {
			continue
		}
		path, _, closed := strings.Cut(line[i+len(`"path":"`):], `"`)
		if !closed {
			continue // cut by the screen's width: the lines around it say what it was
		}
		name := path[strings.LastIndexByte(path, '/')+1:]
		if strings.HasPrefix(name, prefix) && strings.Trim(name[len(prefix):], "0123456789") == "" {
			names = append(names, name)
		}
	}
	return names
}

// waitFor polls cond for up to 20 s; what says what it waits for.
func waitFor(t *testing.T, what func() string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after 20s for %s", what())
		}
	}
}

// toolsConfig is the document the config edits start from, HTTP at port.
func toolsConfig(port int) string {
	return fmt.Sprintf("[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = %d\n", port)
}

// hiddenReplaceEdit edits config FROM to TO as python's atomic save does: a hidden mkstemp
// beside it, renamed onto it.
const hiddenReplaceEdit = `python3 -c 'import os, sys, tempfile
cfg = sys.argv[1] + "/config"
fd, tmp = tempfile.mkstemp(dir=sys.argv[1], prefix=".config.")
os.write(fd, open(cfg).read().replace("FROM", "TO").encode())
os.close(fd)
os.replace(tmp, cfg)' $M/app`

// Every common way of editing config ends with the new document applied, once, when the writer
// is done, and exit 0; nothing is left beside config.
func TestToolsConfigEdits(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "vim", "nano", "perl", "python3", "rsync")
	m := newMount(t)
	m.ok("mkdir $M/app")
	claimsConfig(m, "app", toolsConfig(26700))
	dir := t.TempDir()
	port := 26700
	for _, tc := range []struct{ name, script string }{
		{"sed -i", "sed -i s/FROM/TO/ $M/app/config"},
		{"perl -pi", "perl -pi -e s/FROM/TO/ $M/app/config"},
		{"mkstemp and os.replace", `python3 -c 'import os, sys, tempfile
cfg = sys.argv[1] + "/config"
fd, tmp = tempfile.mkstemp(dir=sys.argv[1])
os.write(fd, open(cfg).read().replace("FROM", "TO").encode())
os.close(fd)
os.replace(tmp, cfg)' $M/app`},
		{"hidden mkstemp and os.replace", hiddenReplaceEdit},
		// rsync writes .config.XXXXXX beside config, then renames it onto config. (Its quick check
		// skips a file of config's size and second: new.toml is an older file here.)
		{"rsync new.toml config", "sed s/FROM/TO/ $M/app/config > " + dir + "/rsync.toml && touch -d @0 " + dir + "/rsync.toml && rsync " + dir + "/rsync.toml $M/app/config"},
		// rsync --inplace writes config in place, then ftruncates it to the length it wrote.
		{"rsync --inplace new.toml config", "sed s/FROM/TO/ $M/app/config > " + dir + "/inplace.toml && touch -d @0 " + dir + "/inplace.toml && rsync --inplace " + dir + "/inplace.toml $M/app/config"},
		{"mv new.toml config", "sed s/FROM/TO/ $M/app/config > $M/app/new.toml && mv $M/app/new.toml $M/app/config"},
		{"cp new.toml config", "sed s/FROM/TO/ $M/app/config > " + dir + "/new.toml && cp " + dir + "/new.toml $M/app/config"},
		// Its times and mode restored through the fd it wrote, which FUSE sends without the handle.
		{"cp -p new.toml config", "sed s/FROM/TO/ $M/app/config > " + dir + "/new.toml && cp -p " + dir + "/new.toml $M/app/config"},
		{"bash printf, a line per write", `printf '[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = TO\n' > $M/app/config`},
		{"echo -e", `echo -e '[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = TO' > $M/app/config`},
		{"dd bs=16", "sed s/FROM/TO/ $M/app/config > " + dir + "/dd.toml && dd status=none bs=16 if=" + dir + "/dd.toml of=$M/app/config"},
		{"a writer flushing per line", `python3 -c 'import sys
lines = open(sys.argv[1]).read().replace("FROM", "TO").splitlines(True)
with open(sys.argv[1], "w", buffering=1) as f:
    for line in lines:
        f.write(line)' $M/app/config`},
		{"vim", "vim -es -i NONE -c '%s/FROM/TO/' -c wq $M/app/config"},
		{"nano", "python3 " + toolsHelper(t, "pty-keys.py") + ` '\x1c|FROM\r|TO\r|a|\x0f|\r|\x18' nano $M/app/config || true`}, // judged by what it saved
	} {
		t.Run(tc.name, func(t *testing.T) {
			editApplied(t, m, tc.script, port, port+1)
			port++
			if got := m.ok("ls -a $M/app"); got != ".\n..\nconfig\nevents\nstacks\n" {
				t.Fatalf("ls -a after the edit:\n%s", got)
			}
		})
	}
}

// rsync --delay-updates (and with --partial-dir=.DIR) copies into a scratch file beside config,
// renames it into a directory beside config (.~tmp~), then onto config, then removes the
// directory. Its mkdir was refused, and rsync discarded the copy and exited 0 with nothing
// applied. Now the document is applied whole; a refused one fails rsync and changes nothing;
// and a co-user's rsync onto the config, or use of its owner's directory, is refused.
// TestToolsRsyncDelayUpdatesAtTheScratchLimit: rsync --delay-updates makes its directory after
// its scratch file, and takes a refused mkdir as a copy to discard, exiting 0. With 15 scratch
// files held, its file was the 16th and its mkdir the 17th, refused: exit 0, nothing applied. A
// mkdir now finds room once its file did; a 16th scratch file held refuses rsync's own (exit 23).
func TestToolsRsyncDelayUpdatesAtTheScratchLimit(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "rsync")
	m := newMount(t)
	m.ok("mkdir $M/app")
	claimsConfig(m, "app", toolsConfig(48300))
	m.ok("for i in $(seq 1 15); do touch $M/app/.held$i; done")
	dir := t.TempDir()
	editApplied(t, m, "sed s/FROM/TO/ $M/app/config > "+dir+"/new.toml && touch -d @0 "+dir+"/new.toml && rsync --delay-updates "+dir+"/new.toml $M/app/config", 48300, 48301)
	m.ok("touch $M/app/.held16")
	r := m.sh("sed s/48301/48302/ $M/app/config > " + dir + "/new.toml && touch -d @0 " + dir + "/new.toml && rsync --delay-updates " + dir + "/new.toml $M/app/config")
	if r.Code == 0 {
		t.Fatalf("rsync --delay-updates with 16 scratch files held: exit 0\n%s", r.Stderr)
	}
	if got := m.read("app/config"); got != toolsConfig(48301) {
		t.Fatalf("config = %q after a refused rsync", got)
	}
}

// TestToolsScratchFilesOpenPastTheirNameCount: what a scratch file holds counts against its
// writer's open bytes while a descriptor of it is open: one open, written and removed (or
// renamed over) leaves the cockpit's 16 but not the daemon's memory, and a loop of them pinned
// 64 KiB each, with no bound but the descriptors.
func TestToolsScratchFilesOpenPastTheirNameCount(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "python3")
	m := newMount(t, "--max-open-bytes-per-uid", "1048576")
	m.ok("mkdir $M/app")
	claimsConfig(m, "app", toolsConfig(48400))
	out := m.ok(`python3 -c 'import errno, os, sys
app, fds = sys.argv[1], []
os.mkdir(app + "/.~tmp~")
for i in range(100):
    for p in (app + "/.~tmp~/f", app + "/.f"):
        fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o600)
        fds.append(fd)
        os.unlink(p)
        try:
            os.write(fd, b"x" * 65536)
        except OSError as e:
            assert e.errno == errno.ENOMEM, e
            print(len(fds))
            for fd in fds:
                os.close(fd)
            fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o600)
            os.write(fd, b"x" * 65536)
            sys.exit(0)
print("never refused")' $M/app`)
	if n, err := strconv.Atoi(strings.TrimSpace(out)); err != nil || n > 17 {
		t.Fatalf("removed scratch files written before a write was refused: %q, want at most 17 (1 MiB / 64 KiB + 1)", out)
	}
	// Written and closed, then opened read-only and removed: held by that open alone, which
	// counted nothing.
	out = m.ok(`python3 -c 'import errno, os, sys
app, fds = sys.argv[1], []
for i in range(100):
    p = app + "/.g"
    try:
        with open(p, "wb") as f:
            f.write(b"x" * 65536)
        fds.append(os.open(p, os.O_RDONLY))
    except OSError as e:
        assert e.errno == errno.ENOMEM, e
        print(len(fds))
        sys.exit(0)
    os.unlink(p)
print("never refused")' $M/app`)
	if n, err := strconv.Atoi(strings.TrimSpace(out)); err != nil || n > 16 {
		t.Fatalf("removed scratch files held open read-only before an open was refused: %q, want at most 16", out)
	}
}

// TestToolsRenameExchangeOfAScratchFile: renameat2(RENAME_EXCHANGE) of a scratch file and config,
// or of two scratch files, is refused and changes nothing: taken as a rename, it applied the
// scratch file and exited 0, or removed the other scratch file, and left the kernel's names on
// the nodes swapped (the scratch file's name then opened config).
func TestToolsRenameExchangeOfAScratchFile(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app")
	claimsConfig(m, "app", toolsConfig(48200))
	m.ok("cat > $M/app/.new <<'EOF'\n" + toolsConfig(48210) + "EOF\necho q > $M/app/.q")
	for _, pair := range [][2]string{{".new", "config"}, {".new", ".q"}} {
		n := claimsEventCount(m, "app/events")
		err := unix.Renameat2(unix.AT_FDCWD, m.Path("app", pair[0]), unix.AT_FDCWD, m.Path("app", pair[1]), unix.RENAME_EXCHANGE)
		if err != syscall.EPERM {
			t.Errorf("renameat2(%s, %s, RENAME_EXCHANGE) = %v, want EPERM", pair[0], pair[1], err)
		}
		if got := claimsEventCount(m, "app/events") - n; got != 1 {
			t.Errorf("exchange of %s and %s: %d events lines, want 1", pair[0], pair[1], got)
		}
	}
	if got := m.read("app/config"); got != toolsConfig(48200) {
		t.Errorf("config = %q after the exchanges", got)
	}
	if got := m.read("app/.new"); got != toolsConfig(48210) {
		t.Errorf(".new = %q after the exchanges", got)
	}
	if got := m.read("app/.q"); got != "q\n" {
		t.Errorf(".q = %q after the exchanges", got)
	}
}

func TestToolsRsyncDelayUpdates(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "rsync")
	m := ownershipMount(t, "--allow-other")
	m.ok("mkdir $M/app")
	claimsConfig(m, "app", toolsConfig(48100))
	dir := t.TempDir()
	port := 48100
	for _, flags := range []string{"--delay-updates", "--delay-updates --partial-dir=.rsync-partial", "-a --delay-updates"} {
		t.Run(flags, func(t *testing.T) {
			// Its quick check skips a file of config's size and second: new.toml is older.
			editApplied(t, m, "sed s/FROM/TO/ $M/app/config > "+dir+"/new.toml && touch -d @0 "+dir+"/new.toml && rsync "+flags+" "+dir+"/new.toml $M/app/config", port, port+1)
			port++
			if got := m.ok("ls -a $M/app"); got != ".\n..\nconfig\nevents\nstacks\n" {
				t.Fatalf("ls -a after rsync %s:\n%s", flags, got)
			}
		})
	}
	good := toolsConfig(port)

	// A refused document: rsync says so and exits non-zero; config stays; one events line.
	n := claimsEventCount(m, "app/events")
	r := m.sh("printf '[ports]\\nstep = 0\\n[ports.bases]\\nHTTP = 48900\\n' > " + dir + "/bad.toml && rsync --delay-updates " + dir + "/bad.toml $M/app/config")
	if r.Code == 0 || !strings.Contains(r.Stderr, "rename failed") {
		t.Fatalf("rsync --delay-updates of a refused document: exit %d\n%s", r.Code, r.Stderr)
	}
	if got := m.read("app/config"); got != good {
		t.Fatalf("config = %q after a refused rsync", got)
	}
	lines := strings.Split(strings.TrimSpace(m.read("app/events")), "\n")[n:]
	if len(lines) != 1 || !strings.Contains(lines[0], `"result":"refused"`) || !strings.Contains(lines[0], `"path":"app/.~tmp~/config"`) {
		t.Fatalf("want one refusal of the rename in events, got:\n%s", strings.Join(lines, "\n"))
	}
	// rsync leaves its directory and the refused copy, as on any filesystem; they are its
	// writer's alone.
	if got := m.ok("ls -a $M/app/.~tmp~"); got != ".\n..\nconfig\n" {
		t.Fatalf("ls -a .~tmp~ after the refused rsync:\n%s", got)
	}
	src := filepath.Join(filepath.Dir(m.Dir), "nobody.toml") // a directory nobody can read
	if err := os.WriteFile(src, []byte(toolsConfig(48950)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(src, time.Unix(0, 0), time.Unix(0, 0)); err != nil { // past the quick check
		t.Fatal(err)
	}
	for _, script := range []string{
		"rsync --delay-updates " + src + " $M/app/config",
		"rsync --delay-updates --partial-dir=.rsync-partial " + src + " $M/app/config",
		"ls $M/app/.~tmp~",
		"cat $M/app/.~tmp~/config",
		"mv $M/app/.~tmp~/config $M/app/config",
		"cp " + src + " $M/app/.~tmp~/config",
		"rm -r $M/app/.~tmp~",
		"mkdir $M/app/.mine",
	} {
		if r := ownershipAsNobody(m, script); r.Code == 0 {
			t.Errorf("as another uid, %s: exit 0", script)
		}
	}
	if got := m.read("app/config"); got != good {
		t.Fatalf("config = %q after another uid's attempts", got)
	}
	if got := m.ok("ls -a $M/app/.~tmp~ && cat $M/app/.~tmp~/config | grep step"); got != ".\n..\nconfig\nstep = 0\n" {
		t.Fatalf(".~tmp~ after another uid's attempts:\n%s", got)
	}

	// The next rsync replaces the copy left there, applies its own and removes the directory.
	editApplied(t, m, "sed s/FROM/TO/ $M/app/config > "+dir+"/new.toml && touch -d @0 "+dir+"/new.toml && rsync --delay-updates "+dir+"/new.toml $M/app/config", port, port+1)
	if got := m.ok("ls -a $M/app"); got != ".\n..\nconfig\nevents\nstacks\n" {
		t.Fatalf("ls -a after rsync --delay-updates:\n%s", got)
	}

	// Bounded: a scratch directory, and each file in it, counts as a scratch file does; a
	// directory may be made past 16, up to 32 (see TestToolsRsyncDelayUpdatesAtTheScratchLimit).
	m.ok("mkdir $M/app/.d && for i in $(seq 2 15); do : > $M/app/.d/f$i; done && : > $M/app/s16.toml") // 16
	m.refused(": > $M/app/.d/f17", syscall.ENOSPC)
	claimsRefusalEvent(t, m, "app/events", "CONFIG_EDIT_LIMIT", "ENOSPC")
	m.ok("for i in $(seq 17 32); do mkdir $M/app/.d$i; done")
	m.refused("mkdir $M/app/.d33", syscall.ENOSPC)
	claimsRefusalEvent(t, m, "app/events", "CONFIG_EDIT_LIMIT", "ENOSPC")
	m.refused(": > $M/app/.d17/f", syscall.ENOSPC)
	m.refused("rmdir $M/app/.d", syscall.ENOTEMPTY)
	m.ok("rm -r $M/app/.d* $M/app/s16.toml")
	if got := m.ok("ls -a $M/app"); got != ".\n..\nconfig\nevents\nstacks\n" {
		t.Fatalf("ls -a after rm -r:\n%s", got)
	}
}

// An edit right after a replacement by rename (os.replace, mv, sed -i) applies too: the name
// shows config's inode and mtime from the rename on. It showed the renamed file's until config
// was opened, so vim, which compares the mtime at its write with the one at its read, found
// config changed under it, and vim -es wrote nothing and exited 0.
func TestToolsEditRightAfterAReplace(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "vim", "python3")
	m := newMount(t)
	m.ok("mkdir $M/app")
	claimsConfig(m, "app", toolsConfig(26750))
	port := 26750
	for _, tc := range []struct{ name, script string }{
		{"os.replace", hiddenReplaceEdit},
		{"mv", "sed s/FROM/TO/ $M/app/config > $M/app/new.toml && mv $M/app/new.toml $M/app/config"},
		{"sed -i", "sed -i s/FROM/TO/ $M/app/config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replace := func(from, to int) string {
				return strings.NewReplacer("FROM", fmt.Sprint(from), "TO", fmt.Sprint(to)).Replace(tc.script)
			}
			n := claimsEventCount(m, "app/events")
			m.ok(replace(port, port+1) + fmt.Sprintf(" && vim -es -i NONE -c '%%s/%d/%d/' -c wq $M/app/config", port+1, port+2))
			if got, want := m.read("app/config"), toolsConfig(port+2); got != want {
				t.Fatalf("config = %q after vim's edit right after the replacement, want %q", got, want)
			}
			lines := strings.Split(strings.TrimSpace(m.read("app/events")), "\n")[n:]
			if len(lines) != 2 || !strings.Contains(lines[0], `"result":"ok"`) || !strings.Contains(lines[1], `"result":"ok"`) {
				t.Fatalf("want both documents applied, events:\n%s", strings.Join(lines, "\n"))
			}
			// By name, right after a rename and after an open of config: one inode, one mtime.
			out := m.ok(replace(port+2, port+3) + ` && stat -c '%i %y' $M/app/config && cat $M/app/config >/dev/null && stat -c '%i %y' $M/app/config`)
			if stats := strings.Split(strings.TrimSpace(out), "\n"); len(stats) != 2 || stats[0] != stats[1] {
				t.Errorf("config by name, right after the rename and after an open: %q", stats)
			}
			port += 3
		})
	}
}

// editApplied runs an edit of app/config (script, its FROM and TO the ports from and to) and
// checks it ends with config the document of port to, applied once: one ok events line.
func editApplied(t *testing.T, m *mount, script string, from, to int) {
	t.Helper()
	script = strings.NewReplacer("FROM", fmt.Sprint(from), "TO", fmt.Sprint(to)).Replace(script)
	n := claimsEventCount(m, "app/events")
	m.ok(script)
	if got, want := m.read("app/config"), toolsConfig(to); got != want {
		t.Fatalf("config = %q, want %q", got, want)
	}
	lines := strings.Split(strings.TrimSpace(m.read("app/events")), "\n")[n:]
	if len(lines) != 1 || !strings.Contains(lines[0], `"result":"ok"`) {
		t.Fatalf("want the document applied once, events:\n%s", strings.Join(lines, "\n"))
	}
}

// An edit whose document is refused fails where it was typed, says why in events, and leaves
// config as it was; scratch files are their writer's, bounded, and gone with the daemon.
func TestToolsConfigEditRefusals(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "perl", "python3")
	m := ownershipMount(t, "--allow-other")
	m.ok("mkdir $M/app")
	good := toolsConfig(26720)
	claimsConfig(m, "app", good)
	dir := t.TempDir()
	for _, tc := range []struct{ name, script string }{
		{"sed -i", "sed -i 's/step = 10/step = 0/' $M/app/config"},
		{"perl -pi", "perl -pi -e 's/step = 10/step = 0/' $M/app/config"},
		{"os.replace", `python3 -c 'import os, sys, tempfile
fd, tmp = tempfile.mkstemp(dir=sys.argv[1])
os.write(fd, b"[ports]\nstep = 0\n")
os.close(fd)
os.replace(tmp, sys.argv[1] + "/config")' $M/app`},
		{"cat", "echo '[ports]' | cat > $M/app/config"},
		{"dd bs=16", "printf '[ports]\\nstep = 0\\n' > " + dir + "/bad.toml && dd status=none bs=16 if=" + dir + "/bad.toml of=$M/app/config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := claimsEventCount(m, "app/events")
			r := m.sh(tc.script)
			if r.Code == 0 {
				t.Fatalf("exit 0 with the document refused\nstderr: %s", r.Stderr)
			}
			if got := m.read("app/config"); got != good {
				t.Fatalf("config = %q after a refused edit", got)
			}
			lines := strings.Split(strings.TrimSpace(m.read("app/events")), "\n")[n:]
			if len(lines) != 1 || !strings.Contains(lines[0], `"result":"refused"`) {
				t.Fatalf("want one refusal in events, got:\n%s", strings.Join(lines, "\n"))
			}
		})
	}
	// sed and perl removed their scratch files; the python script above leaves its temp file,
	// as it would on any filesystem, and its writer sees it.
	if got := m.ok("ls -a $M/app | grep -v '^tmp'"); got != ".\n..\nconfig\nevents\nstacks\n" {
		t.Fatalf("ls -a after refused edits:\n%s", got)
	}
	if got := ownershipNobodyOK(m, "ls $M/app"); got != "config\nevents\nstacks\n" {
		t.Fatalf("another uid lists %q", got)
	}

	// A scratch file is its writer's: another uid can neither read nor replace it.
	m.ok("echo secret > $M/app/mine.toml && chmod 644 $M/app/mine.toml")
	if r := ownershipAsNobody(m, "cat $M/app/mine.toml"); r.Code == 0 || !strings.Contains(r.Stderr, "ermission denied") {
		t.Fatalf("another uid read a scratch file: exit %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if r := ownershipAsNobody(m, "mv $M/app/mine.toml $M/app/config"); r.Code == 0 {
		t.Fatal("another uid renamed a scratch file onto config")
	}
	// Bounded in size and number.
	m.refused("head -c 70000 /dev/zero > $M/app/big.toml", syscall.EFBIG)
	m.ok("rm $M/app/tmp* && for i in $(seq 3 16); do : > $M/app/s$i.toml; done") // with mine and big: 16
	m.refused(": > $M/app/s17.toml", syscall.ENOSPC)
	claimsRefusalEvent(t, m, "app/events", "CONFIG_EDIT_LIMIT", "ENOSPC")
	// And gone with the daemon.
	m.Stop()
	m.start("--allow-other")
	if got := m.ok("ls -a $M/app; cat $M/app/config"); got != ".\n..\nconfig\nevents\nstacks\n"+good {
		t.Fatalf("after a restart:\n%s", got)
	}
	if r := m.sh("cat $M/app/mine.toml"); r.Code == 0 {
		t.Fatal("a scratch file outlived the daemon")
	}
}

// toolsReadmeMakefile is the Makefile of README.md's "A Makefile" section, exactly as shown.
func toolsReadmeMakefile(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "## A Makefile\n")
	_, block, ok2 := strings.Cut(section, "```make\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("README.md has no make block under ## A Makefile")
	}
	return block
}

// The README's Makefile holds a stack the way make users expect: every run re-binds the holder to
// the live session, a dead holder never looks like a claim, it works without USER, and two
// checkouts whose folders share a name get two stacks.
func TestToolsMakefileHoldsTheStack(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 26740})
	makefile := toolsReadmeMakefile(t)
	base := t.TempDir()
	checkout := func(parent string) string {
		dir := filepath.Join(base, parent, "app")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "Makefile"), []byte(makefile), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	a, b := checkout("a"), checkout("b")
	// make's session ends with this setsid: its holder is then dead.
	run := func(dir, script string) string {
		return m.ok("export PATH=" + filepath.Dir(binary) + ":$PATH && cd " + dir + " && setsid bash -c '" + script + "'")
	}
	run(a, "make -s claim M=$M")
	stacks := strings.Fields(m.ok("ls $M/app/stacks"))
	if len(stacks) != 1 || !strings.HasPrefix(stacks[0], "app-") {
		t.Fatalf("stacks after the first make: %v", stacks)
	}
	holder := "$M/app/stacks/" + stacks[0] + "/holders/" + strings.TrimSpace(m.ok("id -un"))
	if got := m.ok("grep ^state= " + holder); got != "state=dead\n" {
		t.Fatalf("the holder of an ended session reads %q", got)
	}
	// The next run, from a live session, re-binds it: live, held by that session.
	out := run(a, "make -s claim M=$M && echo session=$$ && cat "+holder)
	if !strings.Contains(out, "state=live\n") || !strings.Contains(out, "pid="+strings.TrimPrefix(strings.Fields(out)[0], "session=")+"\n") {
		t.Fatalf("after make from a live session:\n%s", out)
	}
	// Without USER.
	if out := run(a, "env -u USER make -s claim M=$M && grep ^state= "+holder); out != "state=live\n" {
		t.Fatalf("make without USER: %q", out)
	}
	// A second checkout whose folder is also called app gets a stack of its own.
	run(b, "make -s claim M=$M")
	if got := strings.Fields(m.ok("ls $M/app/stacks")); len(got) != 2 {
		t.Fatalf("two checkouts named app share stacks %v", got)
	}
	// A touch of a's holder from b (a stack name chosen by hand) is refused, naming a's checkout.
	n := claimsEventCount(m, "app/stacks/"+stacks[0]+"/events")
	r := m.refused("cd "+b+" && touch "+holder, syscall.EINVAL)
	ev := claimsRefusalEvent(t, m, "app/stacks/"+stacks[0]+"/events", "STATE_RECORD_MALFORMED", "EINVAL")
	if !strings.Contains(ev["message"].(string), a) || claimsEventCount(m, "app/stacks/"+stacks[0]+"/events") != n+1 {
		t.Fatalf("refusal %v (stderr %q)", ev, r.Stderr)
	}
	// On a mountpoint no daemon serves, make fails and writes nothing there (root's writes would
	// pass its read-only mode).
	bare := filepath.Join(base, "bare")
	if err := os.Mkdir(bare, 0o555); err != nil {
		t.Fatal(err)
	}
	if r := shIn(t, a, "PATH="+filepath.Dir(binary)+":$PATH make -s claim M="+bare); r.Code == 0 {
		t.Fatalf("make claim on a bare mountpoint exited 0: %s", r.Stderr)
	}
	if entries, err := os.ReadDir(bare); err != nil || len(entries) != 0 {
		t.Fatalf("make wrote into a mountpoint no daemon serves: %v %v", entries, err)
	}
}

// The README's Makefile, exactly as shown, claims from a checkout folder of any name a filesystem
// allows, for a user of any name: `cockpitfs name` maps both to valid names (engine.NameFor).
func TestToolsMakefileAnyName(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(8, map[string]int{"HTTP": 26840})
	makefile := toolsReadmeMakefile(t)
	for folder, stack := range map[string]string{
		"app@v2": "app_v2-", "app+fix": "app_fix-", "café": "caf_-", ".app": "_app-", "my app": "my_app-",
	} {
		dir := filepath.Join(t.TempDir(), folder)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "Makefile"), []byte(makefile), 0o644); err != nil {
			t.Fatal(err)
		}
		r := shIn(t, dir, `PATH="$BIN:$PATH" USER=jane@corp.example make -s claim M="$M" && ls "$M/app/stacks"`,
			"M="+m.Dir, "BIN="+filepath.Dir(binary))
		if r.Code != 0 {
			t.Errorf("make claim in %q: exit %d\n%s%s", folder, r.Code, r.Stdout, r.Stderr)
			continue
		}
		var got string
		for _, s := range strings.Fields(r.Stdout) {
			if strings.HasPrefix(s, stack) {
				got = s
			}
		}
		if got == "" {
			t.Errorf("no stack %s… after make claim in %q: %s", stack, folder, r.Stdout)
			continue
		}
		if holders := m.ok("ls $M/app/stacks/" + got + "/holders"); holders != "jane_corp.example\n" {
			t.Errorf("holders of %s: %q", got, holders)
		}
	}
	// Without cockpitfs on the PATH, make stops, saying so, and claims nothing.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "Makefile"), []byte(makefile), 0o644); err != nil {
		t.Fatal(err)
	}
	r := shIn(t, dir, `PATH=/usr/bin:/bin make -s claim M="$M"`, "M="+m.Dir)
	if r.Code == 0 || !strings.Contains(r.Stderr, "cockpitfs is not on the PATH") {
		t.Errorf("make without cockpitfs on the PATH: exit %d\n%s", r.Code, r.Stderr)
	}
}

// env defines only what the config declares: port keys and declared entrypoints, in any URL
// scheme; shells, python-dotenv and direnv read it as written.
func TestToolsEnvDefinesOnlyWhatIsDeclared(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok(`mkdir $M/app && cat > $M/app/config <<'EOF'
[ports]
step = 10
count = 4
[ports.bases]
DATABASE = 26750
REDIS = 26751
[entrypoints.db]
port = "DATABASE"
path = "/app"
scheme = "postgres"
[entrypoints.cache]
port = "REDIS"
path = "/0"
scheme = "redis"
EOF
mkdir $M/app/stacks/s && touch $M/app/stacks/s/holders/me`)
	want := "DATABASE=26750\nREDIS=26751\nCACHE_URL=redis://127.0.0.1:26751/0\nDB_URL=postgres://127.0.0.1:26750/app\n"
	if got := m.read("app/stacks/s/env"); got != want {
		t.Fatalf("env = %q, want %q", got, want)
	}
	if got := m.ok("set -a; . $M/app/stacks/s/env; set +a; echo ${DATABASE_URL-unset} ${REDIS_URL-unset} $DB_URL"); got != "unset unset postgres://127.0.0.1:26750/app\n" {
		t.Fatalf("sourced env: %q", got)
	}
	// What reads dotenv files reads it as written: the programs .ci/run installs.
	env := m.Path("app/stacks/s/env")
	t.Run("python-dotenv", func(t *testing.T) {
		// Debian's python3-dotenv is for Debian's python3, whatever python3 comes first on PATH.
		testtool.Need(t, "/usr/bin/python3")
		if r := m.sh("/usr/bin/python3 -c 'import dotenv'"); r.Code != 0 {
			testtool.Missing(t, "python3-dotenv")
		}
		got := m.ok(`/usr/bin/python3 -c 'import dotenv, sys; print(sorted(dotenv.dotenv_values(sys.argv[1]).items()))' ` + env)
		if got != "[('CACHE_URL', 'redis://127.0.0.1:26751/0'), ('DATABASE', '26750'), ('DB_URL', 'postgres://127.0.0.1:26750/app'), ('REDIS', '26751')]\n" {
			t.Fatalf("python-dotenv reads %q", got)
		}
	})
	t.Run("direnv", func(t *testing.T) {
		testtool.Need(t, "direnv")
		dir := t.TempDir()
		// Its allow list in a HOME of its own: the test's, not the user's.
		home := "HOME=" + dir + " XDG_DATA_HOME=" + dir + "/data XDG_CONFIG_HOME=" + dir + "/config "
		m.ok("cd " + dir + " && echo 'dotenv " + env + "' > .envrc && " + home + "direnv allow .")
		got := m.ok("cd " + dir + " && " + home + "direnv exec . sh -c 'echo $DB_URL $DATABASE ${DATABASE_URL-unset}'")
		if got != "postgres://127.0.0.1:26750/app 26750 unset\n" {
			t.Fatalf("direnv: %q", got)
		}
	})
	t.Run("docker-compose", func(t *testing.T) {
		testtool.Need(t, "docker-compose")
		dir := t.TempDir()
		compose := "version: \"3.8\"\nservices:\n  db:\n    image: postgres\n    ports: [\"${DATABASE}:5432\"]\n" +
			"  app:\n    image: app\n    environment:\n      DATABASE_URL: ${DB_URL}\n      CACHE: ${CACHE_URL:-none}\n"
		if err := os.WriteFile(filepath.Join(dir, "compose.yml"), []byte(compose), 0o644); err != nil {
			t.Fatal(err)
		}
		// `config` resolves the file and talks to no docker daemon: none is reachable here.
		got := m.ok("cd " + dir + " && DOCKER_HOST=unix://" + dir + "/no-daemon.sock docker-compose --env-file " + env + " -f compose.yml config")
		for _, want := range []string{"published: 26750\n", "DATABASE_URL: postgres://127.0.0.1:26750/app\n", "CACHE: redis://127.0.0.1:26751/0\n"} {
			if !strings.Contains(got, want) {
				t.Fatalf("docker-compose config shows no %q:\n%s", want, got)
			}
		}
	})
	// A prefix keeps every name apart from whatever a tool reads.
	m.ok(`printf '[env]\nprefix = "APP_"\n' >> $M/app/config`)
	if got, want := m.read("app/stacks/s/env"), "APP_DATABASE=26750\nAPP_REDIS=26751\nAPP_CACHE_URL=redis://127.0.0.1:26751/0\nAPP_DB_URL=postgres://127.0.0.1:26750/app\n"; got != want {
		t.Fatalf("env with a prefix = %q, want %q", got, want)
	}
	m.refused(`cat >> $M/app/config <<< 'bad = 1'`, syscall.EINVAL)
}

// bash's printf and echo write a document a line per write(2) and never see a close's errno: a
// line that brings an error no further line can fix is refused at its own write, so bash says
// "write error" and exits 1, with one events line and config unchanged. What only the whole
// document shows (something missing) is refused at close, which bash's builtins do not report:
// the idioms docs/tools.md recommends report it.
func TestToolsConfigBashBuiltins(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app")
	good := toolsConfig(26760)
	claimsConfig(m, "app", good)
	for _, tc := range []struct{ name, script, stderr, message string }{
		{"printf, an unknown key", `printf '[ports]\nstep = 10\nstepp = 10\ncount = 4\n[ports.bases]\nHTTP = 26770\n' > $M/app/config`,
			"printf: write error: Invalid argument", "ports.stepp: unknown key"},
		{"printf, a line that is no TOML", `printf '[ports]\nstep = ten\ncount = 4\n[ports.bases]\nHTTP = 26770\n' > $M/app/config`,
			"printf: write error: Invalid argument", "line 2"},
		{"printf, a key given twice", `printf '[ports]\nstep = 10\ncount = 4\ncount = 5\n[ports.bases]\nHTTP = 26770\n' > $M/app/config`,
			"printf: write error: Invalid argument", "already been defined"},
		{"printf, a value out of range", `printf '[ports]\nstep = 0\ncount = 4\n[ports.bases]\nHTTP = 26770\n' > $M/app/config`,
			"printf: write error: Invalid argument", "ports.step: 0 is less than 1"},
		{"echo -e, a bad scheme on the last line", `echo -e '[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 26770\n[entrypoints.web]\nport = "HTTP"\npath = "/"\nscheme = "HTTP"' > $M/app/config`,
			"echo: write error: Invalid argument", "entrypoints.web.scheme"},
		{"echo >>, an unknown key appended", `echo 'bad = 1' >> $M/app/config`,
			"echo: write error: Invalid argument", "ports.bases.bad"},
		{"printf, count missing when [ports.bases] begins", `printf '[ports]\nstep = 10\n[ports.bases]\nHTTP = 26770\n' > $M/app/config`,
			"printf: write error: Invalid argument", "ports.count: required"},
		{"printf, an entrypoint's port the bases lack", `printf '[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 26770\n[entrypoints.web]\nport = "HTPP"\npath = "/"\n' > $M/app/config`,
			"printf: write error: Invalid argument", `\"HTPP\" is not a key of [ports.bases]`},
		// Missing: only the close knows, and these idioms report the close's errno.
		{"/usr/bin/printf, count missing at the end", `/usr/bin/printf '[ports.bases]\nHTTP = 26770\n[ports]\nstep = 10\n' > $M/app/config`,
			"printf: write error: Invalid argument", "ports.count: required"},
		{"printf | cat, count missing at the end", `printf '[ports.bases]\nHTTP = 26770\n[ports]\nstep = 10\n' | cat > $M/app/config`,
			"cat: write error: Invalid argument", "ports.count: required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := claimsEventCount(m, "app/events")
			r := m.sh(tc.script)
			if r.Code == 0 || !strings.Contains(r.Stderr, tc.stderr) {
				t.Fatalf("exit %d, stderr %q; want a failure saying %q", r.Code, r.Stderr, tc.stderr)
			}
			if got := m.read("app/config"); got != good {
				t.Fatalf("config = %q after a refused document", got)
			}
			lines := strings.Split(strings.TrimSpace(m.read("app/events")), "\n")[n:]
			if len(lines) != 1 || !strings.Contains(lines[0], `"errno":"EINVAL"`) || !strings.Contains(lines[0], tc.message) {
				t.Fatalf("want one refusal naming %q in events, got:\n%s", tc.message, strings.Join(lines, "\n"))
			}
		})
	}
	// A document missing what its last section could still have had: bash's builtin cannot report
	// the close, so it exits 0 with nothing applied, and events says why (docs/tools.md: use cat
	// or /usr/bin/printf).
	n := claimsEventCount(m, "app/events")
	if r := m.sh(`printf '[ports.bases]\nHTTP = 26770\n[ports]\nstep = 10\n' > $M/app/config`); r.Code != 0 || r.Stderr != "" {
		t.Fatalf("bash's printf of a document missing count: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if got := m.read("app/config"); got != good {
		t.Fatalf("config = %q after a refused document", got)
	}
	if lines := strings.Split(strings.TrimSpace(m.read("app/events")), "\n")[n:]; len(lines) != 1 || !strings.Contains(lines[0], "ports.count: required") {
		t.Fatalf("want one refusal in events, got:\n%s", strings.Join(lines, "\n"))
	}
	// Valid documents are applied whatever their lines look like on the way: a value spanning
	// lines, comments and blank lines, an entrypoint before the bases it names.
	for _, doc := range []string{
		`[entrypoints.web]\nport = "HTTP"\n# the path below spans two lines\npath = """\n/app"""\n\n[ports]\nstep = 10\ncount = 4\n[ports.bases]\nHTTP = 26780\n`,
		`[ports.bases]\nHTTP = 26790\n[ports]\nstep = 10\ncount = 4\n`,
	} {
		n := claimsEventCount(m, "app/events")
		m.ok(`printf '` + doc + `' > $M/app/config`)
		if got := m.ok("printf '" + doc + "' | diff - $M/app/config && echo same"); got != "same\n" {
			t.Fatalf("config after printf: %s", got)
		}
		if lines := strings.Split(strings.TrimSpace(m.read("app/events")), "\n")[n:]; len(lines) != 1 || !strings.Contains(lines[0], `"result":"ok"`) {
			t.Fatalf("want the document applied once, events:\n%s", strings.Join(lines, "\n"))
		}
	}
}
