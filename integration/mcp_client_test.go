package integration

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/agent"
	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// tsAgent is an agent session as a host runs one with the official TypeScript SDK
// (testdata/mcp-client/client.mjs): node starts `cockpitfs mcp` in dir over stdio, in the
// daemon's network namespace. Its first answer is readTools'.
type tsAgent struct {
	t     *testing.T
	in    io.WriteCloser
	out   *bufio.Reader
	tools []struct {
		Name         string
		InputSchema  map[string]any
		OutputSchema map[string]any
	}
}

// tsAnswer is client.mjs's answer to one request.
type tsAnswer struct {
	IsError    bool
	Structured json.RawMessage
	Text       string
	Status     int
	Body       string
	Exception  string
}

func (m *mount) tsAgent(dir string) *tsAgent {
	m.t.Helper()
	cmd := exec.Command("node", "testdata/mcp-client/client.mjs", dir, "--", binary, "mcp", "--mount", m.Dir, "--cockpit", "app")
	cmd.Env = append(os.Environ(), mcpRace)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		m.t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		m.t.Fatal(err)
	}
	if err := m.ns.Do(cmd.Start); err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() {
		in.Close()
		cmd.Wait()
	})
	return &tsAgent{t: m.t, in: in, out: bufio.NewReader(out)}
}

// readTools reads the client's first line: the tools it listed once connected.
func (a *tsAgent) readTools() {
	a.t.Helper()
	var first struct{ Tools json.RawMessage }
	a.read(&first)
	if err := json.Unmarshal(first.Tools, &a.tools); err != nil {
		a.t.Fatalf("the MCP client's tools: %v", err)
	}
}

// read decodes the client's next line into v.
func (a *tsAgent) read(v any) {
	a.t.Helper()
	line, err := a.out.ReadBytes('\n')
	if err != nil {
		a.t.Fatalf("the MCP client: %v", err)
	}
	if err := json.Unmarshal(line, v); err != nil {
		a.t.Fatalf("the MCP client: %v in %s", err, line)
	}
}

// send writes one request; answer reads its answer.
func (a *tsAgent) send(req map[string]any) {
	a.t.Helper()
	b, _ := json.Marshal(req)
	if _, err := a.in.Write(append(b, '\n')); err != nil {
		a.t.Fatalf("the MCP client: %v", err)
	}
}

func (a *tsAgent) answer() tsAnswer {
	a.t.Helper()
	var ans tsAnswer
	a.read(&ans)
	if ans.Exception != "" {
		a.t.Fatalf("the MCP client: %s", ans.Exception)
	}
	return ans
}

// call calls a tool that must succeed and decodes its structured result into out.
func (a *tsAgent) call(tool string, args map[string]any, out any) {
	a.t.Helper()
	a.send(map[string]any{"tool": tool, "args": args})
	a.decode(tool, a.answer(), out)
}

func (a *tsAgent) decode(tool string, ans tsAnswer, out any) {
	a.t.Helper()
	if ans.IsError {
		a.t.Fatalf("%s: tool error %s", tool, ans.Text)
	}
	if err := json.Unmarshal(ans.Structured, out); err != nil {
		a.t.Fatalf("%s: %v in %s", tool, err, ans.Structured)
	}
}

// fetch gets url from the client's process, as an agent's own tools would.
func (a *tsAgent) fetch(url string) tsAnswer {
	a.t.Helper()
	a.send(map[string]any{"fetch": url})
	var ans tsAnswer
	a.read(&ans)
	return ans
}

