package probe

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// slowStartEnv, in a child's environment, is how long it takes to start (a loaded machine's).
const slowStartEnv = "PROBE_TEST_START_DELAY"

func TestMain(m *testing.M) {
	if Child() {
		if d, err := time.ParseDuration(os.Getenv(slowStartEnv)); err == nil {
			time.Sleep(d)
		}
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

// A child slow to start (an exec of a race-built daemon on a loaded machine took seconds) is not
// a path that does not answer: Timeout counts from the path's sending to a ready child, and an
// existing path is found to exist.
func TestLstatTimeoutExcludesTheChildsStart(t *testing.T) {
	t.Setenv(slowStartEnv, "1500ms")
	p := &Prober{Timeout: 500 * time.Millisecond}
	defer p.Close()
	if err := p.Lstat(t.TempDir()); err != nil {
		t.Fatalf("an existing directory, through a child that took 1.5s to start: %v", err)
	}
}

// A child that is not ready within StartTimeout (its user stopped it, say) is a path that did not
// answer: killed and reaped, and the look ends then.
func TestStartTimeoutIsNoAnswer(t *testing.T) {
	t.Setenv(slowStartEnv, "1h")
	p := &Prober{Timeout: 500 * time.Millisecond, StartTimeout: 300 * time.Millisecond}
	defer p.Close()
	err := p.Lstat(t.TempDir())
	var na *NoAnswerError
	if !errors.As(err, &na) {
		t.Fatalf("a child never ready: %v, want a NoAnswerError", err)
	}
	select {
	case <-na.Reaped:
	case <-time.After(10 * time.Second):
		t.Fatal("the child that never got ready was not ended")
	}
}

// A child its user stopped before its exec (it runs as them from its setuid on) holds exec's
// Start, which returns only once the child has executed: the start waited on it for as long as
// the user liked, and with it every survey meeting their uid (the sweep, root's cat gc). The
// start's bound counts from the fork: the look ends as one that did not answer, and the child
// is ended once its start returns.
func TestStartTimeoutHoldsBeforeTheExec(t *testing.T) {
	hold := make(chan struct{})
	startChild = func(cmd *exec.Cmd) error {
		<-hold
		return cmd.Start()
	}
	t.Cleanup(func() { startChild = (*exec.Cmd).Start })
	p := &Prober{Timeout: 500 * time.Millisecond, StartTimeout: 300 * time.Millisecond}
	defer p.Close()
	looked := make(chan error, 1)
	go func() { looked <- p.Lstat(t.TempDir()) }()
	var err error
	select {
	case err = <-looked:
	case <-time.After(5 * time.Second):
		close(hold)
		t.Fatal("a child held before its exec held the look past its start's bound")
	}
	var na *NoAnswerError
	if !errors.As(err, &na) {
		t.Fatalf("a child held before its exec: %v, want a NoAnswerError", err)
	}
	select {
	case <-na.Reaped:
		t.Fatal("reaped while its start is still held")
	case <-time.After(100 * time.Millisecond):
	}
	close(hold)
	select {
	case <-na.Reaped:
	case <-time.After(10 * time.Second):
		t.Fatal("the child held before its exec was not ended once its start returned")
	}
}
