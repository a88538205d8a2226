package integration

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// Writers that take config away before writing it anew — install(1) removes its target, cp
// --backup renames it aside, mv from another filesystem removes it — replace it (docs/tools.md):
// each real binary exits 0 with the new document applied once, and a backup is a file of its
// writer's holding the document config had.

// replaceCase is one such writer: script writes TO where config says FROM; backup is the name it
// moves config aside to ("" for none).
type replaceCase struct{ name, script, backup string }

func TestToolsConfigReplacedByTakingItAway(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app")
	port := 26900
	claimsConfig(m, "app", toolsConfig(port))
	dir := t.TempDir() // another filesystem than the mount
	newDoc := "sed s/FROM/TO/ $M/app/config > " + dir + "/new.toml && "
	listed := []string{".", "..", "config", "events", "stacks"}
	for _, tc := range []replaceCase{
		{"install -m 0644", newDoc + "install -m 0644 " + dir + "/new.toml $M/app/config", ""},
		// install's own mode is 0755: its chmod of config after the close changes nothing, as a
		// copy's restoring its mode does.
		{"install", newDoc + "install " + dir + "/new.toml $M/app/config", ""},
		{"cp --backup", newDoc + "cp --backup " + dir + "/new.toml $M/app/config", "config~"},
		{"cp --backup=numbered", newDoc + "cp --backup=numbered " + dir + "/new.toml $M/app/config", "config.~1~"},
		{"cp --backup=numbered again", newDoc + "cp --backup=numbered " + dir + "/new.toml $M/app/config", "config.~2~"},
		// config~ again, read before: the backup read after is the new one.
		{"cp --backup=simple over config~", "cat $M/app/config~ > /dev/null && " + newDoc + "cp --backup=simple " + dir + "/new.toml $M/app/config", "config~"},
		{"install --backup", newDoc + "install -m 0644 --backup=numbered " + dir + "/new.toml $M/app/config", "config.~3~"},
		// GNU mv cannot rename across filesystems: it removes config, then creates and copies it.
		{"mv from another filesystem", newDoc + "mv " + dir + "/new.toml $M/app/config && ! test -e " + dir + "/new.toml", ""},
		{"mv from /tmp", "f=$(mktemp -p /tmp) && sed s/FROM/TO/ $M/app/config > $f && mv $f $M/app/config && ! test -e $f", ""},
		// A script's own remove-then-create, reading the old document through a descriptor it
		// keeps open meanwhile.
		{"python unlink, then create", `python3 -c 'import os, sys
p = sys.argv[1]
with open(p) as old:
    doc = old.read().replace("FROM", "TO")
    os.unlink(p)
    with open(p, "x") as new:
        new.write(doc)' $M/app/config`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.HasPrefix(tc.script, "python3") {
				testtool.Need(t, "python3")
			}
			from := port
			editApplied(t, m, tc.script, from, from+1)
			port++
			if tc.backup != "" {
				if got := m.read("app", tc.backup); got != toolsConfig(from) {
					t.Fatalf("%s = %q, want the document config had, %q", tc.backup, got, toolsConfig(from))
				}
				if got := m.ok("stat -c '%A %U' $M/app/" + tc.backup); got != "-rw-r--r-- root\n" {
					t.Fatalf("%s: %s", tc.backup, got)
				}
				if !slices.Contains(listed, tc.backup) {
					listed = append(listed, tc.backup)
				}
			}
			if got, want := namesOf(m.ok("ls -a $M/app")), namesOf(strings.Join(listed, "\n")); got != want {
				t.Fatalf("ls -a lists %s, want %s", got, want)
			}
		})
	}
	// A backup is its writer's: restoring it is a rename onto config, and removing it an rm.
	m.ok("mv $M/app/config.~1~ $M/app/config && rm $M/app/config~ $M/app/config.~2~ $M/app/config.~3~")
	if got := m.read("app/config"); got != toolsConfig(26903) {
		t.Fatalf("config after restoring config.~1~: %q", got)
	}
	if got := m.ok("ls -a $M/app"); got != ".\n..\nconfig\nevents\nstacks\n" {
		t.Fatalf("ls -a after removing the backups:\n%s", got)
	}
}

