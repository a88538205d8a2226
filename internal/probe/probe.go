// Package probe tells whether paths exist by asking a child process, killed when a path does not
// answer in time. A path below a stopped FUSE server or a hung network mount holds whatever looks
// at it in the kernel until that server answers — for ever, short of SIGKILL — and a holder's
// checkout path is any user's to choose, so the daemon never looks at one itself.
package probe

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// childEnv marks the process a Prober starts.
const childEnv = "COCKPITFS_PROBE_CHILD"

// NoAnswerError is a path that did not answer within the Prober's timeout. Its child was killed;
// Reaped is closed once it has ended. A kill ends a wait for a server that has not yet taken the
// request (a stopped one); a child whose request a server took and never answers stays until it
// answers, so a caller that meets one asks nothing more on that path's behalf until Reaped.
type NoAnswerError struct {
	Timeout time.Duration
	Reaped  <-chan struct{}
}

func (e *NoAnswerError) Error() string { return fmt.Sprintf("did not answer in %v", e.Timeout) }

// Child reports whether this process is a Prober's child, which must run Serve and nothing else:
// the daemon's main (and a test binary's TestMain) asks first.
func Child() bool { return os.Getenv(childEnv) == "1" }

// Serve says it is ready (a line "r"), then answers each NUL-terminated path read from in with a
// line: "e" (it exists), "g" (no such file or directory), or "? " and the errno's text. It
// returns at the end of in.
func Serve(in io.Reader, out io.Writer) int {
	r, w := bufio.NewReader(in), bufio.NewWriter(out)
	if w.WriteString("r\n"); w.Flush() != nil {
		return 1
	}
	for {
		path, err := r.ReadString(0)
		if err != nil {
			return 0
		}
		_, err = os.Lstat(strings.TrimSuffix(path, "\x00"))
		var errno syscall.Errno
		switch {
		case err == nil:
			w.WriteString("e\n")
		case errors.Is(err, fs.ErrNotExist):
			w.WriteString("g\n")
		case errors.As(err, &errno):
			fmt.Fprintf(w, "? %s\n", errno.Error()) // not the PathError: the path may hold a newline
		default:
			w.WriteString("? unreadable\n")
		}
		if w.Flush() != nil {
			return 1
		}
	}
}

// Prober looks at paths through one child at a time (this program run again, /proc/self/exe).
// A path that does not answer within Timeout has its child killed, and the next path gets a new
// one. Timeout counts from the path's sending to a child that said it is ready: starting one (an
// exec of the daemon's binary, a race-built one's runtime) took seconds on a loaded machine, and
// counted against the path, a checkout that exists was found not to answer, and not looked at
// again for a minute. The start has a bound of its own, StartTimeout (default 5 s), past which
// the path did not answer either: a child runs as the user it looks for, who may stop it before
// it is ready (before its exec too), and must not hold the looks of others for longer. Not for
// concurrent use.
type Prober struct {
	Timeout      time.Duration
	StartTimeout time.Duration
	// As, when set, is who the child runs as, so that a path is looked at with its user's rights
	// and not the caller's. Such a child is that user's to signal, trace and read (/proc): it gets
	// no environment but its mark, and its answers are text the user may have chosen (one short
	// line, or the child is ended; the caller prints them as engine.Printable does any text).
	As      *syscall.Credential
	cmd     *exec.Cmd
	in      io.WriteCloser
	answers chan string
}

// Lstat says whether path exists, as os.Lstat would: nil, an error that is fs.ErrNotExist, the
// errno's error, or a *NoAnswerError (the path, or the child's start, took too long).
func (p *Prober) Lstat(path string) error {
	if strings.IndexByte(path, 0) >= 0 {
		return errors.New("a path holds no NUL byte")
	}
	if p.cmd == nil {
		if err := p.start(); err != nil {
			return err
		}
	}
	if _, err := io.WriteString(p.in, path+"\x00"); err != nil {
		p.Close()
		return fmt.Errorf("probe: %w", err)
	}
	timer := time.NewTimer(p.Timeout)
	defer timer.Stop()
	select {
	case answer, ok := <-p.answers:
		switch {
		case !ok:
			p.Close()
			return errors.New("probe: the child ended without answering")
		case answer == "e":
			return nil
		case answer == "g":
			return fs.ErrNotExist
		case strings.HasPrefix(answer, "? ") && len(answer) <= maxAnswer:
			return errors.New(answer[2:])
		default:
			p.Close()
			return errors.New("probe: the child answered out of turn")
		}
	case <-timer.C:
		return &NoAnswerError{Timeout: p.Timeout, Reaped: p.Close()}
	}
}

// maxAnswer bounds an answer's line: an errno's text is far shorter.
const maxAnswer = 200

func (p *Prober) start() error {
	cmd := exec.Command("/proc/self/exe")
	cmd.Args[0] = os.Args[0] // its name (the daemon's, not the link's `exe`) in ps and pgrep
	cmd.Env = append(os.Environ(), childEnv+"=1")
	if p.As != nil {
		cmd.Env = []string{childEnv + "=1"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.As}
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	// The start's bound counts from the fork: exec's Start returns once the child has executed,
	// and a child running as a user is theirs to stop from its setuid on, before its exec too,
	// for as long as they like. Such a start is ended (killed, reaped) once it returns.
	wait := cmp.Or(p.StartTimeout, startWait)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	started := make(chan error, 1)
	go func() { started <- startChild(cmd) }()
	select {
	case err := <-started:
		if err != nil {
			return fmt.Errorf("probe: %w", err)
		}
	case <-timer.C:
		reaped := make(chan struct{})
		go func() {
			if <-started == nil {
				cmd.Process.Kill()
				cmd.Wait()
			}
			close(reaped)
		}()
		return &NoAnswerError{Timeout: wait, Reaped: reaped}
	}
	answers := make(chan string)
	go func() {
		defer close(answers)
		s := bufio.NewScanner(out)
		for s.Scan() {
			answers <- s.Text()
		}
	}()
	p.cmd, p.in, p.answers = cmd, in, answers
	select {
	case ready, ok := <-answers:
		if ok && ready == "r" {
			return nil
		}
		p.Close()
		return errors.New("probe: the child did not start")
	case <-timer.C:
		return &NoAnswerError{Timeout: wait, Reaped: p.Close()}
	}
}

// startChild starts a child; a test holds it, as a user's SIGSTOP between the child's setuid and
// its exec does.
var startChild = (*exec.Cmd).Start

// startWait is StartTimeout's default: a race-built child started in 0.2–0.4 s on the 2-CPU VM
// at a load of 9.
const startWait = 5 * time.Second

// Close ends the child: killed, since it may be waiting on a path, and reaped apart, so nothing
// here waits on it; the channel is closed once it is.
func (p *Prober) Close() <-chan struct{} {
	reaped := make(chan struct{})
	if p.cmd == nil {
		close(reaped)
		return reaped
	}
	p.in.Close()
	p.cmd.Process.Kill()
	go func(cmd *exec.Cmd, answers chan string) {
		for range answers { // the reader's last line, if any, so that it ends
		}
		cmd.Wait()
		close(reaped)
	}(p.cmd, p.answers)
	p.cmd = nil
	return reaped
}
