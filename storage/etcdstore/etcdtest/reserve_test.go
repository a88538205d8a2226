package etcdtest

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// A port one test process reserved is not handed out by another, whatever TMPDIR each has: the
// reservations were files under TMPDIR, and two runs with their own each gave out ports the
// other's members held.
func TestReservedPortIsNotAnotherProcesss(t *testing.T) {
	if port := os.Getenv("ETCDTEST_RESERVE"); port != "" {
		n, _ := strconv.Atoi(port)
		if reserve(n) {
			os.Stdout.WriteString("reserved\n")
		} else {
			os.Stdout.WriteString("taken\n")
		}
		return
	}
	port := 0
	for p := 64000; p < 64999 && port == 0; p++ {
		if reserve(p) {
			port = p
		}
	}
	if port == 0 {
		t.Fatal("no port to reserve")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestReservedPortIsNotAnotherProcesss$")
	cmd.Env = append(os.Environ(), "ETCDTEST_RESERVE="+strconv.Itoa(port), "TMPDIR="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "taken") {
		t.Fatalf("another process with a TMPDIR of its own reserved port %d too: %s", port, out)
	}
}
