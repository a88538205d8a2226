package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/agent"
)

// 6c. an agent's claim: one claim tool call to `cockpitfs mcp` over stdio, as an agent host runs
// it (round trip: JSON-RPC over pipes, the server's claim through the mount, the lease read back),
// beside the same server in-process over the Go SDK's in-memory transports (no pipes, no second
// process) and a claim through the mount as touch makes it (open O_CREAT, close), timed side by
// side (paired). The release after each claim is not counted.
func BenchmarkMCP(b *testing.B) {
	d := sharedDaemon(b)
	cmd := exec.Command(binary, "mcp", "--mount", d.Dir, "--cockpit", "app", "--holder", "mcp")
	cmd.Dir = workDir
	cmd.Stderr = os.Stderr
	var stdio *mcp.ClientSession
	err := daemonNetns.Do(func() (err error) {
		stdio, err = mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	defer stdio.Close()
	srv, err := agent.New(agent.Options{Mount: d.Dir, Dir: workDir, Cockpit: "app", Holder: "mcp-inprocess"})
	if err != nil {
		b.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.MCP().Connect(ctx, st, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ss.Close()
	inMemory, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer inMemory.Close()
	paired(b, map[string]op{
		"stdio":    toolClaim(stdio),
		"inmemory": toolClaim(inMemory),
		"mount":    create(d.path("app", "stacks", "s", "holders", "c")),
		"files":    serverFiles(d, "f"),
	})
}

// serverFiles is the claim tool's own file operations on the mount without the protocol: the
// holder's create and its pid written, then the lease read back (each holder, lease, env,
// entrypoints.json).
func serverFiles(d *daemon, holder string) op {
	stack := d.path("app", "stacks", "s")
	path := filepath.Join(stack, "holders", holder)
	return op{
		run: func() error {
			if err := writeFile(path, unix.O_CREAT|unix.O_EXCL, "pid="+strconv.Itoa(os.Getpid())+"\n"); err != nil {
				return err
			}
			entries, err := os.ReadDir(filepath.Join(stack, "holders"))
			if err != nil {
				return err
			}
			files := []string{"lease", "env", "entrypoints.json"}
			for _, e := range entries {
				files = append(files, filepath.Join("holders", e.Name()))
			}
			for _, f := range files {
				if _, err := os.ReadFile(filepath.Join(stack, f)); err != nil {
					return err
				}
			}
			return nil
		},
		undo: func() error { return retry(func() error { return unix.Unlink(path) }) },
	}
}

// toolClaim claims stack s through an MCP session; the release is untimed (s keeps its holder
// "base", so the release is not the last one's).
func toolClaim(s *mcp.ClientSession) op {
	call := func(tool string) error {
		res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"stack": "s"}})
		if err == nil && res.IsError {
			err = fmt.Errorf("%s: %v", tool, res.Content[0].(*mcp.TextContent).Text)
		}
		return err
	}
	return op{run: func() error { return call("claim") }, undo: func() error { return call("release") }}
}
