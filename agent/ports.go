package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/listeners"
	"github.com/cockpitfs/cockpitfs/engine/liveness"
	"github.com/cockpitfs/cockpitfs/internal/fusefile"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// PortArgs name a TCP port.
type PortArgs struct {
	Port int `json:"port" jsonschema:"the TCP port the agent means to bind"`
}

// PortCheck is whether a port is free to bind, and if not, who has it.
type PortCheck struct {
	Port int `json:"port"`
	// Free: nobody listens on the port and no stack but the session's own leases it.
	Free bool `json:"free" jsonschema:"bind it: no process listens on it and no other stack leases it"`
	// Yours: it is a port of a stack this session holds.
	Yours      bool           `json:"yours" jsonschema:"a port of the stack this session claimed"`
	LeasedBy   *LeasedPort    `json:"leased_by,omitempty" jsonschema:"the stack whose lease holds the port"`
	Listeners  []Listener     `json:"listeners,omitempty" jsonschema:"the processes listening on it"`
	UseInstead map[string]int `json:"use_instead,omitempty" jsonschema:"this session's own leased ports, by key"`
	Advice     string         `json:"advice"`
}

// LeasedPort is one line of MOUNTPOINT/ports/<port>: this daemon's stacks name cockpit, stack,
// key and offset; another daemon's lease or another process's hold name daemon, pid and uid.
type LeasedPort struct {
	Port    int    `json:"port"`
	Cockpit string `json:"cockpit,omitempty"`
	Stack   string `json:"stack,omitempty"`
	Key     string `json:"key,omitempty"`
	Daemon  string `json:"daemon,omitempty" jsonschema:"other (another cockpitfs daemon's lease) or none (a process that is not cockpitfs)"`
	PID     string `json:"pid,omitempty"`
	Line    string `json:"line" jsonschema:"the ports file's line as the mount gives it"`
}

// Listener is a TCP socket listening on a port.
type Listener struct {
	Address string `json:"address"`
	Port    int    `json:"port"`
	PID     int    `json:"pid,omitempty" jsonschema:"the listening process, where this user may see it"`
	Command string `json:"command,omitempty"`
}

func (s *Server) checkPort(ctx context.Context, _ *mcp.CallToolRequest, in PortArgs) (*mcp.CallToolResult, PortCheck, error) {
	if err := s.served(); err != nil {
		return nil, PortCheck{}, err
	}
	c, err := s.check(in.Port)
	return nil, c, err
}

// check finds who has port: the stack whose lease holds it (the mount's ports/<port>) and the
// processes listening on it (the kernel's socket tables).
func (s *Server) check(port int) (PortCheck, error) {
	if port < 1 || port > 65535 {
		return PortCheck{}, &toolError{Errno: "EINVAL", Message: fmt.Sprintf("port %d is not a TCP port", port), Fix: "1-65535"}
	}
	c := PortCheck{Port: port}
	data, err := fusefile.ReadFile(filepath.Join(s.mount, "ports", strconv.Itoa(port)))
	switch {
	case err == nil:
		l := parseLeased(port, string(data))
		c.LeasedBy = &l
	case !errors.Is(err, os.ErrNotExist):
		return PortCheck{}, s.mountErr("", err)
	}
	listeners, err := listening(port)
	if err != nil {
		return PortCheck{}, err
	}
	c.Listeners = listeners
	s.mu.Lock()
	own := s.last
	s.mu.Unlock()
	if own != "" {
		if c.UseInstead, err = readLease(filepath.Join(own, "lease")); err != nil {
			return PortCheck{}, s.mountErr(filepath.Join(own, "events"), err)
		}
	}
	for _, p := range c.UseInstead {
		c.Yours = c.Yours || p == port
	}
	c.Free = len(c.Listeners) == 0 && (c.LeasedBy == nil || c.Yours)
	switch {
	case c.Yours && c.Free:
		c.Advice = "yours to bind: your stack leases it"
	case c.Yours:
		c.Advice = "your stack leases it, but a process already listens on it: if it is not yours, stop it or wait (wait with port)"
	case len(c.Listeners) > 0 && own != "":
		c.Advice = "in use by a listening process: do not stop it; bind a port of yours instead (use_instead)"
	case len(c.Listeners) > 0:
		c.Advice = "in use by a listening process: do not stop it; claim a stack and bind its ports instead"
	case c.LeasedBy != nil && own != "":
		c.Advice = "leased by another stack: bind a port of yours instead (use_instead)"
	case c.LeasedBy != nil:
		c.Advice = "leased by another stack: claim a stack and bind its ports instead"
	case own != "":
		c.Advice = "free now, but no stack's lease keeps it so: bind a port of yours instead (use_instead)"
	default:
		c.Advice = "free now, but no stack's lease keeps it so: claim a stack and bind its ports"
	}
	return c, nil
}

