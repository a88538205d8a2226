package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/internal/fusefile"
	"github.com/cockpitfs/cockpitfs/internal/mountinfo"
	"github.com/cockpitfs/cockpitfs/internal/shell"
)

// mountType is the filesystem type /proc/self/mountinfo gives a cockpitfs mount (fs.MountType;
// not imported, so this package needs no FUSE).
const mountType = "fuse.cockpitfs"

// toolError is what every failed tool call carries as its text: a refusal of the mount's (its
// errno and the code, message and fix of its events line) or the server's own.
type toolError struct {
	Errno   string `json:"errno,omitempty"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
	Fix     string `json:"fix,omitempty"`
}

func (e *toolError) Error() string {
	b, _ := json.Marshal(e)
	return string(b)
}

// served refuses when no daemon serves the mount: every tool's first step, so that nothing is
// ever written into the bare directory beneath it (root's writes pass its read-only mode).
func (s *Server) served() error {
	if m, err := mountinfo.Of(s.mount); err != nil || m.Type != mountType {
		return s.notServed()
	}
	return nil
}

func (s *Server) notServed() error {
	return &toolError{
		Code:    "NOT_MOUNTED",
		Message: fmt.Sprintf("no cockpitfs daemon serves %s", s.mount),
		Fix:     "start one: cockpitfs mount --daemon " + shell.Quote(s.mount) + mountinfo.RestartNeedsNote(s.mount),
	}
}

// mountErr turns err from an operation on path below the mount into the tool's error: a dead
// mount is said to be one, an errno comes with the refusal the daemon recorded in events (the
// nearest events file, dir's own or its cockpit's).
func (s *Server) mountErr(events string, err error) error {
	var te *toolError
	if errors.As(err, &te) {
		return te
	}
	// ECONNABORTED: the daemon died while the request (a wait) was under way.
	if errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED) {
		return s.notServed()
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return &toolError{Message: err.Error()}
	}
	if r := s.lastRefusal(events, errno); r != nil {
		return r
	}
	return &toolError{Errno: unix.ErrnoName(errno), Message: err.Error()}
}

// lastRefusal is the last refusal of this process's in the events file, if it has errno's name.
func (s *Server) lastRefusal(events string, errno syscall.Errno) *toolError {
	data, err := fusefile.ReadFile(events)
	if err != nil {
		return nil
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var line struct {
			PID     int    `json:"pid"`
			Result  string `json:"result"`
			Errno   string `json:"errno"`
			Code    string `json:"code"`
			Message string `json:"message"`
			Fix     string `json:"fix"`
		}
		if json.Unmarshal([]byte(lines[i]), &line) != nil || line.Result != "refused" || line.PID != s.pid {
			continue
		}
		if line.Errno != unix.ErrnoName(errno) {
			return nil
		}
		return &toolError{Errno: line.Errno, Code: line.Code, Message: line.Message, Fix: line.Fix}
	}
	return nil
}

// stackRef is a stack the call names, or the session's default.
type stackRef struct {
	cockpit, stack string
}

// resolve fills in the defaults of a call's cockpit and stack and checks both are names (a
// path would reach outside the cockpit).
func (s *Server) resolve(cockpit, stack string) (stackRef, error) {
	if cockpit == "" {
		cockpit = s.opts.Cockpit
	}
	if cockpit == "" {
		return stackRef{}, s.noCockpit()
	}
	if stack == "" {
		stack = engine.StackNameFor(s.opts.Dir)
	}
	for _, n := range []struct{ kind, name string }{{"cockpit", cockpit}, {"stack", stack}} {
		if !engine.ValidName(n.name) {
			return stackRef{}, &toolError{Errno: "EINVAL", Code: "STATE_RECORD_MALFORMED",
				Message: fmt.Sprintf("%s name %q is invalid", n.kind, n.name),
				Fix:     engine.NameRule}
		}
	}
	return stackRef{cockpit, stack}, nil
}

// noCockpit says which cockpits there are to choose from.
func (s *Server) noCockpit() error {
	names := s.cockpits()
	fix := "name the cockpit (the project's namespace on the mount)"
	if len(names) > 0 {
		fix += ": one of " + strings.Join(names, ", ")
	}
	return &toolError{Errno: "EINVAL", Code: "STATE_RECORD_MALFORMED", Message: "no cockpit given, and the server has no default (cockpitfs mcp --cockpit NAME)", Fix: fix}
}

// cockpits lists the mount's cockpits.
func (s *Server) cockpits() []string {
	entries, _ := os.ReadDir(s.mount)
	var names []string
	for _, e := range entries {
		if e.IsDir() && e.Name() != "ports" {
			names = append(names, e.Name())
		}
	}
	return names
}

func (s *Server) cockpitDir(r stackRef) string { return filepath.Join(s.mount, r.cockpit) }

func (s *Server) stackDir(r stackRef) string {
	return filepath.Join(s.mount, r.cockpit, "stacks", r.stack)
}

// missingCockpit is the error for a cockpit that is not on the mount.
func (s *Server) missingCockpit(r stackRef) error {
	fix := fmt.Sprintf("create it: mkdir %s, then write its port declaration to %s/config (docs/spec.md §3)",
		shell.Quote(s.cockpitDir(r)), shell.Quote(s.cockpitDir(r)))
	if names := s.cockpits(); len(names) > 0 {
		fix = "use one of " + strings.Join(names, ", ") + "; or " + fix
	}
	return &toolError{Errno: "ENOENT", Message: fmt.Sprintf("there is no cockpit %q on %s", r.cockpit, s.mount), Fix: fix}
}

// missingStack is the error for a stack that is not on the mount.
func (s *Server) missingStack(r stackRef) error {
	return &toolError{Errno: "ENOENT", Message: fmt.Sprintf("there is no stack %s/%s", r.cockpit, r.stack), Fix: "claim it (claim creates it)"}
}

// readLease reads the ports of a stack's active lease from its lease file: key=value lines, the
// ports' keys upper-case (docs/spec.md §2), the lease's own fields lower-case. One file, where
// ports/ takes a listing and a read per key.
func readLease(path string) (map[string]int, error) {
	data, err := fusefile.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]int{}, nil
	}
	if err != nil {
		return nil, err
	}
	ports := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, _ := strings.Cut(line, "=")
		if k == "released" && v == "true" {
			return map[string]int{}, nil
		}
		if p, err := strconv.Atoi(v); err == nil && k != "" && k == strings.ToUpper(k) && k[0] >= 'A' && k[0] <= 'Z' {
			ports[k] = p
		}
	}
	return ports, nil
}

// readEnv reads a stack's env file: KEY=value lines. A stack without a lease has none.
func readEnv(path string) (map[string]string, error) {
	f, err := fusefile.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && !strings.HasPrefix(k, "#") {
			env[k] = v
		}
	}
	return env, sc.Err()
}

// Entrypoint is one URL the stack's lease serves.
type Entrypoint struct {
	Name string `json:"name"`
	Kind string `json:"kind" jsonschema:"what the URL is for: entrypoint, oauth-callback, webhook…"`
	Port string `json:"port" jsonschema:"the port key it is served on"`
	URL  string `json:"url"`
}

// readEntrypoints reads entrypoints.json: none without a lease, or while the config's
// entrypoints refer to keys the lease lacks.
func readEntrypoints(path string) ([]Entrypoint, error) {
	data, err := fusefile.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return []Entrypoint{}, nil
	}
	if err != nil {
		return nil, err
	}
	var doc struct {
		Values []struct {
			Name, Kind, Port, Value string
		} `json:"values"`
	}
	eps := []Entrypoint{}
	if len(strings.TrimSpace(string(data))) == 0 {
		return eps, nil
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, v := range doc.Values {
		eps = append(eps, Entrypoint{Name: v.Name, Kind: v.Kind, Port: v.Port, URL: v.Value})
	}
	return eps, nil
}

// Holder is one holder of a stack, as its file reads.
type Holder struct {
	Name     string `json:"name"`
	State    string `json:"state" jsonschema:"live, dead, unknown or untracked (no pid)"`
	PID      int    `json:"pid,omitempty"`
	Checkout string `json:"checkout,omitempty" jsonschema:"the checkout (working directory) it claimed from"`
	Yours    bool   `json:"yours,omitempty" jsonschema:"this session's own holder"`
}

// readHolders reads every holder file of the stack at dir.
func (s *Server) readHolders(dir string) ([]Holder, error) {
	entries, err := os.ReadDir(filepath.Join(dir, "holders"))
	if err != nil {
		return nil, err
	}
	holders := []Holder{}
	for _, e := range entries {
		data, err := fusefile.ReadFile(filepath.Join(dir, "holders", e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // released between the listing and the read
		}
		if err != nil {
			return nil, err
		}
		h := Holder{Name: e.Name()}
		for _, line := range strings.Split(string(data), "\n") {
			k, v, _ := strings.Cut(line, "=")
			switch k {
			case "state":
				h.State = v
			case "pid":
				h.PID, _ = strconv.Atoi(v)
			case "checkout_path":
				h.Checkout = v
			}
		}
		h.Yours = h.Name == s.opts.Holder && h.PID == s.pid
		holders = append(holders, h)
	}
	sort.Slice(holders, func(i, j int) bool { return holders[i].Name < holders[j].Name })
	return holders, nil
}