// namesOf is the lines of a listing, sorted, on one line.
func namesOf(listing string) string {
	names := strings.Fields(listing)
	slices.Sort(names)
	return strings.Join(names, " ")
}

// replaceFifo makes a FIFO for a writer to copy from: the writer takes config away, then blocks
// opening it, until the test writes.
func replaceFifo(t *testing.T) string {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "new.toml")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	return fifo
}

// replaceWriterWaits waits until a writer has opened fifo to read from it, having taken config
// away, and returns the FIFO's other end.
func replaceWriterWaits(t *testing.T, fifo string) *os.File {
	t.Helper()
	var fd int
	waitFor(t, func() string { return "the writer to open " + fifo }, func() bool {
		var err error
		fd, err = unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil && !errors.Is(err, unix.ENXIO) {
			t.Fatal(err)
		}
		return err == nil
	})
	return os.NewFile(uintptr(fd), fifo)
}

// Between taking config away and closing the new one, every other process reads the old document
// whole, and lists config; the close applies the new one. A writer killed in between, or one that
// takes config away and exits (rm), leaves config as it was and one events line.
func TestToolsConfigReplacementKeepsConfigWhole(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app")
	old := toolsConfig(26920)
	claimsConfig(m, "app", old)

	for _, writer := range []string{"install -m 0644", "cp --backup=simple"} {
		t.Run(writer, func(t *testing.T) {
			fifo := replaceFifo(t)
			n := claimsEventCount(m, "app/events")
			w := startReader(t, m, "exec "+writer+" "+fifo+" $M/app/config")
			src := replaceWriterWaits(t, fifo)
			if got := m.ok("cat $M/app/config; ls $M/app | grep -x config"); got != old+"config\n" {
				t.Fatalf("while %s replaces config, another process reads:\n%s", writer, got)
			}
			if _, err := src.WriteString(toolsConfig(26921)); err != nil {
				t.Fatal(err)
			}
			src.Close()
			if out := w.wait(t); w.cmd.ProcessState.ExitCode() != 0 {
				t.Fatalf("%s: exit %d\n%s", writer, w.cmd.ProcessState.ExitCode(), out)
			}
			if got := m.read("app/config"); got != toolsConfig(26921) {
				t.Fatalf("config = %q", got)
			}
			if got := claimsEventCount(m, "app/events"); got != n+1 || !strings.Contains(m.lastEvent("app/events"), `"result":"ok"`) {
				t.Fatalf("%d events lines, the last %s", got-n, m.lastEvent("app/events"))
			}
			claimsConfig(m, "app", old)
		})
	}

	// Killed after taking config away, before creating it again: a writer that unlinks config,
	// then waits on a FIFO before its create (install itself goes from its unlink to its create
	// without a pause a test could kill it in).
	t.Run("killed between unlink and create", func(t *testing.T) {
		testtool.Need(t, "python3")
		fifo := replaceFifo(t)
		n := claimsEventCount(m, "app/events")
		w := startReader(t, m, `exec python3 -c 'import os, sys
os.unlink(sys.argv[2])
open(sys.argv[1]).read()
open(sys.argv[2], "x").write("never")' `+fifo+" $M/app/config")
		defer replaceWriterWaits(t, fifo).Close()
		w.cmd.Process.Kill()
		w.wait(t)
		waitFor(t, func() string { return "an events line" }, func() bool { return claimsEventCount(m, "app/events") == n+1 })
		ev := claimsRefusalEvent(t, m, "app/events", "WRITE_ABANDONED", "ECANCELED")
		if ev["op"] != "unlink" || ev["pid"] != float64(w.cmd.Process.Pid) || !strings.Contains(ev["message"].(string), "config stays as it was") {
			t.Fatalf("events line %v", ev)
		}
		if got := m.read("app/config"); got != old {
			t.Fatalf("config = %q", got)
		}
	})
	// Killed after creating it again, half of the new document written: nothing of it applies,
	// and the backup stays, holding what config holds.
	t.Run("cp --backup killed", func(t *testing.T) {
		fifo := replaceFifo(t)
		n := claimsEventCount(m, "app/events")
		w := startReader(t, m, "exec cp --backup=simple "+fifo+" $M/app/config")
		src := replaceWriterWaits(t, fifo)
		defer src.Close()
		if _, err := src.WriteString("[ports]\nstep = 10\n"); err != nil {
			t.Fatal(err)
		}
		// cp has created config once it writes what it read: the FIFO drained.
		waitFor(t, func() string { return "cp to read what was written" }, func() bool {
			pending, err := unix.IoctlGetInt(int(src.Fd()), unix.TIOCINQ)
			return err == nil && pending == 0
		})
		w.cmd.Process.Kill()
		w.wait(t)
		waitFor(t, func() string { return "an events line" }, func() bool { return claimsEventCount(m, "app/events") == n+1 })
		ev := claimsRefusalEvent(t, m, "app/events", "WRITE_ABANDONED", "ECANCELED")
		if !strings.Contains(ev["message"].(string), "SIGKILL") {
			t.Fatalf("events line %v", ev)
		}
		if got := m.ok("cat $M/app/config $M/app/config~"); got != old+old {
			t.Fatalf("config and config~:\n%s", got)
		}
		m.ok("rm $M/app/config~")
	})
	// rm only removes: it is refused where it is typed, config stays, one events line.
	t.Run("rm config", func(t *testing.T) {
		n := claimsEventCount(m, "app/events")
		m.refused("rm $M/app/config", syscall.EPERM)
		if got := claimsEventCount(m, "app/events"); got != n+1 {
			t.Fatalf("%d events lines", got-n)
		}
		ev := claimsRefusalEvent(t, m, "app/events", "UNSUPPORTED_OPERATION", "EPERM")
		if ev["op"] != "unlink" || !strings.Contains(ev["fix"].(string), "cp new.toml config") {
			t.Fatalf("events line %v", ev)
		}
		if got := m.ok("cat $M/app/config; ls $M/app | grep -x config"); got != old+"config\n" {
			t.Fatalf("config after rm:\n%s", got)
		}
	})
	// A script that takes config away and exits without writing it again: config stays, and the
	// events line says the replacement was abandoned.
	t.Run("taken away and abandoned", func(t *testing.T) {
		testtool.Need(t, "python3")
		n := claimsEventCount(m, "app/events")
		m.ok(`python3 -c 'import os, sys; os.unlink(sys.argv[1])' $M/app/config`)
		waitFor(t, func() string { return "an events line" }, func() bool { return claimsEventCount(m, "app/events") == n+1 })
		ev := claimsRefusalEvent(t, m, "app/events", "WRITE_ABANDONED", "ECANCELED")
		if ev["op"] != "unlink" || !strings.Contains(ev["fix"].(string), "replaced, not removed") {
			t.Fatalf("events line %v", ev)
		}
		if got := m.read("app/config"); got != old {
			t.Fatalf("config = %q", got)
		}
	})
}