// parseLeased reads a ports/<port> file's first line of key=value words.
func parseLeased(port int, text string) LeasedPort {
	line, _, _ := strings.Cut(strings.TrimSpace(text), "\n")
	l := LeasedPort{Port: port, Line: line}
	for _, w := range strings.Fields(line) {
		k, v, _ := strings.Cut(w, "=")
		switch k {
		case "cockpit":
			l.Cockpit = v
		case "stack":
			l.Stack = v
		case "key":
			l.Key = v
		case "daemon":
			l.Daemon = v
		case "pid":
			l.PID = v
		}
	}
	return l
}

// Ports is what is leased and listened on, machine-wide.
type Ports struct {
	Leased    []LeasedPort `json:"leased" jsonschema:"every port of every active lease on this machine"`
	Listening []Listener   `json:"listening" jsonschema:"every TCP port listened on"`
}

func (s *Server) ports(ctx context.Context, _ *mcp.CallToolRequest, _ Empty) (*mcp.CallToolResult, Ports, error) {
	if err := s.served(); err != nil {
		return nil, Ports{}, err
	}
	dir := filepath.Join(s.mount, "ports")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, Ports{}, s.mountErr("", err)
	}
	p := Ports{Leased: []LeasedPort{}}
	for _, e := range entries {
		port, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := fusefile.ReadFile(filepath.Join(dir, e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // released between the listing and the read
		}
		if err != nil {
			return nil, Ports{}, s.mountErr("", err)
		}
		p.Leased = append(p.Leased, parseLeased(port, string(data)))
	}
	sort.Slice(p.Leased, func(i, j int) bool { return p.Leased[i].Port < p.Leased[j].Port })
	if p.Listening, err = listening(0); err != nil {
		return nil, Ports{}, err
	}
	return nil, p, nil
}

// listening reads the kernel's TCP socket tables of this network namespace for sockets listening
// on port (0: any), and names the process of each where /proc lets this user see it.
func listening(port int) ([]Listener, error) {
	sockets, err := listeners.Sockets(func(p int) bool { return port == 0 || p == port })
	if err != nil {
		return nil, err
	}
	found := []Listener{}
	inodes := map[string][]int{} // socket inode → indexes into found
	for _, s := range sockets {
		inodes[s.Inode] = append(inodes[s.Inode], len(found))
		found = append(found, Listener{Address: s.Address, Port: s.Port})
	}
	if len(found) > 0 {
		owners(inodes, found)
	}
	sort.Slice(found, func(i, j int) bool {
		if found[i].Port != found[j].Port {
			return found[i].Port < found[j].Port
		}
		return found[i].Address < found[j].Address
	})
	return found, nil
}

// owners fills in the process of each listener whose socket inode a process's fd table shows.
func owners(inodes map[string][]int, found []Listener) {
	procs, _ := os.ReadDir("/proc")
	left := len(inodes)
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fdDir := filepath.Join("/proc", p.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // another user's, or gone
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			inode, ok := strings.CutPrefix(link, "socket:[")
			if err != nil || !ok {
				continue
			}
			idx, ok := inodes[strings.TrimSuffix(inode, "]")]
			if !ok || found[idx[0]].PID != 0 {
				continue
			}
			for _, i := range idx {
				// A process names itself: spelled as the text views spell another's command.
				found[i].PID, found[i].Command = pid, engine.Printable(liveness.Name(pid))
			}
			if left--; left == 0 {
				return
			}
		}
	}
}
