package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
)

// statusFile reads the root file format shows.
func statusFile(t *testing.T, e *Engine, format StatusFormat) []byte {
	t.Helper()
	data, _, err := e.StatusFile(format)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// scannedStatus is the status one read of every record makes, as a keeper's first read does.
func scannedStatus(t *testing.T, e *Engine, format StatusFormat) []byte {
	t.Helper()
	var k statusKeeper
	st, err := k.current(e)
	if err != nil {
		t.Fatal(err)
	}
	if format == StatusTable {
		return st.Table()
	}
	data, err := st.JSON()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// The status kept from commits reads, after every kind of commit that changes what it shows, what
// a read of every record reads: cockpits made and removed, stacks made and removed, claims and
// releases, a drain, a config that changes the stacks' entrypoints while a proxy serves, and
// another cockpit's commits between two reads. Commits on stacks it shows already put their rows
// in place.
func TestStatusKeptIsWhatAScanReads(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	check := func(step string) {
		t.Helper()
		for _, format := range []StatusFormat{StatusTable, StatusJSON} {
			if got, want := statusFile(t, e, format), scannedStatus(t, e, format); !bytes.Equal(got, want) {
				t.Fatalf("after %s, format %d: the kept status reads\n%s\na scan reads\n%s", step, format, got, want)
			}
		}
	}
	check("nothing")
	newCockpit(t, e, "app", exampleConfig, "a", "b")
	check("a cockpit with two stacks")
	claim(t, e, "app", "a", "me")
	claim(t, e, "app", "b", "me")
	check("two claims")
	newCockpit(t, e, "web", exampleConfig, "x")
	claim(t, e, "web", "x", "ci")
	check("another cockpit's claim")
	assembled := e.status.st
	claim(t, e, "app", "a", "other")
	if err := e.Release(ctx, me("unlink", "app/stacks/a/holders/me"), "app", "a", "me"); err != nil {
		t.Fatal(err)
	}
	check("a second holder and a release")
	if e.status.st != assembled {
		t.Fatal("commits on a stack shown already had every row assembled again, not theirs put in place")
	}
	sleepDrain(t, e, "app", "b", "me")
	check("a drain")
	e.ServeProxy("http", 8080)
	check("a proxy served")
	if err := e.SetConfig(ctx, me("write", "app/config"), "app", []byte(exampleConfig+"[entrypoints.web]\nport = \"HTTP\"\npath = \"/\"\nproxied = true\n")); err != nil {
		t.Fatal(err)
	}
	claim(t, e, "app", "a", "again")
	if table := statusFile(t, e, StatusTable); !strings.Contains(string(table), "http://web.a.app.localhost:8080/") {
		t.Fatalf("the proxied URL of the new config's entrypoint is not shown:\n%s", table)
	}
	check("a config with a proxied entrypoint")
	sleepDrain(t, e, "web", "x", "ci")
	if err := e.RemoveStack(ctx, me("rmdir", "web/stacks/x"), "web", "x"); err != nil {
		t.Fatal(err)
	}
	check("a released stack removed")
	if err := e.RemoveCockpit(ctx, me("rmdir", "web"), "web"); err != nil {
		t.Fatal(err)
	}
	check("a cockpit removed")
}

// Every read observes the holders' processes, with no commit between: a holder whose process
// exits reads live, then dead. What no commit and no observation changed is not rendered again.
func TestStatusObservesHoldersAtEveryRead(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "s", "t")
	claim(t, e, "app", "t", "ci")
	sleeper := exec.Command("sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	pid := strconv.Itoa(sleeper.Process.Pid)
	if err := e.Claim(ctx, me("create", "app/stacks/s/holders/job"), "app", "s", "job", &Holder{PID: sleeper.Process.Pid, CheckoutPath: "/src"}); err != nil {
		t.Fatal(err)
	}
	row := func(table []byte) string {
		for _, line := range strings.Split(string(table), "\n") {
			if f := strings.Fields(line); len(f) > 6 && f[4] == "job" {
				return strings.Join(f[5:], " ")
			}
		}
		t.Fatalf("no row of job in\n%s", table)
		return ""
	}
	first := statusFile(t, e, StatusTable)
	if got, want := row(first), "live "+pid+" sleep /src -"; got != want {
		t.Fatalf("job's row: %q, want %q", got, want)
	}
	if again := statusFile(t, e, StatusTable); &again[0] != &first[0] {
		t.Fatal("a read with nothing changed rendered the status again")
	}
	sleeper.Process.Kill()
	sleeper.Wait()
	if got, want := row(statusFile(t, e, StatusTable)), "dead "+pid+" - /src -"; got != want {
		t.Fatalf("job's row once its process exited: %q, want %q", got, want)
	}
	if got, want := statusFile(t, e, StatusJSON), scannedStatus(t, e, StatusJSON); !bytes.Equal(got, want) {
		t.Fatalf("status.json reads\n%s\na scan reads\n%s", got, want)
	}
}

// tabwriterTable is the table as text/tabwriter lays it out, each row's cells formatted from its
// values: what Table must print.
func tabwriterTable(st machineStatus) []byte {
	var b bytes.Buffer
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	proxied := false
	for _, c := range st.Cockpits {
		for _, s := range c.Stacks {
			proxied = proxied || len(s.Proxied) > 0
		}
	}
	header, tail := "", func(stackStatus) string { return "" }
	if proxied {
		header, tail = "\tPROXIED", func(s stackStatus) string { return "\t" + proxiedText(s.Proxied) }
	}
	fmt.Fprintln(w, "COCKPIT\tSTACK\tREV\tPORTS\tHOLDER\tSTATE\tPID\tCOMMAND\tCHECKOUT\tDRAIN"+header)
	for _, c := range st.Cockpits {
		if len(c.Stacks) == 0 {
			fmt.Fprintf(w, "%s\t-\t-\t-\t-\t-\t-\t-\t-\t-%s\n", c.Name, tail(stackStatus{}))
		}
		for _, s := range c.Stacks {
			ports, drain := portsText(s.Ports), drainText(s.Drain)
			if len(s.Holders) == 0 {
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t-\t-\t-\t-\t-\t%s%s\n", c.Name, s.Name, s.Revision, ports, drain, tail(s))
			}
			for _, h := range s.Holders {
				pid := "-"
				if h.PID != 0 {
					pid = fmt.Sprint(h.PID)
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s%s\n", c.Name, s.Name, s.Revision, ports,
					h.Name, h.State, pid, dash(h.Command), dash(h.Checkout), drain, tail(s))
			}
		}
	}
	w.Flush()
	return b.Bytes()
}

// oddStatus is a status of what the table and JSON must handle: cells of several runes' bytes,
// an empty cockpit, stacks without holders or lease, a drain, commands and checkouts a terminal
// would act on, text encoding/json escapes, with the proxied column or without.
func oddStatus(proxy bool) machineStatus {
	st := machineStatus{UpdatedAt: "2026-12-03T17:00:00.000Z", Cockpits: []cockpitStatus{
		{Name: "app", UID: 1000, Stacks: []stackStatus{
			{Name: "feature-x", Revision: 12, Ports: map[string]int{"HTTP": 47330, "DB": 47331}, Holders: []holderStatus{
				{Name: "ci", State: "untracked", Checkout: "/src/caf\u00e9/\u2615 <&>"},
				{Name: "me", State: "live", PID: 4242, Command: "node server.js --title=\u00fcber\x1b[31m\u200b\U000E0001", Checkout: "/home/u/x\ty"},
			}, Drain: &drainStatus{Purpose: "down", Completed: 1, Actions: 3, Attempt: "active", Stage: "reclaim", Target: "volume:cache"}},
			{Name: "idle", Holders: []holderStatus{}},
			{Name: "gone", Revision: 3, Holders: []holderStatus{{Name: "old", State: "dead", PID: 7, Checkout: ""}}},
		}},
		{Name: "empty", Stacks: []stackStatus{}},
		{Name: "web", Stacks: []stackStatus{{Name: "s", Revision: 1, Ports: map[string]int{"WEB": 8080}, Holders: []holderStatus{{Name: "h", State: "unknown", PID: 99999}}}}},
	}}
	if proxy {
		st.Cockpits[0].Stacks[0].Proxied = map[string]string{"web": "http://web.feature-x.app.localhost:8080/", "api": "http://api.feature-x.app.localhost:8080/v1"}
	}
	for i := range st.Cockpits {
		for j := range st.Cockpits[i].Stacks {
			st.Cockpits[i].Stacks[j] = st.Cockpits[i].Stacks[j].withCells()
		}
	}
	return st
}

// Table lays out what text/tabwriter would, byte for byte.
func TestStatusTableIsTabwriters(t *testing.T) {
	t.Parallel()
	for _, proxy := range []bool{false, true} {
		st := oddStatus(proxy)
		if got, want := st.Table(), tabwriterTable(st); !bytes.Equal(got, want) {
			t.Fatalf("proxied column %v: Table prints\n%s\ntext/tabwriter\n%s", proxy, got, want)
		}
	}
}

// JSON prints encoding/json's indented bytes, as PrintableJSON, however often it is rendered (each
// stack's text is kept), and with no cockpit at all.
func TestStatusJSONIsEncodingJSONs(t *testing.T) {
	t.Parallel()
	for _, st := range []machineStatus{oddStatus(false), oddStatus(true), {Cockpits: []cockpitStatus{}}} {
		data, err := json.MarshalIndent(st, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		want := append(PrintableJSON(data), '\n')
		for range 2 {
			if got, err := st.JSON(); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("JSON prints (%v)\n%s\nencoding/json\n%s", err, got, want)
			}
		}
	}
}