// What such a writer cannot do is refused where it is typed, with one events line, and config
// stays as it was: a refused document (at the close), another user's config or scratch file, a
// backup name the tree does not make. Another user's scratch files cannot fill the cockpit's 16:
// the owner's sed -i still works after them.
func TestToolsConfigReplacementRefusals(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other")
	m.ok("mkdir $M/app")
	good := toolsConfig(26930)
	claimsConfig(m, "app", good)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[ports]\nstep = 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, script, stderr, code string
		errno                      syscall.Errno
		as                         func(*mount, string) result
	}{
		{"install of a refused document", "install -m 0644 " + bad + " $M/app/config", "failed to close", "PORT_FAMILY_OUT_OF_RANGE", syscall.EINVAL, (*mount).sh},
		// cp puts its backup back when the copy fails, as on a disk: nothing is left beside config.
		{"cp --backup of a refused document", "cp --backup " + bad + " $M/app/config", "failed to close", "PORT_FAMILY_OUT_OF_RANGE", syscall.EINVAL, (*mount).sh},
		{"mv of a refused document from another filesystem", "cp " + bad + " " + dir + "/mv.toml && mv " + dir + "/mv.toml $M/app/config; r=$?; test -e " + dir + "/mv.toml || { echo mv removed its source >&2; exit 0; }; exit $r", "mv:", "PORT_FAMILY_OUT_OF_RANGE", syscall.EINVAL, (*mount).sh},
		{"another user's install", "f=$(mktemp -p /tmp) && cat $M/app/config > $f && install -m 0644 $f $M/app/config; r=$?; rm -f $f; exit $r", "cannot remove", "PERMISSION_DENIED", syscall.EACCES, ownershipAsNobody},
		{"another user's cp --backup", "f=$(mktemp -p /tmp) && cat $M/app/config > $f && cp --backup $f $M/app/config; r=$?; rm -f $f; exit $r", "cannot backup", "PERMISSION_DENIED", syscall.EACCES, ownershipAsNobody},
		{"cp --backup --suffix", "cp --backup --suffix=.bak " + bad + " $M/app/config", "cannot backup", "UNSUPPORTED_OPERATION", syscall.EPERM, (*mount).sh},
		{"another user's scratch file", ": > $M/app/junk", "junk", "PERMISSION_DENIED", syscall.EACCES, ownershipAsNobody},
		{"another user's sed -i", "sed -i s/26930/26990/ $M/app/config", "temporary file", "PERMISSION_DENIED", syscall.EACCES, ownershipAsNobody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := claimsEventCount(m, "app/events")
			r := tc.as(m, tc.script)
			if r.Code == 0 || !strings.Contains(r.Stderr, tc.stderr) || !strings.Contains(strings.ToLower(r.Stderr), tc.errno.Error()) {
				t.Fatalf("exit %d, stderr %q: want a refusal saying %q and %q", r.Code, r.Stderr, tc.stderr, tc.errno.Error())
			}
			if got := m.read("app/config"); got != good {
				t.Fatalf("config = %q after a refusal", got)
			}
			if got := m.ok("ls -a $M/app"); got != ".\n..\nconfig\nevents\nstacks\n" {
				t.Fatalf("ls -a after a refusal:\n%s", got)
			}
			if got := claimsEventCount(m, "app/events"); got != n+1 {
				t.Fatalf("%d events lines for one refusal", got-n)
			}
			ev := claimsRefusalEvent(t, m, "app/events", tc.code, unix.ErrnoName(tc.errno))
			if ev["fix"] == "" {
				t.Fatalf("events line without a fix: %v", ev)
			}
		})
	}
	ownershipAsNobody(m, "for i in $(seq 17); do : > $M/app/junk$i; done")
	m.ok("sed -i s/26930/26990/ $M/app/config")
	if got := m.read("app/config"); got != strings.ReplaceAll(good, "26930", "26990") {
		t.Fatalf("config after the owner's sed -i = %q", got)
	}
}

