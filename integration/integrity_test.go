package integration

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// storeFingerprint is every store file's name and content hash: what "nothing was changed" means.
func storeFingerprint(t *testing.T, data string) string {
	t.Helper()
	entries, err := os.ReadDir(data)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || name == "cockpitfs.log" || name == "cockpitfs.lock" || name == "LOCK" {
			continue
		}
		content, err := os.ReadFile(filepath.Join(data, name))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %x\n", name, sha256.Sum256(content))
	}
	return b.String()
}

// fileContaining returns the store file matching pattern that holds needle.
func fileContaining(t *testing.T, data, pattern, needle string) (string, int) {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(data, pattern))
	for _, p := range paths {
		content, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if at := bytes.Index(content, []byte(needle)); at >= 0 {
			return p, at
		}
	}
	t.Fatalf("no %s in %s holds %q", pattern, data, needle)
	return "", 0
}

func flipByteAt(t *testing.T, path string, at int) {
	t.Helper()
	content, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	content[at] ^= 0x08
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
}

// storeWithBackup leaves a stopped store whose newest rolling backup holds stacks one..four
// and whose store holds five and six besides; crash leaves session two killed, not stopped.
func storeWithBackup(t *testing.T, crash bool) *mount {
	t.Helper()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 21000}, "one", "two", "three", "four")
	m.Stop()
	m.start()
	// The backup taken as the second session starts holds the first session's stacks.
	deadline := time.Now().Add(10 * time.Second)
	for {
		names, _ := filepath.Glob(filepath.Join(m.Data, "backups", "*.backup"))
		if len(names) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no second backup after 10s: %v\n%s", names, m.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	m.ok("mkdir $M/app/stacks/five-lost $M/app/stacks/six-lost")
	if crash {
		m.Kill()
		detach(m.Dir)
	} else {
		m.Stop()
	}
	m.corrupted = true
	return m
}

type cliRun struct {
	out  string
	code int
}

func cockpitfs(t *testing.T, args ...string) cliRun {
	t.Helper()
	return runCLI(t, binary, args...)
}

// plain runs the binary the fault loops kill (plainBinary).
func plain(t *testing.T, args ...string) cliRun {
	t.Helper()
	return runCLI(t, plainBinary, args...)
}

