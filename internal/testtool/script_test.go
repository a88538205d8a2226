package testtool

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestScriptNeedsOnlyGo runs the README's test command as a newcomer's machine would: no
// staticcheck or deadcode anywhere, a fresh GOPATH, and a PATH without two programs tests drive
// (strace, systemd-analyze). It passes: the static checks are built from the module proxy, and
// the two tests are skipped and named with the command that installs what they need. Under
// CI=true the same missing program fails its test instead.
func TestScriptNeedsOnlyGo(t *testing.T) {
	if os.Getenv("COCKPITFS_LONG") == "" {
		// A whole second run of the static checks beside the suite's own: a tenth of its CPU.
		t.Skip("a long run: scripts/long runs it")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	path := pathWithout(t, "strace", "systemd-analyze", "staticcheck", "deadcode")
	gopath := t.TempDir()
	env := append(os.Environ(), "PATH="+path, "GOPATH="+gopath, "CI=")
	for _, v := range []string{"GOMODCACHE", "GOCACHE"} { // the downloads and builds already made
		out, err := exec.Command("go", "env", v).Output()
		if err != nil {
			t.Fatal(err)
		}
		env = append(env, v+"="+strings.TrimSpace(string(out)))
	}

	cmd := exec.Command(filepath.Join(root, "scripts/test"), "-run", "^(TestAcknowledgedCommitIsSynced|TestSystemdUnitsVerify)$")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err != nil {
		t.Fatalf("scripts/test without the tools: %v\n%s", err, text)
	}
	for _, want := range []string{
		"check staticcheck: ok",
		"check deadcode: ok",
		"TestAcknowledgedCommitIsSynced: needs strace, which is not installed (sudo ./scripts/setup installs it)",
		"TestSystemdUnitsVerify: needs systemd-analyze, which is not installed (sudo ./scripts/setup installs it)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scripts/test's output lacks %q:\n%s", want, text)
		}
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if last := lines[len(lines)-1]; !regexp.MustCompile(`^\d+ passed, 0 failed, 2 skipped$`).MatchString(last) {
		t.Errorf("its last line: %q, want N passed, 0 failed, 2 skipped", last)
	}
	if _, err := os.Stat(filepath.Join(gopath, "pkg/cockpitfs-tools/v0.8.2/staticcheck")); err != nil {
		t.Errorf("staticcheck was not built under the fresh GOPATH: %v", err)
	}

	// Under CI=true, where scripts/setup ran, the missing program fails the test.
	ci := exec.Command("go", "test", "-count=1", "-run", "^TestAcknowledgedCommitIsSynced$", "./kv/")
	ci.Dir, ci.Env = root, append(env, "CI=true")
	out, err = ci.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "strace is not installed and CI=true: sudo ./scripts/setup installs it") {
		t.Errorf("under CI=true without strace: %v\n%s", err, out)
	}
}

// pathWithout is a PATH of one directory linking every program of this PATH but the ones named.
func pathWithout(t *testing.T, programs ...string) string {
	t.Helper()
	dir := t.TempDir()
	left := map[string]bool{}
	for _, p := range programs {
		left[p] = true
	}
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if left[e.Name()] {
				continue
			}
			// The first of a name on the PATH wins, as for the shell.
			if _, err := os.Lstat(filepath.Join(dir, e.Name())); err == nil {
				continue
			}
			if err := os.Symlink(filepath.Join(d, e.Name()), filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}
