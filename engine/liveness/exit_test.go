package liveness

import (
	"os/exec"
	"testing"
)

// Exited closes its channel when the process exits, and not before; a process gone already
// cannot be watched.
func TestExited(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited, err := Exited(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		t.Fatal("closed while the process runs")
	default:
	}
	cmd.Process.Kill()
	cmd.Wait()
	<-exited
	if _, err := Exited(cmd.Process.Pid); err == nil {
		t.Fatal("watched a process that is gone")
	}
}