// TestMCPTypeScriptClient: the official TypeScript SDK, as agent hosts run it, drives two agent
// sessions in two git worktrees of one repository. Both claim at once and get distinct ports,
// each serves HTTP on its own and the other agent fetches it by the URL its env tool gives; one
// session killed leaves a dead holder the next claim releases; a refusal carries its code.
func TestMCPTypeScriptClient(t *testing.T) {
	testtool.Need(t, "node", "git", "python3")
	if _, err := os.Stat("testdata/mcp-client/node_modules/@modelcontextprotocol/sdk"); err != nil {
		testtool.Missing(t, "the MCP client's npm packages (npm ci --prefix integration/testdata/mcp-client)")
	}
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 49060})
	m.ok("mkdir $M/bare")
	base := t.TempDir()
	shIn(t, base, "git init -q app && cd app && git -c user.name=t -c user.email=t@example.com commit -q --allow-empty -m init"+
		" && git worktree add -q ../app-a && git worktree add -q ../app-b")
	dirs := []string{filepath.Join(base, "app-a"), filepath.Join(base, "app-b")}
	// Both start at once; each lists its tools once connected.
	agents := []*tsAgent{m.tsAgent(dirs[0]), m.tsAgent(dirs[1])}
	for _, a := range agents {
		a.readTools()
	}

	var names []string
	for _, tool := range agents[0].tools {
		names = append(names, tool.Name)
		if tool.InputSchema["type"] != "object" || tool.OutputSchema["type"] != "object" {
			t.Errorf("tool %s: input schema %v, output schema %v", tool.Name, tool.InputSchema, tool.OutputSchema)
		}
	}
	sort.Strings(names)
	if got := strings.Join(names, " "); got != "check_port claim drain env ports release status wait" {
		t.Errorf("tools: %s", got)
	}

	// Both claim at once, each its worktree's stack.
	for _, a := range agents {
		a.send(map[string]any{"tool": "claim", "args": map[string]any{}})
	}
	leases := make([]agent.Lease, 2)
	for i, a := range agents {
		a.decode("claim", a.answer(), &leases[i])
	}
	if leases[0].Stack == leases[1].Stack || leases[0].Ports["HTTP"] == leases[1].Ports["HTTP"] {
		t.Fatalf("two worktrees share a stack or a port: %+v %+v", leases[0], leases[1])
	}
	for i, l := range leases {
		if want := strings.TrimSpace(shIn(t, dirs[i], binary+" name stack").Stdout); l.Stack != want {
			t.Errorf("agent %d claimed %s, its worktree's stack is %s", i, l.Stack, want)
		}
	}

	// Each serves HTTP on its own port; the other fetches it by the URL its env tool gives.
	for i, l := range leases {
		if err := os.WriteFile(filepath.Join(dirs[i], "who"), []byte(l.Stack), 0o644); err != nil {
			t.Fatal(err)
		}
		srv := exec.Command("python3", "-m", "http.server", "--bind", "127.0.0.1", "--directory", dirs[i], strconv.Itoa(l.Ports["HTTP"]))
		if err := m.ns.Do(srv.Start); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	}
	for i, a := range agents {
		other := leases[1-i]
		var env agent.Lease
		a.call("env", map[string]any{"stack": other.Stack}, &env)
		url := env.Env["HTTP_URL"]
		for _, ep := range env.Entrypoints {
			if ep.Name == "http" {
				url = ep.URL
			}
		}
		// The server may not listen yet: fetch until it answers.
		got := a.fetch(url + "who")
		for deadline := time.Now().Add(10 * time.Second); got.Exception != "" && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
			got = a.fetch(url + "who")
		}
		if got.Status != 200 || got.Body != other.Stack {
			t.Errorf("agent %d fetching %swho: %+v", i, url, got)
		}
		var c agent.PortCheck
		a.call("check_port", map[string]any{"port": other.Ports["HTTP"]}, &c)
		if c.Free || c.LeasedBy == nil || c.LeasedBy.Stack != other.Stack || len(c.Listeners) != 1 || c.Listeners[0].Command != "python3" ||
			c.UseInstead["HTTP"] != leases[i].Ports["HTTP"] {
			t.Errorf("agent %d checking the other's port: %+v", i, c)
		}
	}

	// Agent b's session is killed: its holder reads dead, and a's claim of b's stack releases it.
	var pid int
	for _, h := range leases[1].Holders {
		if h.Yours {
			pid = h.PID
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	holder := m.Path("app", "stacks", leases[1].Stack, "holders", leases[1].Holder)
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(m.read("app", "stacks", leases[1].Stack, "holders", leases[1].Holder), "state=dead\n"); {
		if time.Now().After(deadline) {
			t.Fatalf("the killed session's holder is not dead:\n%s", m.read("app", "stacks", leases[1].Stack, "holders", leases[1].Holder))
		}
		time.Sleep(10 * time.Millisecond)
	}
	var taken agent.Lease
	agents[0].call("claim", map[string]any{"stack": leases[1].Stack}, &taken)
	if len(taken.Holders) != 1 || taken.Holders[0].Name != leases[0].Holder || taken.Ports["HTTP"] != leases[1].Ports["HTTP"] {
		t.Errorf("claim after the kill: %+v", taken)
	}
	if _, err := os.Stat(holder); !os.IsNotExist(err) {
		t.Errorf("the dead holder is still there: %v", err)
	}
	if ev := m.read("app", "stacks", leases[1].Stack, "events"); !strings.Contains(ev, "released dead holders: "+leases[1].Holder+" (process "+strconv.Itoa(pid)+")") {
		t.Errorf("events:\n%s", ev)
	}

	// A refusal carries its errno, code, message and fix.
	agents[0].send(map[string]any{"tool": "claim", "args": map[string]any{"cockpit": "bare", "stack": "s"}})
	ans := agents[0].answer()
	var r refusal
	if !ans.IsError || json.Unmarshal([]byte(ans.Text), &r) != nil || r.Errno != "EINVAL" || r.Code != "PORT_FAMILY_OUT_OF_RANGE" || r.Fix != "write bare/config first" {
		t.Errorf("claim without a config: %+v", ans)
	}
}

// TestMCPDrainTargetIsOneWord: each of drain's targets is one target of the request. One holding
// white space is refused with nothing reserved, where it was split into several targets (the
// drain of "volume:a\nsleep" reclaimed a target "sleep"); one spelled like an option
// (valid_for=1) is a target, where it set the option and the drain lost the target.
func TestMCPDrainTargetIsOneWord(t *testing.T) {
	testtool.Need(t, "node")
	if _, err := os.Stat("testdata/mcp-client/node_modules/@modelcontextprotocol/sdk"); err != nil {
		testtool.Missing(t, "the MCP client's npm packages (npm ci --prefix integration/testdata/mcp-client)")
	}
	m := newMount(t)
	m.setupApp(2, map[string]int{"HTTP": 49070}, "s")
	a := m.tsAgent(t.TempDir())
	a.readTools()
	var l agent.Lease
	a.call("claim", map[string]any{"stack": "s"}, &l)
	for _, target := range []string{"volume:a\nsleep", "volume:a volume:b", "volume:a\tholder=other"} {
		a.send(map[string]any{"tool": "drain", "args": map[string]any{"stack": "s", "action": "down", "targets": []string{target}}})
		ans := a.answer()
		var r refusal
		if !ans.IsError || json.Unmarshal([]byte(ans.Text), &r) != nil || r.Errno != "EINVAL" || r.Code != "STATE_RECORD_MALFORMED" || r.Fix == "" {
			t.Errorf("drain with target %q: error %v, %s", target, ans.IsError, ans.Text)
		}
		if req := m.read("app", "stacks", "s", "drain", "request"); req != "" {
			t.Fatalf("the refused drain with target %q reserved: %s", target, req)
		}
	}
	var d agent.Drain
	a.call("drain", map[string]any{"stack": "s", "action": "down", "targets": []string{"valid_for=1"}}, &d)
	if ids, _ := json.Marshal(d.Request["targetIds"]); !strings.Contains(string(ids), `"valid_for=1"`) {
		t.Errorf("drain with target valid_for=1: %+v", d.Request)
	}
}

// TestMCPDrainIsOfTheSessionsOwnStack: a session drains only a stack it holds. The drain tool
// named its holder only for a stack it had claimed; for another, the daemon took the stack's
// only holder as the requester, and one agent reserved a drain of another agent's live stack,
// whose servers that drain stops. Now it is refused (ENOENT, the fix says to claim first) and
// nothing is reserved; a claim beside the other session's is then refused as a co-tenant's, and
// once the other session released, the drain is this session's.
func TestMCPDrainIsOfTheSessionsOwnStack(t *testing.T) {
	testtool.Need(t, "node")
	if _, err := os.Stat("testdata/mcp-client/node_modules/@modelcontextprotocol/sdk"); err != nil {
		testtool.Missing(t, "the MCP client's npm packages (npm ci --prefix integration/testdata/mcp-client)")
	}
	m := newMount(t)
	m.setupApp(2, map[string]int{"HTTP": 49060}, "s")
	a, b := m.tsAgent(t.TempDir()), m.tsAgent(t.TempDir())
	a.readTools()
	b.readTools()
	var l agent.Lease
	b.call("claim", map[string]any{"stack": "s"}, &l)
	holders := func() string {
		t.Helper()
		es, err := os.ReadDir(m.Path("app", "stacks", "s", "holders"))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		return strings.Join(names, " ")
	}
	before := holders()
	refusedDrain := func(who *tsAgent, errno string) {
		t.Helper()
		who.send(map[string]any{"tool": "drain", "args": map[string]any{"stack": "s", "action": "sleep"}})
		ans := who.answer()
		var r refusal
		if !ans.IsError || json.Unmarshal([]byte(ans.Text), &r) != nil || r.Errno != errno {
			t.Fatalf("drain: error %v, %s; want %s", ans.IsError, ans.Text, errno)
		}
		if errno == "ENOENT" && !strings.Contains(r.Fix, "claim the stack first") {
			t.Errorf("drain refused with fix %q", r.Fix)
		}
		if req := m.read("app", "stacks", "s", "drain", "request"); req != "" {
			t.Fatalf("the refused drain reserved: %s", req)
		}
	}
	refusedDrain(a, "ENOENT")
	if got := holders(); got != before {
		t.Errorf("holders after the refused drain: %q, were %q", got, before)
	}
	if events := m.read("app", "stacks", "s", "events"); !strings.Contains(events, `"errno":"ENOENT"`) {
		t.Errorf("no refused line for the drain in the events:\n%s", events)
	}
	a.call("claim", map[string]any{"stack": "s"}, &l)
	refusedDrain(a, "EBUSY")
	var released map[string]any
	b.call("release", map[string]any{"stack": "s"}, &released)
	var d agent.Drain
	a.call("drain", map[string]any{"stack": "s", "action": "sleep"}, &d)
	if d.Request == nil {
		t.Fatalf("the session's own drain reserved nothing: %+v", d)
	}
}

// TestMCPOthersTextIsEscaped: text another user chose — a holder's checkout (a working
// directory's name), a listening process's name — reaches the agent spelled as the text views
// spell it (`cat status`, the holder files claim and env read): no control character, C1 or
// bidirectional override of theirs is in a tool's result, where status and check_port carried
// them as they are.
func TestMCPOthersTextIsEscaped(t *testing.T) {
	testtool.Need(t, "node", "python3")
	if _, err := os.Stat("testdata/mcp-client/node_modules/@modelcontextprotocol/sdk"); err != nil {
		testtool.Missing(t, "the MCP client's npm packages (npm ci --prefix integration/testdata/mcp-client)")
	}
	m := newMount(t)
	m.setupApp(2, map[string]int{"HTTP": 49080}, "s")
	raw := []string{"\x1b", "\x7f", "\u009b", "\u202e"}
	dir := filepath.Join(t.TempDir(), "co\x1b[31m\x7f\u009b\u202euser")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shIn(t, dir, "touch "+m.Path("app", "stacks", "s", "holders", "theirs"))
	// A listener that named itself so.
	name := "srv\u009b\u202e"
	srv := exec.Command("python3", "-c", `import socket, sys
open("/proc/self/comm", "w").write(sys.argv[1])
s = socket.socket(); s.bind(("127.0.0.1", 49095)); s.listen(); print(flush=True); sys.stdin.read()`, name)
	stdin, err := srv.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ns.Do(srv.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); srv.Wait() })
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}

	a := m.tsAgent(t.TempDir())
	a.readTools()
	clean := func(tool string, ans tsAnswer) {
		t.Helper()
		for _, r := range raw {
			if strings.Contains(ans.Text, r) || strings.Contains(string(ans.Structured), r) {
				t.Errorf("%s carries %q as it is: %s", tool, r, ans.Text)
			}
		}
	}
	var env agent.Lease
	a.call("env", map[string]any{"stack": "s"}, &env)
	a.send(map[string]any{"tool": "status", "args": map[string]any{}})
	ans := a.answer()
	clean("status", ans)
	var st agent.Status
	a.decode("status", ans, &st)
	if len(env.Holders) != 1 || len(st.Cockpits) != 1 || len(st.Cockpits[0].Stacks) != 1 || len(st.Cockpits[0].Stacks[0].Holders) != 1 ||
		st.Cockpits[0].Stacks[0].Holders[0].Checkout != env.Holders[0].Checkout || !strings.Contains(env.Holders[0].Checkout, `co\x1b[31m\x7f\u009b\u202euser`) {
		t.Errorf("the holder's checkout: env %+v, status %s", env.Holders, ans.Text)
	}
	a.send(map[string]any{"tool": "check_port", "args": map[string]any{"port": 49095}})
	ans = a.answer()
	clean("check_port", ans)
	var c agent.PortCheck
	a.decode("check_port", ans, &c)
	if len(c.Listeners) != 1 || c.Listeners[0].Command != `srv\u009b\u202e` {
		t.Errorf("check_port: %s", ans.Text)
	}
}

