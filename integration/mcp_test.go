package integration

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cockpitfs/cockpitfs/agent"
)

// mcpRace spares each `cockpitfs mcp` the second a race-built binary otherwise sleeps when it
// exits (the race detector's atexit_sleep_ms).
const mcpRace = "GORACE=atexit_sleep_ms=0"

// mcpAgent is one agent session: `cockpitfs mcp` started by the Go SDK's client over stdio, in
// dir, in the daemon's network namespace (where its check_port reads the socket tables).
type mcpAgent struct {
	t       *testing.T
	session *mcp.ClientSession
	cmd     *exec.Cmd
}

func (m *mount) mcpAgent(dir string, args ...string) *mcpAgent {
	m.t.Helper()
	cmd := exec.Command(binary, append([]string{"mcp", "--mount", m.Dir}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), mcpRace)
	cmd.Stderr = os.Stderr
	a := &mcpAgent{t: m.t, cmd: cmd}
	client := mcp.NewClient(&mcp.Implementation{Name: "cockpitfs-test", Version: "1"}, nil)
	err := m.ns.Do(func() (err error) {
		a.session, err = client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
		return err
	})
	if err != nil {
		m.t.Fatalf("connecting to cockpitfs mcp: %v", err)
	}
	m.t.Cleanup(func() { a.session.Close() })
	return a
}

// call calls a tool, decodes its structured result into out (when not nil) and returns the
// result.
func (a *mcpAgent) call(tool string, args map[string]any, out any) *mcp.CallToolResult {
	a.t.Helper()
	return callTool(a.t, a.session, tool, args, out)
}

func callTool(t *testing.T, s *mcp.ClientSession, tool string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if res.IsError {
		if out != nil {
			t.Fatalf("%s(%v): tool error %s", tool, args, text(res))
		}
		return res
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: %v in %s", tool, err, b)
		}
	}
	return res
}

// refusal is a tool error's text: {errno, code, message, fix}.
type refusal struct {
	Errno, Code, Message, Fix string
}

// refusedCall calls a tool that must fail and returns its error.
func (a *mcpAgent) refused(tool string, args map[string]any) refusal {
	a.t.Helper()
	return refusedCall(a.t, a.session, tool, args)
}

