package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/internal/fusefile"
)

// StackArgs name a stack; both default (the server's --cockpit, the stack of its working
// directory as `cockpitfs name stack` names it).
type StackArgs struct {
	Cockpit string `json:"cockpit,omitempty" jsonschema:"the project's cockpit on the mount (default: the server's --cockpit)"`
	Stack   string `json:"stack,omitempty" jsonschema:"the stack (default: the one of this session's working directory, as cockpitfs name stack names it)"`
}

// Lease is a stack's lease as an agent uses it.
type Lease struct {
	Cockpit     string            `json:"cockpit"`
	Stack       string            `json:"stack"`
	StackDir    string            `json:"stack_dir" jsonschema:"the stack's directory on the mount"`
	Holder      string            `json:"holder,omitempty" jsonschema:"this session's holder, when it holds the stack"`
	Ports       map[string]int    `json:"ports" jsonschema:"the leased ports by key: bind these and no others"`
	Env         map[string]string `json:"env" jsonschema:"the stack's env file: each port key and each entrypoint's URL"`
	Entrypoints []Entrypoint      `json:"entrypoints" jsonschema:"the URLs the stack serves"`
	Holders     []Holder          `json:"holders" jsonschema:"everyone who holds the stack"`
}

// Released is what release did.
type Released struct {
	Cockpit  string   `json:"cockpit"`
	Stack    string   `json:"stack"`
	Released string   `json:"released" jsonschema:"the holder released"`
	Holders  []Holder `json:"holders" jsonschema:"who still holds the stack"`
}

// Empty is a call that takes nothing.
type Empty struct{}

