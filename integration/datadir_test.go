package integration

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Issue 34: a root daemon trusts no data directory another user controls (sshd's StrictModes)
// and never writes through a link planted there; the files it makes there are 0600.

// dataDirMount runs `cockpitfs mount [--daemon] --data data mnt` as root and returns its exit
// code and output; a mount it made is unmounted when the test ends.
func dataDirMount(t *testing.T, daemon bool, data, mnt string) (int, string) {
	t.Helper()
	args := []string{"mount", "--data", data, mnt}
	if daemon {
		args = append([]string{"mount", "--daemon"}, args[1:]...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	t.Cleanup(func() {
		if mounted(mnt) {
			exec.Command(binary, "unmount", mnt).Run()
		}
	})
	out, err := cmd.CombinedOutput()
	code := 0
	if exit, ok := err.(*exec.ExitError); ok {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, string(out)
}

// listing is every name below dir with its mode and owner, links as links.
func listing(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		b.WriteString(fi.Mode().String() + " " + path + "\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// Each data directory another user controls is refused, by the daemon's parent (--daemon) and by
// a foreground daemon alike, before anything is written: the root-only file a planted
// cockpitfs.log link names is unchanged, the directory holds what it held, nothing is mounted.
func TestDataDirOfAnotherUserIsRefused(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	secret := filepath.Join(base, "secret")
	if err := os.WriteFile(secret, []byte("root only\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := func(name string, mode os.FileMode, uid int) string {
		d := filepath.Join(base, name)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
		return d
	}
	link := func(d string, uid int) {
		l := filepath.Join(d, "cockpitfs.log")
		if err := os.Symlink(secret, l); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(l, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	nobodys := dir("nobodys", 0o755, 65534)
	link(nobodys, 65534)
	worldWritable := dir("world-writable", 0o777, 0)
	rootsLink := dir("roots-link", 0o700, 0)
	link(rootsLink, 0)
	dir("nobodys-parent", 0o755, 65534)
	underNobody := dir("nobodys-parent/data", 0o700, 0)
	nobodysFile := dir("nobodys-file", 0o700, 0)
	if err := os.WriteFile(filepath.Join(nobodysFile, "MANIFEST"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(nobodysFile, "MANIFEST"), 65534, 65534); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		data, why string
	}{
		{nobodys, nobodys + " belongs to uid 65534, not to root or uid 0"},
		{worldWritable, worldWritable + " is writable by its group or others (mode 0777)"},
		{rootsLink, filepath.Join(rootsLink, "cockpitfs.log") + " is a symbolic link in the data directory"},
		{underNobody, filepath.Dir(underNobody) + " belongs to uid 65534"},
		{nobodysFile, filepath.Join(nobodysFile, "MANIFEST") + " belongs to uid 65534"},
	} {
		for _, daemon := range []bool{true, false} {
			before := listing(t, tc.data)
			mnt := filepath.Join(base, "mnt")
			code, out := dataDirMount(t, daemon, tc.data, mnt)
			if code != 1 || !strings.Contains(out, "refusing the data directory: "+tc.why) {
				t.Fatalf("mount (daemon %v) --data %s: exit %d, want 1 saying %q:\n%s", daemon, tc.data, code, tc.why, out)
			}
			if got, err := os.ReadFile(secret); err != nil || string(got) != "root only\n" {
				t.Fatalf("the root-only file after mount --data %s: %q %v", tc.data, got, err)
			}
			if after := listing(t, tc.data); after != before {
				t.Fatalf("mount (daemon %v) --data %s changed it:\nbefore\n%s\nafter\n%s", daemon, tc.data, before, after)
			}
			if mounted(mnt) {
				t.Fatalf("mount --data %s mounted", tc.data)
			}
		}
	}
}

// Every file a daemon makes in its data directory is its alone: 0600 files in 0700 directories,
// badger's tables and value log, the write-ahead log, backups and the log alike.
func TestDataDirFilesAreTheDaemons(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	data, mnt := filepath.Join(base, "data"), filepath.Join(base, "mnt")
	if code, out := dataDirMount(t, true, data, mnt); code != 0 {
		t.Fatalf("mount --daemon: exit %d\n%s", code, out)
	}
	if err := os.Mkdir(filepath.Join(mnt, "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(binary, "unmount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("unmount: %v\n%s", err, out)
	}
	files := 0
	err := filepath.WalkDir(data, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if want := os.FileMode(0o600); !d.IsDir() && fi.Mode() != want || d.IsDir() && fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v", path, fi.Mode())
		}
		if !d.IsDir() {
			files++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 5 {
		t.Fatalf("%d files in the data directory:\n%s", files, listing(t, data))
	}
}

// restore, run by root, refuses a store another user controls as mount does: it writes the whole
// store there, and would write through a link that user planted. verify and backup, which only
// read it, check it as they would root's.
func TestDataDirOfAnotherUserRefusedOffline(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	m.ok("mkdir $M/app")
	m.Stop()
	if err := filepath.WalkDir(m.Data, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, 65534, 65534)
	}); err != nil {
		t.Fatal(err)
	}
	before := listing(t, m.Data)
	r := lifecycleRun(t, "restore", "--data", m.Data)
	if r.Code != 1 || !strings.Contains(r.Stderr, "refusing the data directory: "+m.Data) {
		t.Errorf("restore as root of a store uid 65534 owns: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if after := listing(t, m.Data); after != before {
		t.Errorf("the refused restore changed the store:\n%s\nnow:\n%s", before, after)
	}
	if r := lifecycleRun(t, "verify", "--data", m.Data); r.Code != 0 {
		t.Errorf("verify as root of a store uid 65534 owns: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}