func refusedCall(t *testing.T, s *mcp.ClientSession, tool string, args map[string]any) refusal {
	t.Helper()
	res := callTool(t, s, tool, args, nil)
	if !res.IsError {
		t.Fatalf("%s(%v) succeeded, want a tool error: %s", tool, args, text(res))
	}
	var r refusal
	if err := json.Unmarshal([]byte(text(res)), &r); err != nil {
		t.Fatalf("%s: the tool error is not JSON: %q", tool, text(res))
	}
	return r
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestMCPNotServed: with no daemon serving the mount (a bare directory, a killed daemon's dead
// mount, a stopped daemon's mountpoint) every tool says so, with the command that starts one
// (naming the NOT-MOUNTED note when there is one, and how to see it beneath a dead mount: the
// daemon's --data is needed too), and writes nothing. In process, over the Go SDK's in-memory transports.
func TestMCPNotServed(t *testing.T) {
	check := func(t *testing.T, mnt string, note, dead bool) {
		fix := "start one: cockpitfs mount --daemon " + mnt
		if note {
			fix += ", with the --data and flags of the daemon that served it (" + mnt + "/NOT-MOUNTED names them)"
		}
		if dead {
			fix += ", with the --data and flags of the daemon that served it, which died: `cockpitfs unmount " + mnt +
				"` detaches its dead mount, and " + mnt + "/NOT-MOUNTED beneath it then names them"
		}
		srv, err := agent.New(agent.Options{Mount: mnt, Dir: t.TempDir(), Cockpit: "app", Holder: "agent"})
		if err != nil {
			t.Fatal(err)
		}
		st, ct := mcp.NewInMemoryTransports()
		ss, err := srv.MCP().Connect(context.Background(), st, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ss.Close()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), ct, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		for tool, args := range map[string]map[string]any{
			"claim": {}, "release": {}, "env": {}, "status": {}, "ports": {}, "check_port": {"port": 49001},
			"wait": {"timeout_seconds": 1}, "drain": {"action": "sleep"},
		} {
			r := refusedCall(t, cs, tool, args)
			if r.Code != "NOT_MOUNTED" || !strings.Contains(r.Message, "no cockpitfs daemon serves "+mnt) || r.Fix != fix {
				t.Errorf("%s: %+v", tool, r)
			}
		}
	}
	t.Run("bare directory", func(t *testing.T) {
		mnt := t.TempDir()
		check(t, mnt, false, false)
		if entries, _ := os.ReadDir(mnt); len(entries) != 0 {
			t.Errorf("the bare directory holds %v", entries)
		}
	})
	t.Run("killed daemon", func(t *testing.T) {
		m := newMount(t)
		m.setupApp(2, map[string]int{"HTTP": 49010})
		m.Kill()
		check(t, m.Dir, false, true)
	})
	t.Run("stopped daemon", func(t *testing.T) {
		m := newMount(t)
		m.setupApp(2, map[string]int{"HTTP": 49020})
		m.Stop()
		check(t, m.Dir, true, false)
	})
}

// TestMCPClaim drives `cockpitfs mcp` through the Go SDK's client: a claim held by the server's
// own process from its working directory, check_port for each kind of port, a release refused
// for the last holder, the session's holders released when its client goes away.
func TestMCPClaim(t *testing.T) {
	m := newMount(t)
	m.ok("mkdir $M/bare")
	work := filepath.Join(t.TempDir(), "feature-x")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	a := m.mcpAgent(work, "--cockpit", "app")

	// A cockpit without a config: the daemon's refusal, its code and fix, and nothing claimed.
	r := a.refused("claim", map[string]any{"cockpit": "bare", "stack": "s"})
	if r.Errno != "EINVAL" || r.Code != "PORT_FAMILY_OUT_OF_RANGE" || r.Fix != "write bare/config first" {
		t.Errorf("claim without a config: %+v", r)
	}
	if ls := m.ok("ls $M/bare/stacks/s/holders"); ls != "" {
		t.Errorf("holders after the refusal: %q", ls)
	}
	if ev := m.lastEvent("bare", "stacks", "s", "events"); !strings.Contains(ev, `"code":"PORT_FAMILY_OUT_OF_RANGE"`) || !strings.Contains(ev, `"pid":`+strconv.Itoa(a.cmd.Process.Pid)) {
		t.Errorf("events: %s", ev)
	}

	// A name that is a path is refused before anything reaches the mount.
	r = a.refused("claim", map[string]any{"cockpit": "bare", "stack": "../../x"})
	if r.Errno != "EINVAL" || r.Code != "STATE_RECORD_MALFORMED" || !strings.Contains(r.Message, `stack name "../../x" is invalid`) {
		t.Errorf("claim of a path: %+v", r)
	}
	if ls := m.ok("ls $M; ls $M/bare/stacks"); ls != "README\nbare\ngc\nports\nstatus\nstatus.json\ns\n" {
		t.Errorf("after the refused claim: %q", ls)
	}

	m.setupApp(3, map[string]int{"HTTP": 49020, "DB": 49021})
	var l agent.Lease
	a.call("claim", nil, &l)
	stack := filepath.Base(work) + "-"
	if !strings.HasPrefix(l.Stack, stack) || l.Stack != strings.TrimSpace(m.ok("cd "+work+" && "+binary+" name stack")) {
		t.Errorf("the default stack %q is not the working directory's", l.Stack)
	}
	if l.Ports["HTTP"] != 49020 || l.Ports["DB"] != 49021 || l.Env["HTTP"] != "49020" || len(l.Entrypoints) != 2 {
		t.Errorf("lease: %+v", l)
	}
	holder := m.read("app", "stacks", l.Stack, "holders", l.Holder)
	pid := strconv.Itoa(a.cmd.Process.Pid)
	for _, want := range []string{"pid=" + pid + "\n", "state=live\n", "checkout_path=" + work + "\n"} {
		if !strings.Contains(holder, want) {
			t.Errorf("holder file lacks %q:\n%s", want, holder)
		}
	}
	if len(l.Holders) != 1 || !l.Holders[0].Yours || l.Holders[0].PID != a.cmd.Process.Pid {
		t.Errorf("holders: %+v", l.Holders)
	}

	// Claiming again changes nothing.
	rev := m.read("app", "stacks", l.Stack, "revision")
	var again agent.Lease
	a.call("claim", nil, &again)
	if got := m.read("app", "stacks", l.Stack, "revision"); got != rev || again.Ports["HTTP"] != 49020 || again.Holder != l.Holder {
		t.Errorf("a second claim: revision %s → %s, %+v", strings.TrimSpace(rev), strings.TrimSpace(got), again)
	}

	// Another session under the same holder name is refused while this one lives.
	other := m.mcpAgent(t.TempDir(), "--cockpit", "app", "--holder", l.Holder)
	r = other.refused("claim", map[string]any{"stack": l.Stack})
	if r.Errno != "EEXIST" || !strings.Contains(r.Message, "held by the live process "+pid) || !strings.Contains(r.Fix, "--holder") {
		t.Errorf("claim of a live session's holder name: %+v", r)
	}
	if got := m.read("app", "stacks", l.Stack, "holders", l.Holder); got != holder {
		t.Errorf("the refused claim changed the holder:\n%s", got)
	}
	other.session.Close()

	// check_port: the session's own port, another stack's, a listener's, a free one.
	m.ok("mkdir $M/app/stacks/other && touch $M/app/stacks/other/holders/me")
	var c agent.PortCheck
	a.call("check_port", map[string]any{"port": 49020}, &c)
	if !c.Free || !c.Yours || !strings.Contains(c.Advice, "yours to bind") {
		t.Errorf("own port: %+v", c)
	}
	c = agent.PortCheck{}
	a.call("check_port", map[string]any{"port": 49030}, &c)
	if c.Free || c.LeasedBy == nil || c.LeasedBy.Stack != "other" || c.LeasedBy.Key != "HTTP" || c.UseInstead["HTTP"] != 49020 {
		t.Errorf("another stack's port: %+v", c)
	}
	if _, err := m.listen("tcp", "127.0.0.1:49099"); err != nil {
		t.Fatal(err)
	}
	c = agent.PortCheck{}
	a.call("check_port", map[string]any{"port": 49099}, &c)
	if c.Free || len(c.Listeners) != 1 || c.Listeners[0].PID != os.Getpid() || c.Listeners[0].Address != "127.0.0.1" {
		t.Errorf("a listener's port: %+v", c)
	}
	c = agent.PortCheck{}
	a.call("check_port", map[string]any{"port": 49098}, &c)
	if !c.Free || c.Yours || c.LeasedBy != nil || len(c.Listeners) != 0 || c.UseInstead["DB"] != 49021 {
		t.Errorf("a port nobody has, not the session's: %+v", c)
	}

	var ports agent.Ports
	a.call("ports", nil, &ports)
	if len(ports.Leased) != 4 || ports.Leased[0].Port != 49020 || ports.Leased[0].Stack != l.Stack {
		t.Errorf("ports: %+v", ports.Leased)
	}
	var st agent.Status
	a.call("status", nil, &st)
	if len(st.Cockpits) != 2 || len(st.Cockpits[0].Stacks) != 2 {
		t.Errorf("status: %+v", st)
	}

	// The last holder's release is refused, with the daemon's code, and the holder stays.
	r = a.refused("release", nil)
	if r.Errno != "EBUSY" || r.Code != "CLAIM_CO_TENANT" || r.Fix == "" {
		t.Errorf("release of the last holder: %+v", r)
	}
	if _, err := os.Stat(m.Path("app", "stacks", l.Stack, "holders", l.Holder)); err != nil {
		t.Errorf("the refused release removed the holder: %v", err)
	}
	if ev := m.lastEvent("app", "stacks", l.Stack, "events"); !strings.Contains(ev, `"code":"CLAIM_CO_TENANT"`) {
		t.Errorf("events: %s", ev)
	}

	// A session ended by SIGTERM releases its holders too.
	// Its checkout given by --dir, as a host that starts servers elsewhere passes it.
	checkout := filepath.Join(t.TempDir(), "feature-y")
	if err := os.Mkdir(checkout, 0o755); err != nil {
		t.Fatal(err)
	}
	b := m.mcpAgent(t.TempDir(), "--cockpit", "app", "--dir", checkout)
	if r := b.refused("env", nil); r.Message != "there is no stack app/"+strings.TrimSpace(m.ok("cd "+checkout+" && "+binary+" name stack")) {
		t.Errorf("the default stack of --dir %s: %+v", checkout, r)
	}
	var lb agent.Lease
	b.call("claim", map[string]any{"stack": "other"}, &lb)
	for _, h := range lb.Holders {
		if h.Yours && h.Checkout != checkout {
			t.Errorf("the session's holder's checkout: %+v", h)
		}
	}
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	b.session.Close() // waits for the server to exit
	if ls := m.ok("ls $M/app/stacks/other/holders"); ls != "me\n" {
		t.Errorf("holders after SIGTERM: %q", ls)
	}

	// With a second holder the session's holder is released when its client goes away.
	m.ok("touch $M/app/stacks/" + l.Stack + "/holders/human")
	a.session.Close()
	if ls := m.ok("ls $M/app/stacks/" + l.Stack + "/holders"); ls != "human\n" {
		t.Errorf("holders after the session ended: %q", ls)
	}
}

// TestMCPWaitDrain: wait returns at a change of the stack, or says it timed out; wait with a port
// returns once nobody listens on it; drain reserves for the session's holder and returns the
// reservation, and is refused while another live holder is in the way.
func TestMCPWaitDrain(t *testing.T) {
	m := newMount(t)
	m.setupApp(2, map[string]int{"HTTP": 49040}, "s")
	a := m.mcpAgent(t.TempDir(), "--cockpit", "app")
	var l agent.Lease
	a.call("claim", map[string]any{"stack": "s"}, &l)
	// Nothing listens in the daemon's fresh network namespace: an empty list, not null.
	var ports agent.Ports
	if res := a.call("ports", nil, &ports); len(ports.Leased) != 1 || ports.Listening == nil || len(ports.Listening) != 0 {
		t.Errorf("ports: %s", text(res))
	}

	// Arguments the server refuses itself, before anything reaches the mount.
	for tool, args := range map[string]map[string]any{
		"wait":       {"stack": "s", "timeout_seconds": 0},
		"drain":      {"stack": "s", "action": "hibernate"},
		"check_port": {"port": 70000},
	} {
		if r := a.refused(tool, args); r.Errno != "EINVAL" || r.Fix == "" {
			t.Errorf("%s(%v): %+v", tool, args, r)
		}
	}
	if req := m.read("app", "stacks", "s", "drain", "request"); req != "" {
		t.Errorf("the refused drain reserved: %s", req)
	}

	var w agent.Waited
	a.call("wait", map[string]any{"stack": "s", "timeout_seconds": 0.2}, &w)
	if !w.TimedOut {
		t.Errorf("wait on a stack nobody changes: %+v", w)
	}
	// The wait returns at the first change after it opened the file: change the stack until it
	// has. A timeout past what a time.Duration holds waits as long as one does.
	done := make(chan agent.Waited)
	go func() {
		var w agent.Waited
		a.call("wait", map[string]any{"stack": "s", "timeout_seconds": 1e300}, &w)
		done <- w
	}()
	for i := 0; ; i++ {
		m.ok("touch $M/app/stacks/s/holders/h" + strconv.Itoa(i))
		select {
		case w = <-done:
		case <-time.After(50 * time.Millisecond):
			continue
		}
		break
	}
	if w.TimedOut || w.Revision < 3 {
		t.Errorf("wait across a claim: %+v", w)
	}

	ln, err := m.listen("tcp", "127.0.0.1:49097")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		var w agent.Waited
		a.call("wait", map[string]any{"port": 49097, "timeout_seconds": 60}, &w)
		done <- w
	}()
	ln.Close()
	if w = <-done; w.TimedOut || w.Port == nil || !w.Port.Free {
		t.Errorf("wait for a port: %+v", w)
	}

	// Another live holder is in the way of a drain: the daemon's refusal names it.
	r := a.refused("drain", map[string]any{"stack": "s", "action": "sleep"})
	if r.Errno != "EBUSY" || r.Code != "CLAIM_CO_TENANT" {
		t.Errorf("drain with other holders: %+v", r)
	}
	if req := m.read("app", "stacks", "s", "drain", "request"); req != "" {
		t.Errorf("the refused drain reserved: %s", req)
	}
	if ev := m.lastEvent("app", "stacks", "s", "events"); !strings.Contains(ev, `"op":"write","path":"app/stacks/s/drain/request"`) || !strings.Contains(ev, `"code":"CLAIM_CO_TENANT"`) {
		t.Errorf("events: %s", ev)
	}
	m.ok("cd $M/app/stacks/s/holders && rm h*")
	var d agent.Drain
	a.call("drain", map[string]any{"stack": "s", "action": "down", "targets": []string{"volume:db"}}, &d)
	if d.Request["purpose"] != "down" || d.Attempt != nil {
		t.Errorf("drain: %+v", d)
	}
	// An executor started the first action: asked again, the drain is refused until its outcome,
	// then shows it.
	m.ok("cd $M/app/stacks/s && echo start > drain/attempt")
	r = a.refused("drain", map[string]any{"stack": "s", "action": "down", "targets": []string{"volume:db"}})
	if r.Errno != "ENOTRECOVERABLE" || r.Code != "DRAIN_ATTEMPT_REPAIR_REQUIRED" || !strings.Contains(r.Fix, "drain/outcome") {
		t.Errorf("drain with an attempt active: %+v", r)
	}
	if ev := m.lastEvent("app", "stacks", "s", "events"); !strings.Contains(ev, `"code":"DRAIN_ATTEMPT_REPAIR_REQUIRED"`) {
		t.Errorf("events: %s", ev)
	}
	if att := m.read("app", "stacks", "s", "drain", "attempt"); !strings.Contains(att, `"status":"active"`) {
		t.Errorf("the refused resume changed the attempt: %s", att)
	}
	m.ok("cd $M/app/stacks/s && echo failure > drain/outcome")
	a.call("drain", map[string]any{"stack": "s", "action": "down", "targets": []string{"volume:db"}}, &d)
	if d.Attempt == nil || d.Attempt["status"] != "failed" || d.Attempt["currentStage"] != "runtime-stop" {
		t.Errorf("drain after a failed attempt: %+v", d)
	}
}

// rawMCP is `cockpitfs mcp` for cockpit app as holder, not yet started, for a test that speaks
// JSON-RPC to it by hand.
func rawMCP(m *mount, holder string) *exec.Cmd {
	cmd := exec.Command(binary, "mcp", "--mount", m.Dir, "--cockpit", "app", "--holder", holder)
	cmd.Dir = m.t.TempDir()
	cmd.Env = append(os.Environ(), mcpRace)
	return cmd
}

// A line that is no JSON-RPC message — not JSON, a byte-order mark, an empty batch, null, another
// version, one past 16 MiB — is answered with a JSON-RPC error whose id is null, and the session
// goes on: its claims are kept and later requests are served. The end of stdin still ends it, and
// releases its holders.
func TestMCPBadLinesAreAnsweredNotFatal(t *testing.T) {
	m := newMount(t)
	m.setupApp(3, map[string]int{"HTTP": 49060})
	cmd := rawMCP(m, "agent")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	answers := json.NewDecoder(stdout)
	send := func(line string) {
		t.Helper()
		if _, err := io.WriteString(stdin, line+"\n"); err != nil {
			t.Fatalf("writing %.40q: %v", line, err)
		}
	}
	type answer struct {
		ID    any `json:"id"`
		Error *struct {
			Code int `json:"code"`
		} `json:"error"`
		Result json.RawMessage `json:"result"`
	}
	next := func() answer {
		t.Helper()
		var a answer
		if err := answers.Decode(&a); err != nil {
			t.Fatalf("reading an answer: %v", err)
		}
		return a
	}
	bad := []struct {
		line string
		code int
	}{
		{"{oops", -32700},
		{"\ufeff{}", -32700},
		{"[]", -32600},
		{"null", -32600},
		{`{"jsonrpc":"1.0","id":3,"method":"tools/list"}`, -32600},
		{`{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}`, -32600},
		{strings.Repeat(" ", 16<<20) + "{}", -32600},
	}
	check := func(when string) {
		t.Helper()
		for _, b := range bad {
			send(b.line)
			if a := next(); a.ID != nil || a.Error == nil || a.Error.Code != b.code {
				t.Errorf("%s: %.40q answered %+v, want error %d with id null", when, b.line, a, b.code)
			}
		}
	}
	check("before initialize")
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if a := next(); a.ID != float64(1) || a.Error != nil {
		t.Fatalf("initialize: %+v", a)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"claim","arguments":{"stack":"s"}}}`)
	if a := next(); a.ID != float64(2) || a.Error != nil || !strings.Contains(string(a.Result), "49060") {
		t.Fatalf("claim: %+v %s", a, a.Result)
	}
	check("after a claim")
	// An id the SDK would answer as another (1e30 as -9223372036854775808, 2.5 as 2) is refused,
	// answered with the id as it was sent.
	for _, id := range []string{"1e30", "2.5"} {
		send(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/list"}`)
		var raw map[string]json.RawMessage
		if err := answers.Decode(&raw); err != nil || string(raw["id"]) != id || !strings.Contains(string(raw["error"]), "-32600") {
			t.Errorf("id %s answered %v, %v", id, raw, err)
		}
	}
	// Batches went with protocol 2025-06-18: the SDK would end the session at one.
	send(`[{"jsonrpc":"2.0","id":4,"method":"tools/list"}]`)
	if a := next(); a.ID != nil || a.Error == nil || a.Error.Code != -32600 {
		t.Errorf("a batch under 2025-06-18 answered %+v", a)
	}
	if got := m.ok("ls $M/app/stacks/s/holders"); got != "agent\n" {
		t.Fatalf("holders after the bad lines: %q", got)
	}
	send(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"status","arguments":{}}}`)
	if a := next(); a.ID != float64(5) || a.Error != nil {
		t.Fatalf("status after the bad lines: %+v", a)
	}
	// With a second holder, the session's is released when stdin ends.
	m.ok("touch $M/app/stacks/s/holders/human")
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("cockpitfs mcp at the end of stdin: %v", err)
	}
	if got := m.ok("ls $M/app/stacks/s/holders"); got != "human\n" {
		t.Errorf("holders after the session ended: %q", got)
	}
}

// Requests sent and stdin closed at once (`printf … | cockpitfs mcp`) are each run and answered
// before the session ends: the claim is made, and said.
func TestMCPRequestsBeforeTheEndOfStdinAreAnswered(t *testing.T) {
	m := newMount(t)
	m.setupApp(3, map[string]int{"HTTP": 49070})
	cmd := rawMCP(m, "piped")
	cmd.Stdin = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"pipe","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"claim","arguments":{"stack":"s"}}}
{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"env","arguments":{"stack":"s"}}}
`)
	var out []byte
	err := m.ns.Do(func() (err error) { out, err = cmd.Output(); return err })
	if err != nil {
		t.Fatalf("cockpitfs mcp: %v\n%s", err, out)
	}
	answered := map[float64]bool{}
	for dec := json.NewDecoder(strings.NewReader(string(out))); dec.More(); {
		var a struct {
			ID     float64         `json:"id"`
			Result json.RawMessage `json:"result"`
		}
		if err := dec.Decode(&a); err != nil {
			t.Fatalf("%v in %s", err, out)
		}
		answered[a.ID] = a.Result != nil
	}
	if !answered[1] || !answered[2] || !answered[3] {
		t.Fatalf("answered %v:\n%s", answered, out)
	}
	if got := m.read("app/stacks/s/ports/HTTP"); got != "49070\n" {
		t.Fatalf("the piped claim's lease: %q", got)
	}
}