func (s *Server) register(srv *mcp.Server) {
	mcp.AddTool(srv, &mcp.Tool{Name: "claim", Description: "Hold a stack for this session (creating it if absent) and get " +
		"its leased ports, env and entrypoint URLs. Call before binding any port; bind only the ports it returns. The hold " +
		"lasts as long as this session's MCP server."}, s.claim)
	mcp.AddTool(srv, &mcp.Tool{Name: "release", Description: "Release this session's hold on a stack. The stack's last " +
		"holder is refused (EBUSY): a running stack is stopped by a drain."}, s.release)
	mcp.AddTool(srv, &mcp.Tool{Name: "env", Description: "A stack's lease: ports, env (KEY=value, as for docker compose " +
		"--env-file) and entrypoint URLs, without claiming it."}, s.env)
	mcp.AddTool(srv, &mcp.Tool{Name: "check_port", Description: "Is this TCP port free to bind? If not, which stack leases " +
		"it or which process listens on it, and this session's own ports to use instead. Call before binding any port.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, s.checkPort)
	mcp.AddTool(srv, &mcp.Tool{Name: "ports", Description: "Every port leased on this machine (which cockpit, stack and " +
		"key) and every TCP port listened on, with the process where it is visible.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, s.ports)
	mcp.AddTool(srv, &mcp.Tool{Name: "status", Description: "The machine at a glance: every cockpit, stack, leased port, " +
		"holder (state, pid, command, checkout) and drain.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, s.status)
	mcp.AddTool(srv, &mcp.Tool{Name: "wait", Description: "Wait until a stack changes (any claim, release, drain step), " +
		"or with port: until that port is free to bind; at most timeout_seconds.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, s.wait)
	mcp.AddTool(srv, &mcp.Tool{Name: "drain", Description: "Request a drain of a stack: sleep (stop its runtime), down or " +
		"reset (stop it, then reclaim each target). This session must hold the stack, alone (claim it first: a claim releases holders whose process died). Returns the " +
		"reservation and the current attempt with its outcome; an executor (the project's own) carries it out."}, s.drain)
}

// claim holds the stack for the session: its holder is created, then bound to the server's own
// process, as `cockpitfs exec` binds its holder to the command's.
func (s *Server) claim(ctx context.Context, _ *mcp.CallToolRequest, in StackArgs) (*mcp.CallToolResult, Lease, error) {
	r, err := s.resolve(in.Cockpit, in.Stack)
	if err != nil {
		return nil, Lease{}, err
	}
	if err := s.served(); err != nil {
		return nil, Lease{}, err
	}
	dir := s.stackDir(r)
	path := filepath.Join(dir, "holders", s.opts.Holder)
	self := []byte("pid=" + strconv.Itoa(s.pid) + "\n")
	f, err := fusefile.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, os.ErrNotExist) {
		// No such stack yet: made, then claimed.
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			if errors.Is(err, os.ErrNotExist) {
				return nil, Lease{}, s.missingCockpit(r)
			}
			return nil, Lease{}, s.mountErr(filepath.Join(s.cockpitDir(r), "events"), err)
		}
		f, err = fusefile.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	}
	if errors.Is(err, os.ErrExist) {
		// The session's own holder: a second claim, or the first one's create retried after
		// EINTR (its holder then names this process's session leader, as a new holder does). One
		// a process of the same holder name left is taken over only when that process is gone.
		sid, _ := unix.Getsid(0)
		switch h := s.holderOf(dir); {
		case h.State == "live" && h.PID == s.pid:
			f, err = nil, nil // held already: nothing to change
		case h.State == "live" && h.PID != sid:
			return nil, Lease{}, &toolError{Errno: "EEXIST", Message: fmt.Sprintf("holder %s of %s/%s is held by the live process %d", s.opts.Holder, r.cockpit, r.stack, h.PID),
				Fix: "start cockpitfs mcp with another --holder"}
		default:
			f, err = fusefile.OpenFile(path, os.O_WRONLY, 0)
		}
	}
	if f != nil {
		_, err = f.Write(self)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return nil, Lease{}, s.mountErr(filepath.Join(dir, "events"), err)
	}
	s.mu.Lock()
	s.claimed[dir] = true
	s.last = dir
	s.mu.Unlock()
	lease, err := s.lease(r)
	return nil, lease, err
}

// holderOf reads the session's holder of the stack at dir.
func (s *Server) holderOf(dir string) Holder {
	holders, _ := s.readHolders(dir)
	for _, h := range holders {
		if h.Name == s.opts.Holder {
			return h
		}
	}
	return Holder{}
}

// lease reads the stack's lease and holders.
func (s *Server) lease(r stackRef) (Lease, error) {
	dir := s.stackDir(r)
	l := Lease{Cockpit: r.cockpit, Stack: r.stack, StackDir: dir}
	var err error
	fail := func(e error) (Lease, error) {
		if errors.Is(e, os.ErrNotExist) {
			if _, serr := os.Stat(s.cockpitDir(r)); serr != nil {
				return Lease{}, s.missingCockpit(r)
			}
			return Lease{}, s.missingStack(r)
		}
		return Lease{}, s.mountErr(filepath.Join(dir, "events"), e)
	}
	if l.Holders, err = s.readHolders(dir); err != nil {
		return fail(err)
	}
	for _, h := range l.Holders {
		if h.Yours {
			l.Holder = h.Name
		}
	}
	if l.Ports, err = readLease(filepath.Join(dir, "lease")); err != nil {
		return fail(err)
	}
	if l.Env, err = readEnv(filepath.Join(dir, "env")); err != nil {
		return fail(err)
	}
	if l.Entrypoints, err = readEntrypoints(filepath.Join(dir, "entrypoints.json")); err != nil {
		return fail(err)
	}
	return l, nil
}

func (s *Server) release(ctx context.Context, _ *mcp.CallToolRequest, in StackArgs) (*mcp.CallToolResult, Released, error) {
	r, err := s.resolve(in.Cockpit, in.Stack)
	if err != nil {
		return nil, Released{}, err
	}
	if err := s.served(); err != nil {
		return nil, Released{}, err
	}
	dir := s.stackDir(r)
	if err := os.Remove(filepath.Join(dir, "holders", s.opts.Holder)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, Released{}, &toolError{Errno: "ENOENT", Message: fmt.Sprintf("this session holds no holder %s on %s/%s", s.opts.Holder, r.cockpit, r.stack), Fix: "nothing to release"}
		}
		return nil, Released{}, s.mountErr(filepath.Join(dir, "events"), err)
	}
	s.mu.Lock()
	delete(s.claimed, dir)
	if s.last == dir {
		s.last = ""
	}
	s.mu.Unlock()
	holders, err := s.readHolders(dir)
	if err != nil {
		return nil, Released{}, s.mountErr(filepath.Join(dir, "events"), err)
	}
	return nil, Released{Cockpit: r.cockpit, Stack: r.stack, Released: s.opts.Holder, Holders: holders}, nil
}

func (s *Server) env(ctx context.Context, _ *mcp.CallToolRequest, in StackArgs) (*mcp.CallToolResult, Lease, error) {
	r, err := s.resolve(in.Cockpit, in.Stack)
	if err != nil {
		return nil, Lease{}, err
	}
	if err := s.served(); err != nil {
		return nil, Lease{}, err
	}
	l, err := s.lease(r)
	return nil, l, err
}

// Status is status.json: the machine at a glance.
type Status struct {
	Cockpits []struct {
		Name   string `json:"name"`
		UID    uint32 `json:"uid"`
		Stacks []struct {
			Name     string         `json:"name"`
			Revision int64          `json:"revision"`
			Ports    map[string]int `json:"ports,omitempty" jsonschema:"the active lease's ports; absent without one"`
			Holders  []struct {
				Name     string `json:"name"`
				State    string `json:"state"`
				PID      int    `json:"pid,omitempty"`
				Command  string `json:"command,omitempty"`
				Checkout string `json:"checkout"`
				UID      uint32 `json:"uid"`
			} `json:"holders"`
			Drain *struct {
				Purpose   string `json:"purpose"`
				Completed int    `json:"completedActions"`
				Actions   int    `json:"actions"`
				Attempt   string `json:"attempt"`
				Stage     string `json:"stage,omitempty"`
				Target    string `json:"target,omitempty"`
			} `json:"drain,omitempty" jsonschema:"the reserved drain; absent without one"`
		} `json:"stacks"`
	} `json:"cockpits"`
	UpdatedAt string `json:"updatedAt"`
}

func (s *Server) status(ctx context.Context, _ *mcp.CallToolRequest, _ Empty) (*mcp.CallToolResult, Status, error) {
	if err := s.served(); err != nil {
		return nil, Status{}, err
	}
	data, err := fusefile.ReadFile(filepath.Join(s.mount, "status.json"))
	if err != nil {
		return nil, Status{}, s.mountErr("", err)
	}
	var st Status
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, Status{}, fmt.Errorf("status.json: %w", err)
	}
	// status.json holds the values others chose as they are, where the text views escape them:
	// spelled as those (and the holders of claim and env) spell them, no control character,
	// bidirectional override or C1 of theirs reaches the agent's host.
	for i := range st.Cockpits {
		for j := range st.Cockpits[i].Stacks {
			stack := &st.Cockpits[i].Stacks[j]
			for k := range stack.Holders {
				h := &stack.Holders[k]
				h.Command, h.Checkout = engine.Printable(h.Command), engine.Printable(h.Checkout)
			}
			if stack.Drain != nil {
				stack.Drain.Target = engine.Printable(stack.Drain.Target)
			}
		}
	}
	return nil, st, nil
}

// DrainArgs is a drain request.
type DrainArgs struct {
	StackArgs
	Action  string   `json:"action" jsonschema:"sleep, down or reset"`
	Targets []string `json:"targets,omitempty" jsonschema:"what down or reset reclaims after stopping the runtime (e.g. volume:db); none for sleep"`
}

// Drain is a stack's drain as its files read.
type Drain struct {
	Cockpit string         `json:"cockpit"`
	Stack   string         `json:"stack"`
	Request map[string]any `json:"request,omitempty" jsonschema:"the reservation (drain/request); absent when there is none"`
	Attempt map[string]any `json:"attempt,omitempty" jsonschema:"the current attempt with its status and outcome (drain/attempt); absent before the first start"`
}

func (s *Server) drain(ctx context.Context, _ *mcp.CallToolRequest, in DrainArgs) (*mcp.CallToolResult, Drain, error) {
	r, err := s.resolve(in.Cockpit, in.Stack)
	if err != nil {
		return nil, Drain{}, err
	}
	switch in.Action {
	case "sleep", "down", "reset":
	default:
		return nil, Drain{}, &toolError{Errno: "EINVAL", Code: "STATE_RECORD_MALFORMED", Message: fmt.Sprintf("drain action %q is unknown", in.Action), Fix: "sleep, down or reset"}
	}
	if err := s.served(); err != nil {
		return nil, Drain{}, err
	}
	// Each target is one word of the request, spelled target=: the daemon splits the line at
	// white space and reads holder=, revision= and valid_for= words as options, so a target with
	// a space would become several and one such word would set an option instead.
	words := []string{in.Action}
	for _, t := range in.Targets {
		if strings.IndexFunc(t, unicode.IsSpace) >= 0 {
			return nil, Drain{}, &toolError{Errno: "EINVAL", Code: "STATE_RECORD_MALFORMED", Message: fmt.Sprintf("drain target %q holds white space", t),
				Fix: "name each target as one element of targets, without white space (volume:db)"}
		}
		words = append(words, "target="+t)
	}
	// Always as this session's holder: without holder= the daemon takes the stack's only holder
	// as the requester, and that may be another live session's, whose servers the drain stops. A
	// holder this stack does not list is refused (ENOENT): a session drains what it holds.
	words = append(words, "holder="+s.opts.Holder)
	dir := s.stackDir(r)
	f, err := fusefile.OpenFile(filepath.Join(dir, "drain", "request"), os.O_WRONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, Drain{}, s.missingStack(r)
	}
	if err == nil {
		_, err = f.Write([]byte(strings.Join(words, " ") + "\n"))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		err = s.mountErr(filepath.Join(dir, "events"), err)
		if te, ok := err.(*toolError); ok && te.Errno == "ENOENT" {
			te.Fix = "claim the stack first (a claim releases holders whose process died): a session drains a stack it holds alone"
		}
		return nil, Drain{}, err
	}
	d := Drain{Cockpit: r.cockpit, Stack: r.stack}
	for _, part := range []struct {
		file string
		into *map[string]any
	}{{"request", &d.Request}, {"attempt", &d.Attempt}} {
		data, err := fusefile.ReadFile(filepath.Join(dir, "drain", part.file))
		if err != nil {
			return nil, Drain{}, s.mountErr(filepath.Join(dir, "events"), err)
		}
		if len(strings.TrimSpace(string(data))) > 0 {
			if err := json.Unmarshal(data, part.into); err != nil {
				return nil, Drain{}, fmt.Errorf("drain/%s: %w", part.file, err)
			}
		}
	}
	return nil, d, nil
}

// WaitArgs say what to wait for.
type WaitArgs struct {
	StackArgs
	Port           int     `json:"port,omitempty" jsonschema:"wait until this port is free to bind instead of for a change of the stack"`
	TimeoutSeconds float64 `json:"timeout_seconds" jsonschema:"how long to wait at most"`
}

// Waited is how a wait ended.
type Waited struct {
	TimedOut bool `json:"timed_out"`
	// Revision is the stack's revision after the change.
	Revision int64      `json:"revision,omitempty"`
	Port     *PortCheck `json:"port,omitempty" jsonschema:"the port's check when the wait ended"`
}

func (s *Server) wait(ctx context.Context, _ *mcp.CallToolRequest, in WaitArgs) (*mcp.CallToolResult, Waited, error) {
	if in.TimeoutSeconds <= 0 {
		return nil, Waited{}, &toolError{Errno: "EINVAL", Message: "timeout_seconds must be more than 0", Fix: "give how long to wait at most"}
	}
	if err := s.served(); err != nil {
		return nil, Waited{}, err
	}
	// A time.Duration holds ≈ 292 years: a longer timeout is that (converted, it would overflow
	// into the past and time out at once).
	timeout := time.Duration(math.MaxInt64)
	if in.TimeoutSeconds < float64(math.MaxInt64)/float64(time.Second) {
		timeout = time.Duration(in.TimeoutSeconds * float64(time.Second))
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if in.Port != 0 {
		return s.waitPort(ctx, in.Port)
	}
	r, err := s.resolve(in.Cockpit, in.Stack)
	if err != nil {
		return nil, Waited{}, err
	}
	dir := s.stackDir(r)
	rev, err := waitFile(ctx, filepath.Join(dir, "wait"))
	switch {
	case errors.Is(err, syscall.EINTR) && ctx.Err() != nil:
		return nil, Waited{TimedOut: true}, nil
	case errors.Is(err, os.ErrNotExist):
		return nil, Waited{}, s.missingStack(r)
	case err != nil:
		return nil, Waited{}, s.mountErr(filepath.Join(dir, "events"), err)
	}
	return nil, Waited{Revision: rev}, nil
}

// waitPort checks the port until it is free or ctx ends. Nothing on the machine says when a
// listener closes, so this polls.
func (s *Server) waitPort(ctx context.Context, port int) (*mcp.CallToolResult, Waited, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := s.check(port)
		if err != nil {
			return nil, Waited{}, err
		}
		if c.Free {
			return nil, Waited{Port: &c}, nil
		}
		select {
		case <-ctx.Done():
			return nil, Waited{TimedOut: true, Port: &c}, nil
		case <-tick.C:
		}
	}
}
