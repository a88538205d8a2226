package integration

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestNeverStale alternates a writer process and a reader process through the mount: the writer
// claims or releases a holder, then the reader — started only after the writer's syscall returned —
// reads `revision`, stats `record` and reads it, lists `holders/` and reads a holder file. Every read must show the
// writer's latest change: whatever the kernel caches, a change is visible at the next open, stat
// and readdir (SPEC §2). COCKPITFS_STALE_ROUNDS sets the number of rounds (default 10000).
func TestNeverStale(t *testing.T) {
	rounds := 10000
	if v := os.Getenv("COCKPITFS_STALE_ROUNDS"); v != "" {
		rounds, _ = strconv.Atoi(v)
	}
	if testing.Short() {
		rounds = 500
	}
	m := newMount(t)
	m.setupApp(4, map[string]int{"HTTP": 38480}, "s")
	m.ok("touch $M/app/stacks/s/holders/keeper")
	stack := m.Path("app", "stacks", "s")

	// Two long-lived processes, each a loop reading one command a line from its stdin, so the
	// alternation costs no process spawn per round.
	writer := startLoop(t, `while read -r op h; do
		case $op in
		claim) : > "$S/holders/$h" ;;
		release) rm "$S/holders/$h" ;;
		esac && echo ok || echo failed; done`, stack)
	reader := startLoop(t, `while read -r h; do
		echo "$(cat "$S/revision") $(stat -c %s "$S/record") $(cat "$S/record" | wc -c) $(ls "$S/holders" | tr '\n' ,) $(sed -n 's/^name=//p' "$S/holders/$h" 2>/dev/null)"; done`, stack)

	revision := 1
	present := false
	for round := range rounds {
		op := "claim"
		if present {
			op = "release"
		}
		if got := writer.ask(op + " w"); got != "ok" {
			t.Fatalf("round %d: %s: %s", round, op, got)
		}
		present = !present
		revision++
		holders := "keeper,"
		name := ""
		if present {
			holders, name = "keeper,w,", "w"
		}
		got := strings.Fields(reader.ask("w"))
		// revision, st_size of record, bytes read from record, holders listed, holder file.
		if len(got) < 4 || got[0] != strconv.Itoa(revision) || got[1] != got[2] || got[3] != holders ||
			strings.Join(got[4:], "") != name {
			t.Fatalf("round %d after %s: read %q; want revision %d, st_size = bytes read, holders %q, holder file %q",
				round, op, got, revision, holders, name)
		}
	}
	t.Logf("%d rounds, no stale read", rounds)
}

// loop is a bash process answering one line per line it is given.
type loop struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Reader
}

func startLoop(t *testing.T, script, stack string) *loop {
	t.Helper()
	cmd := exec.Command("bash", "-c", script)
	cmd.Env = append(os.Environ(), "S="+stack)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	return &loop{t: t, in: in, out: bufio.NewReader(out)}
}

func (l *loop) ask(line string) string {
	l.t.Helper()
	if _, err := fmt.Fprintln(l.in, line); err != nil {
		l.t.Fatal(err)
	}
	answer, err := l.out.ReadString('\n')
	if err != nil {
		l.t.Fatalf("no answer to %q: %v", line, err)
	}
	return strings.TrimSpace(answer)
}
