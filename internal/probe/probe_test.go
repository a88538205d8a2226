package probe

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if Child() {
		os.Exit(Serve(os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// A path that exists, one that does not, one whose lookup fails otherwise (ENOTDIR), a link
// (never followed), each answered as os.Lstat answers; a child that dies is replaced at the next
// path.
func TestLstatAnswersAsOsLstat(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "absent"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	p := &Prober{Timeout: 10 * time.Second}
	defer p.Close()
	check := func() {
		t.Helper()
		if err := p.Lstat(file); err != nil {
			t.Errorf("an existing file: %v", err)
		}
		if err := p.Lstat(filepath.Join(dir, "link")); err != nil {
			t.Errorf("a dangling link: %v", err)
		}
		if err := p.Lstat(filepath.Join(dir, "absent\nwith a newline")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("an absent path: %v", err)
		}
		if err := p.Lstat(file + "/below"); err == nil || errors.Is(err, fs.ErrNotExist) || err.Error() != "not a directory" {
			t.Errorf("a path below a file: %v", err)
		}
		if err := p.Lstat("a\x00b"); err == nil {
			t.Error("a path with a NUL byte answered")
		}
	}
	check()
	p.cmd.Process.Kill()
	p.cmd.Wait()
	if err := p.Lstat(file); err == nil {
		t.Error("a dead child answered")
	}
	check()
}
