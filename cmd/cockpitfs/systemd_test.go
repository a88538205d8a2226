package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// The service definitions shipped in examples/systemd pass `systemd-analyze verify` (the user unit
// with --user), with no warning at all, and start the daemon as docs/machines.md says.
// systemd-analyze checks that ExecStart's program exists, so the copy verified names this test's
// executable where the unit names the installed cockpitfs.
func TestSystemdUnitsVerify(t *testing.T) {
	testtool.Need(t, "systemd-analyze")
	analyze, _ := exec.LookPath("systemd-analyze")
	for _, tc := range []struct{ unit, program, want string }{
		{"user", "%h/.local/bin/cockpitfs", "mount %h/cockpit"},
		{"system", "/usr/local/bin/cockpitfs", "mount --allow-other --data /var/lib/cockpitfs /cockpit"},
	} {
		t.Run(tc.unit, func(t *testing.T) {
			text, err := os.ReadFile(filepath.Join("..", "..", "examples", "systemd", tc.unit, "cockpitfs.service"))
			if err != nil {
				t.Fatal(err)
			}
			start := "ExecStart=" + tc.program + " " + tc.want + "\n"
			if !strings.Contains(string(text), start) {
				t.Fatalf("the %s unit does not run %q", tc.unit, start)
			}
			dir := t.TempDir()
			unit := filepath.Join(dir, "cockpitfs.service")
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(unit, []byte(strings.ReplaceAll(string(text), tc.program, self)), 0o644); err != nil {
				t.Fatal(err)
			}
			verify := []string{"verify", unit}
			if tc.unit == "user" {
				verify = []string{"--user", "verify", unit}
			}
			cmd := exec.Command(analyze, verify...)
			// A user manager needs its runtime directory, and the sockets of the machine's other
			// user units (gpg-agent's, which chromium's dependencies install) are named in it: a
			// path under a long TMPDIR passes a socket name's 108 bytes, which systemd reports.
			runtime, err := os.MkdirTemp("/tmp", "rt")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(runtime)
			cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+runtime, "SYSTEMD_LOG_COLOR=0")
			out, err := cmd.CombinedOutput()
			if err != nil || len(strings.TrimSpace(string(out))) > 0 {
				t.Fatalf("systemd-analyze %s: %v\n%s", strings.Join(verify, " "), err, out)
			}
		})
	}
}
