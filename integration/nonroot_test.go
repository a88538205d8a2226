package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/internal/testtool"
)

// nonrootDir makes a directory uid 65534 owns, below a world-traversable temp dir.
func nonrootDir(t *testing.T) string {
	t.Helper()
	base, err := os.MkdirTemp("/tmp", "cockpitfs-nonroot")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "home")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	return dir
}

// nonrootPath is a PATH with fusermount3, which a user's mount needs; without it the test fails in
// CI and skips elsewhere.
func nonrootPath(t *testing.T) string {
	t.Helper()
	testtool.Need(t, "fusermount3")
	fusermount, _ := exec.LookPath("fusermount3")
	return filepath.Dir(fusermount) + ":/usr/bin:/bin"
}

// nonrootCommand runs the binary as uid/gid 65534 with the given PATH.
func nonrootCommand(path string, args ...string) *exec.Cmd {
	cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", binary}, args...)...)
	cmd.Env = []string{"PATH=" + path, "HOME=/nonexistent"}
	return cmd
}

// As another user than root a mount goes through fusermount3 (SPEC §1); without it, the daemon
// says what to install.
func TestNonRootNeedsFusermount(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("runs as root to become uid 65534")
	}
	home := nonrootDir(t)
	out, err := nonrootCommand("/nonexistent", "mount", "--data", filepath.Join(home, "data"), filepath.Join(home, "mnt")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "fusermount3 (Debian: apt-get install fuse3)") {
		t.Fatalf("mount without fusermount3: %v\n%s", err, out)
	}
}

// With fusermount3 a user mounts and serves its own tree, which it alone can see. /dev/fuse must
// be open to users, as Debian's udev rule makes it (0666); .ci/run sees to it.
func TestNonRootMountServes(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("runs as root to become uid 65534")
	}
	path := nonrootPath(t)
	home := nonrootDir(t)
	mnt, data := filepath.Join(home, "mnt"), filepath.Join(home, "data")
	cmd := nonrootCommand(path, "mount", "--data", data, mnt)
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := ownNetns(t).Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		detach(mnt)
	})
	for !mounted(mnt) {
		select {
		case <-exited:
			t.Fatalf("daemon exited: %v\n%s", waitErr, log)
		case <-time.After(10 * time.Millisecond):
		}
	}
	asUser := func(script string) result {
		return shIn(t, "/", `exec setpriv --reuid=65534 --regid=65534 --clear-groups bash -c "$S"`, "M="+mnt, "S="+script)
	}
	r := asUser(`mkdir $M/app && printf '[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 38880\n' | cat > $M/app/config &&
mkdir $M/app/stacks/s && cd /tmp && touch $M/app/stacks/s/holders/me && cat $M/app/stacks/s/ports/HTTP && stat -c %u:%g $M/app/stacks/s/holders/me $M/app/config $M/app $M/README`)
	// Every file carries the user's group, not root's.
	if r.Code != 0 || r.Stdout != "38880\n65534:65534\n65534:65534\n65534:65534\n65534:65534\n" {
		t.Fatalf("as the mounting user: exit %d\n%s%s\n%s", r.Code, r.Stdout, r.Stderr, log)
	}
	// Not even root sees into another user's mount without allow_other.
	if _, err := os.Stat(filepath.Join(mnt, "README")); err == nil {
		t.Fatal("root could see into uid 65534's mount")
	}
}
