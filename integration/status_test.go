package integration

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// status shows every stack, port, holder (live, dead, untracked, with its command) and drain in
// one aligned table; status.json holds the same rows.
func TestStatusTableAndJSON(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.setupApp(5, map[string]int{"HTTP": 37660}, "busy", "draining")
	// A live holder whose command is known: a sleep the test runs, named by pid.
	sleeper := m.shell(t.TempDir())
	pid := strings.TrimSpace(sleeper.run("sleep 300 & echo $!"))
	m.ok("touch $M/app/stacks/busy/holders/live && echo pid=" + pid + " > $M/app/stacks/busy/holders/live")
	// A dead one: a process that has exited.
	dead := strings.TrimSpace(m.ok("sleep 0.01 & echo $!; wait"))
	m.ok("touch $M/app/stacks/busy/holders/gone")
	if r := m.sh("echo pid=" + dead + " > $M/app/stacks/busy/holders/gone"); r.Code != 0 {
		// The pid is gone already, which the write refuses: make the holder untracked instead.
		m.ok("echo pid=none > $M/app/stacks/busy/holders/gone")
		dead = ""
	}
	m.ok("cd $M/app/stacks/draining && touch holders/me && echo pid=none > holders/me && echo 'down volume:db' > drain/request && echo start pid=none > drain/attempt")

	table := m.read("status")
	lines := strings.Split(strings.TrimSuffix(table, "\n"), "\n")
	header := lines[0]
	columns := strings.Fields(header)
	if strings.Join(columns, " ") != "COCKPIT STACK REV PORTS HOLDER STATE PID COMMAND CHECKOUT DRAIN" {
		t.Fatalf("header: %q", header)
	}
	// Aligned: every value starts where its column's title does.
	for _, line := range lines[1:] {
		for _, title := range columns[1:] {
			at := strings.Index(header, " "+title) + 1
			if at >= len(line) || line[at-1] != ' ' || line[at] == ' ' {
				t.Fatalf("column %s is not aligned in:\n%s", title, table)
			}
		}
	}
	row := func(holder string) []string {
		for _, line := range lines[1:] {
			if f := strings.Fields(line); len(f) >= 10 && f[4] == holder {
				return f
			}
		}
		t.Fatalf("no row for holder %s:\n%s", holder, table)
		return nil
	}
	if f := row("live"); f[0] != "app" || f[1] != "busy" || f[3] != "HTTP=37660" || f[5] != "live" || f[6] != pid || f[7] != "sleep" {
		t.Fatalf("the live holder's row: %v\n%s", f, table)
	}
	if dead != "" {
		if f := row("gone"); f[5] != "dead" || f[6] != dead || f[7] != "-" {
			t.Fatalf("the dead holder's row: %v\n%s", f, table)
		}
	}
	if f := row("me"); f[1] != "draining" || f[3] != "HTTP=37670" || f[5] != "untracked" || strings.Join(f[9:], " ") != "down 0/2 runtime-stop stack (active)" {
		t.Fatalf("the draining stack's row: %v\n%s", f, table)
	}

	var st struct {
		Cockpits []struct {
			Name   string
			Stacks []struct {
				Name     string
				Revision int64
				Ports    map[string]int
				Holders  []struct {
					Name, State, Command, Checkout string
					PID                            int
				}
				Drain *struct {
					Purpose                   string
					CompletedActions, Actions int
					Attempt, Stage, Target    string
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(m.read("status.json")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Cockpits) != 1 || len(st.Cockpits[0].Stacks) != 2 {
		t.Fatalf("status.json: %+v", st)
	}
	busy, draining := st.Cockpits[0].Stacks[0], st.Cockpits[0].Stacks[1]
	if busy.Name != "busy" || busy.Ports["HTTP"] != 37660 || len(busy.Holders) != 2 || busy.Holders[1].Name != "live" ||
		strconv.Itoa(busy.Holders[1].PID) != pid || busy.Holders[1].Command != "sleep" || busy.Drain != nil {
		t.Fatalf("status.json's busy stack: %+v", busy)
	}
	if d := draining.Drain; d == nil || d.Purpose != "down" || d.Actions != 2 || d.Attempt != "active" || d.Stage != "runtime-stop" {
		t.Fatalf("status.json's drain: %+v", draining.Drain)
	}
}
