package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

const proxyPort = 7391

// startStackServer runs testdata/proxy-server.py on port in the daemon's network namespace (as
// uid 65534 when nobody), stopped when the test ends; it returns once the port listens.
func startStackServer(t *testing.T, m *mount, port int, name string, nobody bool) *exec.Cmd {
	t.Helper()
	testtool.Need(t, "python3")
	script, err := filepath.Abs("testdata/proxy-server.py")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"/usr/bin/python3", script, strconv.Itoa(port), name} // Debian's, which any user may run
	if nobody {
		args = append([]string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := m.ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := m.ns.Do(func() error {
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			return cmd
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stack's server on %d did not listen: %v\n%s", port, err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// curl runs curl in the daemon's network namespace and returns its output and the response's
// status code (curl's -w).
func (m *mount) curl(args ...string) (body string, code int) {
	m.t.Helper()
	testtool.Need(m.t, "curl")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "curl", append([]string{"-sS", "-w", "\n%{http_code}"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := m.ns.Do(cmd.Run); err != nil {
		m.t.Fatalf("curl %v: %v\n%s", args, err, errb.String())
	}
	s := out.String()
	i := strings.LastIndexByte(s, '\n')
	code, _ = strconv.Atoi(s[i+1:])
	return s[:i], code
}

// routeState is a non-routed answer's JSON.
func routeState(t *testing.T, body string) map[string]any {
	t.Helper()
	var st map[string]any
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("not the proxy's JSON answer: %v\n%s", err, body)
	}
	return st
}

// Two stacks through the proxy in a real browser: each page is its own origin, so each sees only
// its own cookie; a WebSocket echoes through; a drain shows on the page at once; curl gets the
// same answers as JSON.
func TestProxyInABrowser(t *testing.T) {
	t.Parallel()
	m := newMount(t, "--proxy", strconv.Itoa(proxyPort))
	m.setupApp(20, map[string]int{"HTTP": 37000, "API": 37001}, "a", "b")
	m.ok("touch $M/app/stacks/a/holders/me $M/app/stacks/b/holders/me")
	pa, _ := strconv.Atoi(strings.TrimSpace(m.read("app/stacks/a/ports/HTTP")))
	pb, _ := strconv.Atoi(strings.TrimSpace(m.read("app/stacks/b/ports/HTTP")))
	startStackServer(t, m, pa, "a", false)
	startStackServer(t, m, pb, "b", false)
	urlA := fmt.Sprintf("http://http.a.app.localhost:%d/", proxyPort)
	urlB := fmt.Sprintf("http://http.b.app.localhost:%d/", proxyPort)

	br := startBrowser(t, m.ns)
	stackAndCookies := `document.getElementById("stack").textContent + " " + document.getElementById("cookies").textContent`
	br.open(urlA)
	if got := br.eval(stackAndCookies); got != "a " {
		t.Fatalf("first load of a: %q", got)
	}
	br.open(urlB)
	if got := br.eval(stackAndCookies); got != "b " {
		t.Fatalf("first load of b (a's cookie set before it): %q", got)
	}
	br.open(urlB)
	if got := br.eval(`document.getElementById("cookies").textContent`); got != "stack=b" {
		t.Fatalf("b's second load was sent %q, want only its own cookie stack=b", got)
	}
	br.open(urlA)
	if got := br.eval(`document.getElementById("cookies").textContent`); got != "stack=a" {
		t.Fatalf("a's second load was sent %q, want only its own cookie stack=a", got)
	}
	echo := br.eval(`new Promise((resolve, reject) => {
		const ws = new WebSocket("ws://" + location.host + "/ws");
		ws.onopen = () => ws.send("ping");
		ws.onmessage = e => { resolve(e.data); ws.close(); };
		ws.onerror = () => reject(new Error("websocket failed"));
	})`)
	if echo != "a:ping" {
		t.Fatalf("websocket echo through the proxy: %q, want a:ping", echo)
	}

	// A drain reserved: the page says so, while the server still runs.
	m.ok("cd $M/app/stacks/a && echo sleep > drain/request")
	if got := br.open(urlA); !strings.Contains(got, "draining") {
		t.Fatalf("a's page while draining: %q", got)
	}
	if got := br.eval(`document.getElementById("state").dataset.state`); got != "draining" {
		t.Fatalf("a's page state while draining: %q", got)
	}
	body, code := m.curl(urlA)
	if st := routeState(t, body); code != 503 || st["state"] != "draining" || st["stack"] != "a" {
		t.Fatalf("curl while draining: %d %v", code, st)
	}
	// Drained: the lease is gone, and the port with it, though the server still listens.
	m.ok("cd $M/app/stacks/a && echo start > drain/attempt && echo success > drain/outcome")
	if got := br.eval(`fetch(location.href, {headers: {Accept: "text/html"}}).then(r => r.text())`); !strings.Contains(got, `data-state="no-lease"`) {
		t.Fatalf("a's page after the drain: %q", got)
	}
	body, code = m.curl(urlA)
	if st := routeState(t, body); code != 503 || st["state"] != "no-lease" {
		t.Fatalf("curl after the drain: %d %v", code, st)
	}
	// b is untouched.
	br.open(urlB)
	if got := br.eval(stackAndCookies); got != "b stack=b" {
		t.Fatalf("b after a's drain: %q", got)
	}
}

// What the upstream is sent, streaming, and every answer that is not a route, through curl.
func TestProxyAnswers(t *testing.T) {
	t.Parallel()
	m := newMount(t, "--proxy", strconv.Itoa(proxyPort))
	m.setupApp(20, map[string]int{"HTTP": 37100}, "s", "idle")
	m.ok("touch $M/app/stacks/s/holders/me")
	port, _ := strconv.Atoi(strings.TrimSpace(m.read("app/stacks/s/ports/HTTP")))
	url := func(name string, path string) string {
		return fmt.Sprintf("http://%s.app.localhost:%d%s", name, proxyPort, path)
	}

	// Nothing listens yet.
	body, code := m.curl(url("http.s", "/"))
	if st := routeState(t, body); code != 503 || st["state"] != "not-serving" || !strings.Contains(st["fix"].(string), strconv.Itoa(port)) {
		t.Fatalf("before the server starts: %d %v", code, st)
	}
	server := startStackServer(t, m, port, "s", false)

	body, code = m.curl(url("http.s", "/headers"))
	var h map[string]string
	if err := json.Unmarshal([]byte(body), &h); err != nil || code != 200 {
		t.Fatalf("/headers: %d %s", code, body)
	}
	if h["Host"] != fmt.Sprintf("http.s.app.localhost:%d", proxyPort) || h["X-Forwarded-Host"] != h["Host"] ||
		h["X-Forwarded-Proto"] != "http" || h["X-Forwarded-For"] != "127.0.0.1" {
		t.Fatalf("headers the server was sent: %v", h)
	}
	// Names are matched without case, as browsers lower-case them.
	if _, code := m.curl(url("HTTP.S", "/")); code != 200 {
		t.Fatalf("upper-case name: %d", code)
	}
	if body, _ := m.curl("-N", url("http.s", "/stream")); body != "line 0\nline 1\nline 2\n" {
		t.Fatalf("streamed: %q", body)
	}

	for _, c := range []struct {
		host, state string
		code        int
	}{
		{"http.nosuch", "unknown", 404},
		{"web.s", "no-entrypoint", 404},
		{"http.idle", "no-lease", 503},
	} {
		body, code := m.curl(url(c.host, "/"))
		if st := routeState(t, body); code != c.code || st["state"] != c.state || st["message"] == "" || st["fix"] == "" {
			t.Errorf("%s: %d %v, want %d %s", c.host, code, st, c.code, c.state)
		}
	}
	// A stack made after the proxy last looked is found at once, and a removed one is gone.
	m.ok("mkdir $M/app/stacks/late")
	if body, code := m.curl(url("http.late", "/")); code != 503 || routeState(t, body)["state"] != "no-lease" {
		t.Fatalf("a stack made a moment ago: %d %s", code, body)
	}
	m.ok("rmdir $M/app/stacks/late")
	if body, code := m.curl(url("http.late", "/")); code != 404 || routeState(t, body)["state"] != "unknown" {
		t.Fatalf("a stack removed a moment ago: %d %s", code, body)
	}
	// A host no stack's name can be as long as (thousands of dots) is unknown at once.
	if body, code := m.curl("-H", "Host: "+strings.Repeat("a.", 2000)+"app.localhost", fmt.Sprintf("http://127.0.0.1:%d/", proxyPort)); code != 404 || !strings.Contains(routeState(t, body)["message"].(string), "longer than any stack's") {
		t.Fatalf("a host of 2,000 dots: %d %s", code, body)
	}
	// A browser's request gets a page that reloads itself while the stack may come back.
	out, _ := m.curl("-i", "-H", "Accept: text/html", url("http.idle", "/"))
	if !strings.Contains(out, "Refresh: 2") || !strings.Contains(out, `data-state="no-lease"`) {
		t.Fatalf("HTML answer:\n%s", out)
	}

	// Another user listening on the stack's port is not proxied to.
	server.Process.Kill()
	server.Wait()
	startStackServer(t, m, port, "intruder", true)
	body, code = m.curl(url("http.s", "/"))
	if st := routeState(t, body); code != 502 || st["state"] != "foreign" || !strings.Contains(st["message"].(string), "uid 65534") {
		t.Fatalf("a co-user's server on the port: %d %v", code, st)
	}

	// The index lists every stack's web entrypoints.
	body, _ = m.curl(fmt.Sprintf("http://localhost:%d/", proxyPort))
	if !strings.Contains(body, url("http.s", "/")) || strings.Contains(body, "idle") {
		t.Fatalf("index: %s", body)
	}
}

// The proxied URLs are shown beside the ports' where users look, and an entrypoint declared
// proxied exports its proxied URL; without --proxy nothing changes.
func TestProxyURLsInTheTree(t *testing.T) {
	t.Parallel()
	m := newMount(t, "--proxy", strconv.Itoa(proxyPort))
	m.ok(`mkdir $M/app && cat > $M/app/config <<'EOF'
[ports]
step = 10
count = 20
[ports.bases]
HTTP = 37200
DB = 37201
[entrypoints.web]
port = "HTTP"
path = "/app"
proxied = true
[entrypoints.database]
port = "DB"
path = "/"
scheme = "postgres"
EOF
mkdir $M/app/stacks/s && touch $M/app/stacks/s/holders/me`)
	want := fmt.Sprintf("http://web.s.app.localhost:%d/app", proxyPort)
	if got := m.read("app/stacks/s/entrypoints/web"); got != want+"\n" {
		t.Fatalf("entrypoints/web = %q, want %q", got, want)
	}
	if env := m.read("app/stacks/s/env"); !strings.Contains(env, "WEB_URL="+want+"\n") || !strings.Contains(env, "DATABASE_URL=postgres://127.0.0.1:37201/\n") {
		t.Fatalf("env:\n%s", env)
	}
	var eps struct{ Values []map[string]string }
	if err := json.Unmarshal([]byte(m.read("app/stacks/s/entrypoints.json")), &eps); err != nil {
		t.Fatal(err)
	}
	proxied := map[string]string{}
	for _, v := range eps.Values {
		proxied[v["name"]] = v["proxied"]
		if v["name"] == "web" && v["value"] != "http://127.0.0.1:37200/app" {
			t.Fatalf("entrypoints.json keeps the port URL as value: %v", v)
		}
	}
	if proxied["web"] != want || proxied["http"] != fmt.Sprintf("http://http.s.app.localhost:%d/", proxyPort) || proxied["database"] != "" {
		t.Fatalf("entrypoints.json proxied URLs: %v", proxied)
	}
	if st := m.read("status"); !strings.Contains(st, "PROXIED") || !strings.Contains(st, want) {
		t.Fatalf("status:\n%s", st)
	}
	if st := m.read("status.json"); !strings.Contains(st, `"proxied"`) {
		t.Fatalf("status.json:\n%s", st)
	}
	// The proxy's index links each entrypoint as status shows it, its path included.
	if body, _ := m.curl(fmt.Sprintf("http://localhost:%d/", proxyPort)); !strings.Contains(body, `"url":"`+want+`"`) {
		t.Fatalf("index: %s", body)
	}

	// proxied on a non-web scheme is refused at the write, the config unchanged.
	before := m.read("app/config")
	m.refused(`printf '[ports]\nstep = 10\ncount = 20\n[ports.bases]\nDB = 37201\n[entrypoints.database]\nport = "DB"\npath = "/"\nscheme = "postgres"\nproxied = true\n' > $M/app/config`, syscall.EINVAL)
	if after := m.read("app/config"); after != before {
		t.Fatalf("config changed by a refused write:\n%s", after)
	}
	if ev := m.lastEvent("app/events"); !strings.Contains(ev, "only an http or https entrypoint can be proxied") {
		t.Fatalf("events line: %s", ev)
	}

	// Without a proxy, the port URLs, and no proxied column or field.
	plain := newMount(t)
	plain.ok(`mkdir $M/app && printf '[ports]\nstep = 10\ncount = 20\n[ports.bases]\nHTTP = 37300\n[entrypoints.web]\nport = "HTTP"\npath = "/"\nproxied = true\n' > $M/app/config && mkdir $M/app/stacks/s && touch $M/app/stacks/s/holders/me`)
	if got := plain.read("app/stacks/s/entrypoints/web"); got != "http://127.0.0.1:37300/\n" {
		t.Fatalf("entrypoints/web without a proxy: %q", got)
	}
	if st := plain.read("status"); strings.Contains(st, "PROXIED") {
		t.Fatalf("status without a proxy:\n%s", st)
	}
}

// The proxy's port is refused when taken, before anything is mounted; it is held machine-wide,
// so no lease takes it.
func TestProxyPortTaken(t *testing.T) {
	t.Parallel()
	m := newMount(t, "--proxy", strconv.Itoa(proxyPort))
	// A second daemon in the same namespace cannot serve the same proxy port.
	dir := t.TempDir()
	// Bounded, and detached after: a mount that wrongly served would otherwise hang the test.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t.Cleanup(func() { detach(filepath.Join(dir, "mnt")) })
	cmd := exec.CommandContext(ctx, binary, "mount", "--data", filepath.Join(dir, "data"), "--proxy", strconv.Itoa(proxyPort), filepath.Join(dir, "mnt"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := m.ns.Do(cmd.Run)
	if err == nil || !strings.Contains(out.String(), fmt.Sprintf("--proxy %d: the port is held by", proxyPort)) {
		t.Fatalf("second daemon on the same proxy port: %v\n%s", err, out.String())
	}
	if mounted(filepath.Join(dir, "mnt")) {
		t.Fatal("a refused proxy left a mount")
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Fatalf("a refused mount left its fresh store: %v", err)
	}
	// On a store that exists, the refused mount adds no backup (a service manager restarting it
	// in a loop would rotate every older one out).
	stopped := newMount(t)
	stopped.Stop()
	backups := func() []string {
		names, _ := filepath.Glob(filepath.Join(stopped.Data, "backups", "*"))
		return names
	}
	before := backups()
	cmd = exec.CommandContext(ctx, binary, "mount", "--data", stopped.Data, "--proxy", strconv.Itoa(proxyPort), filepath.Join(dir, "mnt"))
	out.Reset()
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := m.ns.Do(cmd.Run); err == nil || !strings.Contains(out.String(), "the port is held by") {
		t.Fatalf("a daemon of a stopped store on the same proxy port: %v\n%s", err, out.String())
	}
	if after := backups(); len(before) == 0 || !slices.Equal(after, before) {
		t.Fatalf("the refused mount's backups: %v, before it %v\n%s", after, before, out.String())
	}
	// A cockpit whose first family would hold the proxy's port leases the next one.
	m.setupApp(20, map[string]int{"HTTP": proxyPort}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	if got := m.read("app/stacks/s/ports/HTTP"); got != strconv.Itoa(proxyPort+10)+"\n" {
		t.Fatalf("lease beside the proxy's port: %q, want %d", got, proxyPort+10)
	}
}

// With --proxy-https each name gets a certificate from a local CA made once in the data
// directory, its key 0600: curl trusting that CA reaches the stack; a key others can read is
// refused at the next mount.
func TestProxyHTTPS(t *testing.T) {
	t.Parallel()
	m := newMount(t, "--proxy", strconv.Itoa(proxyPort), "--proxy-https")
	m.setupApp(20, map[string]int{"HTTP": 37400}, "s")
	m.ok("touch $M/app/stacks/s/holders/me")
	port, _ := strconv.Atoi(strings.TrimSpace(m.read("app/stacks/s/ports/HTTP")))
	startStackServer(t, m, port, "s", false)
	ca, key := filepath.Join(m.Data, "proxy-ca.pem"), filepath.Join(m.Data, "proxy-ca-key.pem")
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key: %v %v", fi.Mode(), err)
	}
	url := fmt.Sprintf("https://http.s.app.localhost:%d/headers", proxyPort)
	body, code := m.curl("--cacert", ca, url)
	if code != 200 || !strings.Contains(body, `"X-Forwarded-Proto": "https"`) {
		t.Fatalf("through HTTPS: %d %s", code, body)
	}
	if got := m.read("app/stacks/s/entrypoints.json"); !strings.Contains(got, fmt.Sprintf(`"proxied":"https://http.s.app.localhost:%d/"`, proxyPort)) {
		t.Fatalf("entrypoints.json: %s", got)
	}
	// Without the CA, curl refuses the certificate: nothing is trusted by accident.
	cmd := exec.Command("curl", "-sS", url)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := m.ns.Do(cmd.Run); err == nil || !strings.Contains(errb.String(), "certificate") {
		t.Fatalf("curl without the CA: %v %s", err, errb.String())
	}

	m.Stop()
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a mount that wrongly served would hang
	defer cancel()
	again := exec.CommandContext(ctx, binary, "mount", "--data", m.Data, "--proxy", strconv.Itoa(proxyPort), "--proxy-https", m.Dir)
	var out bytes.Buffer
	again.Stdout, again.Stderr = &out, &out
	if err := m.ns.Do(again.Run); err == nil || !strings.Contains(out.String(), "is readable by others") || mounted(m.Dir) {
		t.Fatalf("mount with a CA key others can read: %v\n%s", err, out.String())
	}
	if err := os.Chmod(key, 0o600); err != nil {
		t.Fatal(err)
	}
	m.start(m.args...)
}

// A name that reads as two stacks' entrypoints (names differing only in case) is answered with
// what to rename, never routed to either.
func TestProxyAmbiguousName(t *testing.T) {
	t.Parallel()
	m := newMount(t, "--proxy", strconv.Itoa(proxyPort))
	m.setupApp(20, map[string]int{"HTTP": 37500}, "Feat", "feat")
	m.ok("touch $M/app/stacks/Feat/holders/me $M/app/stacks/feat/holders/me")
	body, code := m.curl(fmt.Sprintf("http://http.feat.app.localhost:%d/", proxyPort))
	if st := routeState(t, body); code != 409 || st["state"] != "ambiguous" || !strings.Contains(st["fix"].(string), "rename") {
		t.Fatalf("two stacks differing in case: %d %v", code, st)
	}
}

// A request goes to whoever listens on the stack's port now, never over a connection the proxy
// kept to a listener that went: stack a's server closes its listening socket and keeps the
// connection the proxy made, a is drained, b takes the port and serves; b's request reaches b.
// (The proxy's connections were pooled by port: another user's server that let its port go
// received the next stack's requests, cookies and all.)
func TestProxyConnectionsFollowTheListener(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "python3")
	m := newMount(t, "--proxy", strconv.Itoa(proxyPort))
	m.setupApp(1, map[string]int{"HTTP": 37300}, "a", "b")
	m.ok("touch $M/app/stacks/a/holders/me")
	// a's server: one connection, its listening socket closed once accepted, then every request
	// on it answered "a" and kept alive.
	a := exec.Command("/usr/bin/python3", "-c", `
import socket
ln = socket.socket(); ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ln.bind(("127.0.0.1", 37300)); ln.listen(8)
conn, _ = ln.accept(); ln.close()
f = conn.makefile("rb")
while True:
    line = f.readline()
    if not line: break
    while line not in (b"\r\n", b"\n", b""): line = f.readline()
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive\r\n\r\na")
`)
	if err := m.ns.Do(a.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Process.Kill(); a.Wait() })
	url := func(stack string) string { return fmt.Sprintf("http://http.%s.app.localhost:%d/", stack, proxyPort) }
	waitFor(t, func() string { return "a's server through the proxy" }, func() bool {
		body, code := m.curl(url("a"))
		return code == 200 && body == "a"
	})
	m.ok(`S=$M/app/stacks/a; echo sleep > $S/drain/request && echo start pid=none > $S/drain/attempt && echo success > $S/drain/outcome`)
	m.ok("touch $M/app/stacks/b/holders/me")
	if port := strings.TrimSpace(m.read("app/stacks/b/ports/HTTP")); port != "37300" {
		t.Fatalf("b leased %s, want a's 37300", port)
	}
	startStackServer(t, m, 37300, "b", false)
	for i := range 3 {
		body, code := m.curl(url("b"))
		if code != 200 || !strings.Contains(body, `<p id="stack">b</p>`) {
			t.Fatalf("b's request %d: %d %q, want b's page", i, code, body)
		}
	}
}

// One user's connections to the proxy are bounded (256 at once), so they cannot take the
// descriptors every user's commits need, nor the proxy from other users: nobody's 300 held
// connections get 256 answers and 44 closed unanswered, one line in the log says so however often
// nobody comes back to its bound, root is served meanwhile, and once nobody lets go it connects
// again.
func TestProxyBoundsEachUsersConnections(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "python3")
	m := newMount(t, "--proxy", strconv.Itoa(proxyPort))
	hold := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", `
import socket, sys
answered = closed = 0
held = []
for i in range(300):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    s.settimeout(20)
    try:
        s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\r\n")
        reply = s.recv(65536)
    except ConnectionResetError:
        reply = b""
    if reply.startswith(b"HTTP/1.1 200"):
        answered += 1
        held.append(s)
    else:
        closed += 1
        s.close()
print("answered", answered, "closed", closed, flush=True)
# At its bound and back below, again and again: one of two new connections is taken each time.
held.pop().close()
for i in range(20):
    pair = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(2)]
    for s in pair:
        s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\r\n")
    for s in pair:
        try:
            s.recv(65536)
        except ConnectionResetError:
            pass
        s.close()
print("churned", flush=True)
sys.stdin.read()
`, strconv.Itoa(proxyPort))
	out := &syncBuffer{}
	hold.Stdout, hold.Stderr = out, out
	stdin, release, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer release.Close()
	hold.Stdin = stdin
	if err := m.ns.Do(hold.Start); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	t.Cleanup(func() { hold.Process.Kill(); hold.Wait() })
	waitFor(t, func() string { return "nobody's connections: " + out.String() }, func() bool {
		return strings.Contains(out.String(), "churned\n")
	})
	if got := out.String(); got != "answered 256 closed 44\nchurned\n" {
		t.Fatalf("nobody's 300 connections: %q, want 256 answered and 44 closed", got)
	}
	if _, code := m.curl("-H", "Accept: application/json", fmt.Sprintf("http://localhost:%d/", proxyPort)); code != 200 {
		t.Fatalf("root's request beside nobody's connections: %d", code)
	}
	if n := strings.Count(m.log.String(), "proxy: uid 65534 holds 256 connections to the proxy, its most"); n != 1 {
		t.Fatalf("%d log lines about nobody's bound, want 1:\n%s", n, m.log)
	}
	release.Close()
	hold.Wait()
	waitFor(t, func() string { return "nobody's connection once it let go" }, func() bool {
		r := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "curl", "-sf", "-o", "/dev/null", fmt.Sprintf("http://localhost:%d/", proxyPort))
		return m.ns.Do(r.Run) == nil
	})
}

// A name that could mean two stacks (app/feat, and App/feat that another user made) leads each
// user to the one that is theirs, the stack they made or hold before one of their cockpits:
// another user's mkdir of a name in another case, in their own cockpit or in yours, cannot take a
// stack's name from its owner. A user with neither gets the ambiguity.
func TestProxyAmbiguousNameLeadsToYours(t *testing.T) {
	t.Parallel()
	m := ownershipMount(t, "--allow-other", "--proxy", strconv.Itoa(proxyPort))
	m.setupApp(20, map[string]int{"HTTP": 37600}, "feat")
	m.ok("touch $M/app/stacks/feat/holders/me")
	startStackServer(t, m, 37600, "feat", false)
	asUIDOK(m, 65534, "mkdir $M/App && mkdir $M/App/stacks/feat")
	url := fmt.Sprintf("http://http.feat.app.localhost:%d/", proxyPort)
	curlAs := func(uid int) (string, int) {
		var out bytes.Buffer
		cmd := exec.Command("setpriv", "--reuid="+strconv.Itoa(uid), "--regid="+strconv.Itoa(uid), "--clear-groups",
			"curl", "-sS", "-H", "Accept: application/json", "-w", "\n%{http_code}", url)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := m.ns.Do(cmd.Run); err != nil {
			t.Fatalf("curl as %d: %v\n%s", uid, err, out.String())
		}
		s := out.String()
		i := strings.LastIndexByte(s, '\n')
		code, _ := strconv.Atoi(s[i+1:])
		return s[:i], code
	}
	// Once the proxy's index has both (within a second), uid 4321, whose neither is, is told.
	waitFor(t, func() string { return "the name to read as two stacks" }, func() bool {
		_, code := curlAs(pinningUser)
		return code == 409
	})
	if body, code := curlAs(0); code != 200 || !strings.Contains(body, `<p id="stack">feat</p>`) {
		t.Fatalf("root's request for its own stack beside nobody's App/feat: %d %s", code, body)
	}
	if body, code := curlAs(65534); code != 503 || routeState(t, body)["state"] != "no-lease" || routeState(t, body)["cockpit"] != "App" {
		t.Fatalf("nobody's request, for its own App/feat: %d %s", code, body)
	}
	// nobody's Feat in root's own cockpit: root owns both stacks' cockpit, but made feat alone.
	asUIDOK(m, 65534, "mkdir $M/app/stacks/Feat")
	waitFor(t, func() string { return "the name to read as nobody's two stacks" }, func() bool {
		_, code := curlAs(65534)
		return code == 409
	})
	if body, code := curlAs(0); code != 200 || !strings.Contains(body, `<p id="stack">feat</p>`) {
		t.Fatalf("root's request for the stack it made beside nobody's app/Feat: %d %s", code, body)
	}
}

// One user's requests under way through the proxy are bounded (256), however few connections
// carry them: nobody's 300 requests over HTTP/2 (one connection) to a server of theirs that never
// answers get 44 answered 429 at once, where each used to hold a connection to that server, a
// descriptor of the daemon's, until it answered.
func TestProxyBoundsEachUsersRequestsInFlight(t *testing.T) {
	t.Parallel()
	testtool.Need(t, "python3", "curl")
	m := ownershipMount(t, "--allow-other", "--proxy", strconv.Itoa(proxyPort), "--proxy-https")
	m.setupApp(20, map[string]int{"HTTP": 37700})
	asUIDOK(m, 65534, "mkdir $M/app/stacks/n && touch $M/app/stacks/n/holders/me")
	// nobody's server: accepts every connection and never answers.
	mute := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", `
import socket, threading
ln = socket.socket(); ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ln.bind(("127.0.0.1", 37700)); ln.listen(1024)
held = []
while True:
    c, _ = ln.accept(); held.append(c)
`)
	if err := m.ns.Do(mute.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mute.Process.Kill(); mute.Wait() })
	waitFor(t, func() string { return "nobody's server to listen" }, func() bool {
		return m.ns.Do(func() error {
			c, err := net.Dial("tcp", "127.0.0.1:37700")
			if err == nil {
				c.Close()
			}
			return err
		}) == nil
	})
	url := fmt.Sprintf("https://http.n.app.localhost:%d/", proxyPort)
	args := []string{"--reuid=65534", "--regid=65534", "--clear-groups", "curl", "-sk", "--http2", "--parallel", "--parallel-max", "300",
		"-m", "5", "-o", "/dev/null", "-w", "%{http_code}\n"}
	for range 300 {
		args = append(args, url)
	}
	var out bytes.Buffer
	curl := exec.Command("setpriv", args...)
	curl.Stdout = &out
	_ = m.ns.Do(curl.Run) // the requests left unanswered time out
	codes := map[string]int{}
	for _, c := range strings.Fields(out.String()) {
		codes[c]++
	}
	if codes["429"] != 44 {
		t.Fatalf("nobody's 300 requests in flight: answers %v, want 44 of 429", codes)
	}
}
