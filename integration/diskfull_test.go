package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// A full disk refuses every write with ENOSPC and changes nothing; the daemon keeps serving
// reads, loses nothing acknowledged, never dies of SIGBUS (badger writes its log through a
// memory map), and writes succeed again once space returns. The store lives on a small tmpfs
// that another process fills to the last block.
func TestDiskFullRefusesWritesAndRecovers(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	base := t.TempDir()
	disk := filepath.Join(base, "disk")
	if err := os.Mkdir(disk, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", disk, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(disk, unix.MNT_DETACH) }) // after the daemon's own cleanup
	m := &mount{t: t, ns: ownNetns(t), Dir: filepath.Join(base, "mnt"), Data: filepath.Join(disk, "data")}
	m.start()
	t.Cleanup(m.stop)
	m.setupApp(5, map[string]int{"HTTP": 23100}, "one")
	m.ok("touch $M/app/stacks/one/holders/me")

	filler := filepath.Join(disk, "filler")
	exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=1M").Run() // ends at ENOSPC
	var st unix.Statfs_t
	if err := unix.Statfs(disk, &st); err != nil || st.Bavail != 0 {
		t.Fatalf("the disk is not full: %d blocks free (%v)", st.Bavail, err)
	}

	record := m.read("app/stacks/one/record")
	events := m.read("app/events")
	stackEvents := m.read("app/stacks/one/events")
	m.refused("mkdir $M/app/stacks/two", syscall.ENOSPC)
	m.refused("touch $M/app/stacks/one/holders/other", syscall.ENOSPC)
	m.refused("/bin/echo 'pid=none' > $M/app/stacks/one/holders/me", syscall.ENOSPC)
	m.refused("cat > $M/app/config <<'EOF'\n[ports]\nstep = 10\ncount = 6\n[ports.bases]\nHTTP = 23100\nEOF", syscall.ENOSPC)
	// Nothing changed, and reads go on; the events files cannot take a line either.
	if got := strings.Fields(m.ok("ls $M/app/stacks")); len(got) != 1 || got[0] != "one" {
		t.Errorf("stacks after refused writes: %v", got)
	}
	if got := m.read("app/stacks/one/record"); got != record {
		t.Errorf("the record changed:\n%s\n%s", record, got)
	}
	if m.read("app/events") != events || m.read("app/stacks/one/events") != stackEvents {
		t.Error("an events file changed on a full disk")
	}
	if !strings.Contains(m.log.String(), "no space left for the store") {
		t.Errorf("the daemon log does not say the disk is full:\n%s", m.log)
	}

	// Stopping on a full disk leaves the synced log to replay instead of flushing it into a table
	// (badger writes tables through a memory map: SIGBUS); starting on one is refused.
	m.Stop()
	if log := m.log.String(); !strings.Contains(log, "without flushing") || strings.Contains(log, "SIGBUS") {
		t.Errorf("stopping on a full disk:\n%s", log)
	}
	r := cockpitfs(t, "mount", "--data", m.Data, m.Dir)
	if r.code == 0 || !strings.Contains(r.out, "no space left for the store") || mounted(m.Dir) {
		t.Fatalf("mount on a full disk: exit %d\n%s", r.code, r.out)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	m.start()
	m.ok("mkdir $M/app/stacks/two && touch $M/app/stacks/two/holders/me")
	m.refused("mkdir $M/app/stacks/two", syscall.EEXIST)
	// Everything acknowledged survives a restart (and m.stop verifies the store).
	m.Stop()
	m.start()
	if got := strings.Join(strings.Fields(m.ok("ls $M/app/stacks")), " "); got != "one two" {
		t.Errorf("stacks after a restart: %s", got)
	}
	if !strings.Contains(m.read("app/stacks/two/lease"), "HTTP") {
		t.Errorf("two's lease is gone:\n%s", m.read("app/stacks/two/lease"))
	}
}
