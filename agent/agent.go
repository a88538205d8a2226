// Package agent serves the Model Context Protocol for coding agents, over a cockpitfs mount.
//
// An agent host starts `cockpitfs mcp` once per session; the agent calls its tools (claim,
// check_port, release, wait, drain, ports, env, status) instead of learning the mount's layout.
// Every tool is plain file operations on the mount, as a shell's would be: the daemon behind it
// stays the one source of truth, and what an agent holds is what `cat $M/status` shows a human.
// The session's holders name the server's own process, so they live exactly as long as it does:
// a killed agent session leaves holders that read dead and are released like any dead holder.
package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cockpitfs/cockpitfs/engine"
)

// Options say which mount the server is a client of and who its session is.
type Options struct {
	Mount   string // the cockpitfs mountpoint
	Dir     string // the agent's working directory: its stack's default name
	Cockpit string // the default cockpit ("": every call names one)
	Holder  string // the session's holder name in every stack it claims
	Version string // the server's version, for the MCP handshake
}

// Server is one agent session's view of the mount.
type Server struct {
	opts  Options
	mount string // Options.Mount with its parent's symbolic links resolved, as mountinfo names it
	pid   int    // the server's own process: what the session's holders name

	mu sync.Mutex
	// claimed is every stack directory this session holds, guarded by mu.
	claimed map[string]bool
	// last is the stack directory the session claimed last, guarded by mu: check_port's "use
	// these instead".
	last string
}

// New makes the session's server; nothing on the mount is touched until a tool is called.
func New(opts Options) (*Server, error) {
	if opts.Mount == "" || opts.Dir == "" || opts.Holder == "" {
		return nil, errors.New("agent: Mount, Dir and Holder are required")
	}
	if !engine.ValidName(opts.Holder) {
		return nil, fmt.Errorf("holder name %q is invalid: %s", opts.Holder, engine.NameRule)
	}
	if opts.Cockpit != "" && !engine.ValidName(opts.Cockpit) {
		return nil, fmt.Errorf("cockpit name %q is invalid", opts.Cockpit)
	}
	mount, err := filepath.Abs(opts.Mount)
	if err != nil {
		return nil, err
	}
	// The mountpoint itself is not resolved: on a dead mount that answers ENOTCONN.
	if parent, err := filepath.EvalSymlinks(filepath.Dir(mount)); err == nil {
		mount = filepath.Join(parent, filepath.Base(mount))
	}
	return &Server{opts: opts, mount: mount, pid: os.Getpid(), claimed: map[string]bool{}}, nil
}

// MCP returns the protocol server with every tool registered.
func (s *Server) MCP() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "cockpitfs", Version: s.opts.Version}, &mcp.ServerOptions{
		Instructions: "cockpitfs leases each stack (one copy of a project's environment, usually one per git worktree) " +
			"ports no other stack holds and no process listens on. Before binding any port, call check_port " +
			"or claim, and bind only the ports claim returns.",
	})
	s.register(srv)
	return srv
}

// Run serves the protocol on t until the client goes away or ctx ends, then releases the
// session's holders.
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	err := s.MCP().Run(ctx, t)
	s.ReleaseAll()
	return err
}

// ReleaseAll releases every holder this session claimed. A stack's last holder is refused
// release (a running stack is stopped by a drain) and stays, reading dead once the server exits.
func (s *Server) ReleaseAll() {
	s.mu.Lock()
	dirs := make([]string, 0, len(s.claimed))
	for d := range s.claimed {
		dirs = append(dirs, d)
	}
	s.claimed = map[string]bool{}
	s.mu.Unlock()
	sort.Strings(dirs)
	for _, d := range dirs {
		os.Remove(filepath.Join(d, "holders", s.opts.Holder))
	}
}
