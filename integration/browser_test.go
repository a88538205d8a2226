package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/netns"
	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// browser is headless Chromium driven over the DevTools protocol on a pipe
// (--remote-debugging-pipe: JSON messages ended by NUL on fds 3 and 4), one page attached.
type browser struct {
	t       *testing.T
	cmd     *exec.Cmd
	in      *os.File
	out     *bufio.Reader
	mu      sync.Mutex
	id      int
	session string
}

// startBrowser runs Chromium in ns (where the daemon's proxy listens) with a profile of its own,
// stopped when the test ends, and opens one blank page.
func startBrowser(t *testing.T, ns *netns.NS) *browser {
	t.Helper()
	testtool.Need(t, "chromium")
	toBrowser, browserIn, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	browserOut, fromBrowser, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("chromium", "--headless=new", "--remote-debugging-pipe", "--no-first-run",
		"--no-default-browser-check", "--disable-gpu", "--disable-extensions", "--disable-dev-shm-usage",
		"--user-data-dir="+t.TempDir(), "about:blank")
	if os.Geteuid() == 0 {
		cmd.Args = append(cmd.Args[:1], append([]string{"--no-sandbox"}, cmd.Args[1:]...)...) // root has no user namespace sandbox
	}
	cmd.ExtraFiles = []*os.File{toBrowser, fromBrowser} // fds 3 and 4
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	toBrowser.Close()
	fromBrowser.Close()
	b := &browser{t: t, cmd: cmd, in: browserIn, out: bufio.NewReader(browserOut)}
	t.Cleanup(func() {
		browserIn.Close()
		cmd.Process.Kill()
		cmd.Wait()
		browserOut.Close()
	})
	var target struct{ TargetID string }
	b.call("Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var attached struct{ SessionID string }
	b.call("Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached)
	b.session = attached.SessionID
	return b
}

// call sends one command (to the attached page once there is one) and decodes its result into
// result; events in between are skipped.
func (b *browser) call(method string, params any, result any) {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.id++
	msg := map[string]any{"id": b.id, "method": method, "params": params}
	if b.session != "" {
		msg["sessionId"] = b.session
	}
	data, _ := json.Marshal(msg)
	if _, err := b.in.Write(append(data, 0)); err != nil {
		b.t.Fatalf("%s: %v", method, err)
	}
	for {
		line, err := b.out.ReadBytes(0)
		if err != nil {
			b.t.Fatalf("%s: reading the browser's answer: %v", method, err)
		}
		var reply struct {
			ID     int
			Result json.RawMessage
			Error  *struct{ Message string }
		}
		if err := json.Unmarshal(line[:len(line)-1], &reply); err != nil {
			b.t.Fatalf("%s: %v in %q", method, err, line)
		}
		if reply.ID != b.id {
			continue // an event, or an answer to nobody
		}
		if reply.Error != nil {
			b.t.Fatalf("%s: %s", method, reply.Error.Message)
		}
		if result != nil {
			if err := json.Unmarshal(reply.Result, result); err != nil {
				b.t.Fatalf("%s: %v", method, err)
			}
		}
		return
	}
}

// eval evaluates a JavaScript expression in the page (awaiting a promise) and returns its value
// as a string.
func (b *browser) eval(expr string) string {
	b.t.Helper()
	var out struct {
		Result struct {
			Value any
		}
		ExceptionDetails *struct{ Text string }
	}
	b.call("Runtime.evaluate", map[string]any{"expression": expr, "awaitPromise": true, "returnByValue": true}, &out)
	if out.ExceptionDetails != nil {
		b.t.Fatalf("%s: %s", expr, out.ExceptionDetails.Text)
	}
	if s, ok := out.Result.Value.(string); ok {
		return s
	}
	return fmt.Sprint(out.Result.Value)
}

// open navigates the page to url and waits until it has loaded; it returns the page's text.
func (b *browser) open(url string) string {
	b.t.Helper()
	b.call("Page.navigate", map[string]any{"url": url}, nil)
	deadline := time.Now().Add(20 * time.Second)
	for {
		state := b.eval(`location.href + " " + document.readyState`)
		if strings.HasPrefix(state, url) && strings.HasSuffix(state, " complete") {
			return b.eval("document.body ? document.body.innerText : ''")
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s not loaded: %s", url, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