func runCLI(t *testing.T, program string, args ...string) cliRun {
	t.Helper()
	out, err := exec.Command(program, args...).CombinedOutput()
	code := 0
	if exit, ok := err.(*exec.ExitError); ok {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return cliRun{string(out), code}
}

// Each kind of damage: mount refuses naming the file and the way out, verify reports it and
// exits non-zero, neither changes a byte; restore brings back the newest backup and says what
// is lost; the restored store mounts and verifies clean.
func TestDamagedStoreIsRefusedThenRestored(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		crash bool
		// damage breaks the store and returns the file mount and verify must name.
		damage func(t *testing.T, data string) string
	}{
		// five-lost's commit, acknowledged before six-lost's was written.
		{"write-ahead log record before one written once it was durable", true, func(t *testing.T, data string) string {
			path, at := fileContaining(t, data, "*.wal", "five-lost")
			flipByteAt(t, path, at+2)
			return path
		}},
		{"manifest missing", false, func(t *testing.T, data string) string {
			path := filepath.Join(data, "MANIFEST")
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			return path
		}},
		{"manifest damaged", false, func(t *testing.T, data string) string {
			path := filepath.Join(data, "MANIFEST")
			flipByteAt(t, path, 12)
			return path
		}},
		{"table value flipped", false, func(t *testing.T, data string) string {
			path, at := fileContaining(t, data, "*.sst", "three")
			flipByteAt(t, path, at+1)
			return path
		}},
		{"table truncated", false, func(t *testing.T, data string) string {
			path, _ := fileContaining(t, data, "*.sst", "three")
			info, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, info.Size()/2); err != nil {
				t.Fatal(err)
			}
			return path
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := storeWithBackup(t, c.crash)
			file := c.damage(t, m.Data)
			before := storeFingerprint(t, m.Data)

			r := cockpitfs(t, "mount", "--data", m.Data, m.Dir)
			if r.code == 0 || !strings.Contains(r.out, file) || !strings.Contains(r.out, "cockpitfs restore --data "+m.Data) {
				t.Fatalf("mount: want a refusal naming %s and the way out, got exit %d:\n%s", file, r.code, r.out)
			}
			if mounted(m.Dir) {
				t.Fatal("the damaged store was mounted")
			}
			r = cockpitfs(t, "verify", "--data", m.Data)
			if r.code == 0 || !strings.Contains(r.out, file) {
				t.Fatalf("verify: want exit ≠ 0 naming %s, got exit %d:\n%s", file, r.code, r.out)
			}
			if after := storeFingerprint(t, m.Data); after != before {
				t.Fatalf("mount or verify changed the damaged store:\nbefore:\n%safter:\n%s", before, after)
			}

			r = cockpitfs(t, "restore", "--data", m.Data)
			if r.code != 0 || !strings.Contains(r.out, "restored ") || !strings.Contains(r.out, "kept, unchanged, in "+m.Data+"/damaged-") {
				t.Fatalf("restore: exit %d:\n%s", r.code, r.out)
			}
			// What the replaced store still held past the backup is named, or its loss is stated.
			if !strings.Contains(r.out, "five-lost") && !strings.Contains(r.out, "could not be read") {
				t.Errorf("restore does not say five-lost is lost:\n%s", r.out)
			}
			t.Logf("restore said:\n%s", r.out)
			m.corrupted = false
			m.start()
			if got := strings.Fields(m.ok("ls $M/app/stacks")); strings.Join(got, " ") != "four one three two" {
				t.Errorf("restored stacks: %v, want the backup's four", got)
			}
		})
	}
}

// A table damaged while the daemon serves it (bytes of the real .sst changed in place, as the
// daemon has it mapped): the reads that meet the damaged block answer EIO — badger alone reads
// its records as missing, so `cat` said ENOENT and `ls` left the stack out — the log says which
// table and what to do, and the daemon keeps running.
func TestTableDamagedWhileServingAnswersEIO(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 21100}, "sound", "victim-7f3a")
	m.Stop() // the records go into a table
	m.start()
	deadline := time.Now().Add(10 * time.Second)
	for backups, _ := filepath.Glob(filepath.Join(m.Data, "backups", "*.backup")); len(backups) < 2; backups, _ = filepath.Glob(filepath.Join(m.Data, "backups", "*.backup")) {
		if time.Now().After(deadline) {
			t.Fatalf("no backup as the second session started\n%s", m.log)
		}
		time.Sleep(20 * time.Millisecond) // the start's check of every table, before the damage
	}

	path, at := fileContaining(t, m.Data, "*.sst", `"stack":"victim-7f3a"`)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("W"), int64(at+len(`"stack":"`))); err != nil { // victim → Wictim
		t.Fatal(err)
	}
	f.Close()
	m.corrupted = true

	for _, script := range []string{"cat $M/app/stacks/victim-7f3a/record", "ls $M/app/stacks"} {
		r := m.sh(script)
		if r.Code == 0 || !strings.Contains(r.Stderr, "Input/output error") {
			t.Errorf("%s on the damaged table: want EIO, got exit %d\nstdout: %s\nstderr: %s", script, r.Code, r.Stdout, r.Stderr)
		}
	}
	if log := m.log.String(); !strings.Contains(log, path+" is damaged") || !strings.Contains(log, "cockpitfs restore") {
		t.Errorf("the daemon's log does not name the damaged table and the way out:\n%s", log)
	}
	if got := m.ok("head -n 1 $M/README"); got == "" {
		t.Error("README is empty")
	}
	select {
	case err := <-m.done:
		t.Fatalf("the daemon exited: %v\n%s", err, m.log)
	default:
	}
}