// Replacements are bounded as scratch files are: 16 under way in a cockpit, and a backup is a
// scratch file, so past either bound the removal or the rename aside is refused (ENOSPC), once,
// with config as it was.
func TestToolsConfigReplacementBounds(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app")
	good := toolsConfig(26940)
	claimsConfig(m, "app", good)

	var writers []*reader
	var sources []*os.File
	for range 16 {
		fifo := replaceFifo(t)
		writers = append(writers, startReader(t, m, "exec install -m 0644 "+fifo+" $M/app/config"))
		sources = append(sources, replaceWriterWaits(t, fifo))
	}
	n := claimsEventCount(m, "app/events")
	r := m.sh(`python3 -c 'import os, sys; os.unlink(sys.argv[1])' $M/app/config`)
	if r.Code == 0 || !strings.Contains(strings.ToLower(r.Stderr), strings.ToLower(syscall.ENOSPC.Error())) {
		t.Fatalf("a 17th replacement: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if got := claimsEventCount(m, "app/events"); got != n+1 || m.read("app/config") != good {
		t.Fatalf("%d events lines, config %q", got-n, m.read("app/config"))
	}
	claimsRefusalEvent(t, m, "app/events", "CONFIG_EDIT_LIMIT", "ENOSPC")
	for i, src := range sources {
		if _, err := src.WriteString(good); err != nil {
			t.Fatal(err)
		}
		src.Close()
		if out := writers[i].wait(t); writers[i].cmd.ProcessState.ExitCode() != 0 {
			t.Fatalf("install %d: %s", i, out)
		}
	}

	m.ok("for i in $(seq 1 16); do : > $M/app/s$i.toml; done")
	n = claimsEventCount(m, "app/events")
	r = m.sh("cp --backup $M/app/s1.toml $M/app/config")
	if r.Code == 0 || !strings.Contains(r.Stderr, "cannot backup") || !strings.Contains(strings.ToLower(r.Stderr), syscall.ENOSPC.Error()) {
		t.Fatalf("a backup past 16 scratch files: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if got := claimsEventCount(m, "app/events"); got != n+1 || m.read("app/config") != good {
		t.Fatalf("%d events lines, config %q", got-n, m.read("app/config"))
	}
	claimsRefusalEvent(t, m, "app/events", "CONFIG_EDIT_LIMIT", "ENOSPC")
}

// A script that renames config aside and creates it again, reading the old document through a
// descriptor it keeps open, and starting a child between two writes of the new one: the child's
// close of the copy it inherited ends nothing, and the read descriptor is no duplicate of the
// write. The document applies whole at the script's close, or is refused there, with its errno.
func TestConfigReplacementChildEndsNothing(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "python3")
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 46900})
	const python = `python3 - "$M/app/config" "$DOC" <<'EOF'
import os, subprocess, sys
p = sys.argv[1]
with open(p) as old:
    old.read()
    os.rename(p, p + "~")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    first, rest = sys.argv[2].encode().split(b"|")
    os.write(fd, first)
    subprocess.run(["true"], check=True)
    os.write(fd, rest)
    try:
        os.close(fd)
        print("closed")
    except OSError as e:
        print("close:", e.strerror)
os.unlink(p + "~")
print(os.getpid())
EOF`
	config := m.read("app/config")
	n := claimsEventCount(m, "app/events")
	out := m.ok(`DOC=$(printf '` + configHead + `HTTP = 46910\n|DB = 46910\n'); ` + python)
	if !strings.HasPrefix(out, "close: Invalid argument\n") {
		t.Fatalf("a refused replacement's close: %q", out)
	}
	if got := m.read("app/config"); got != config {
		t.Fatalf("a refused replacement was applied in part:\n%s", got)
	}
	oneEvent(t, m, "app/events", n, "refused", "PORT_FAMILY_OUT_OF_RANGE", lastPid(t, out))
	n = claimsEventCount(m, "app/events")
	out = m.ok(`DOC=$(printf '` + configHead + `HTTP = 46920\n|DB = 46960\n'); ` + python)
	if !strings.HasPrefix(out, "closed\n") {
		t.Fatalf("a replacement's close: %q", out)
	}
	oneEvent(t, m, "app/events", n, "ok", "", lastPid(t, out))
	if got := m.read("app/config"); !strings.Contains(got, "HTTP = 46920") || !strings.Contains(got, "DB = 46960") {
		t.Fatalf("config after its replacement:\n%s", got)
	}
}
