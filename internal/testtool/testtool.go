// Package testtool lets a test name the installed programs it drives. A missing one skips the
// test with a line scripts/test gathers into its summary, naming scripts/setup, the one command
// that installs every program the tests drive; under CI=true, where scripts/setup ran, a missing
// program fails the test instead: a skipped test there would prove nothing.
package testtool

import (
	"os"
	"os/exec"
	"testing"
)

// Setup is the command that installs what the tests drive (.ci/run runs it too).
const Setup = "sudo ./scripts/setup"

// Need skips or fails t (see the package comment) unless every program is on the PATH.
func Need(t testing.TB, programs ...string) {
	t.Helper()
	for _, p := range programs {
		if _, err := exec.LookPath(p); err != nil {
			Missing(t, p)
		}
	}
}

// Missing skips or fails t for what, a program or package that scripts/setup installs and that
// the test found missing.
func Missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not installed and CI=true: %s installs it", what, Setup)
	}
	t.Skipf("needs %s, which is not installed (%s installs it)", what, Setup)
}