// TestMCPKilledDaemonsStore: the daemon of an agent's session is killed. Each call says no
// daemon serves the mount and how to find the killed one's --data: `cockpitfs unmount`, then
// the note beneath names it. The bare `cockpitfs mount --daemon MNT` it said before served the
// default store instead, where the session's stack and every other lease were not.
func TestMCPKilledDaemonsStore(t *testing.T) {
	testtool.Need(t, "node")
	if _, err := os.Stat("testdata/mcp-client/node_modules/@modelcontextprotocol/sdk"); err != nil {
		testtool.Missing(t, "the MCP client's npm packages (npm ci --prefix integration/testdata/mcp-client)")
	}
	m := newMount(t)
	m.setupApp(2, map[string]int{"HTTP": 49090}, "s")
	a := m.tsAgent(t.TempDir())
	a.readTools()
	var l agent.Lease
	a.call("claim", map[string]any{"stack": "s"}, &l)
	m.Kill()
	refused := func() refusal {
		t.Helper()
		a.send(map[string]any{"tool": "claim", "args": map[string]any{"stack": "s"}})
		ans := a.answer()
		var r refusal
		if !ans.IsError || json.Unmarshal([]byte(ans.Text), &r) != nil || r.Code != "NOT_MOUNTED" {
			t.Fatalf("claim on the killed daemon's mount: %+v", ans)
		}
		return r
	}
	if r := refused(); !strings.Contains(r.Fix, "`cockpitfs unmount "+m.Dir+"` detaches its dead mount, and "+m.Dir+"/NOT-MOUNTED beneath it then names them") {
		t.Errorf("claim on the dead mount: %+v", r)
	}
	// Followed: the note names the store.
	if r := cockpitfs(t, "unmount", m.Dir); r.code != 0 {
		t.Fatalf("unmount of the dead mount: %+v", r)
	}
	if r := refused(); !strings.HasSuffix(r.Fix, "("+m.Dir+"/NOT-MOUNTED names them)") {
		t.Errorf("claim once the dead mount is detached: %+v", r)
	}
	if note := m.read("NOT-MOUNTED"); !strings.Contains(note, "--data "+m.Data) {
		t.Errorf("the note:\n%s", note)
	}
}
