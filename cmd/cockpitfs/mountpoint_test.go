package main

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
)

// The NOT-MOUNTED note's command names the store and the access the daemon had, quoted for the
// shell, and never an etcd password.
func TestRestartCommand(t *testing.T) {
	fset := newFlags("mount")
	sf := addStoreFlags(fset)
	if err := fset.Parse([]string{"--cacert", "/etc/ca.pem", "--user", "me:secret"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		st         storeChoice
		allowOther bool
		want       string
	}{
		{storeChoice{data: "/var/lib/my store"}, true, `cockpitfs mount --data '/var/lib/my store' --allow-other '/home/o'\''brien/cockpit'`},
		{storeChoice{data: defaultDataDir(), etcd: &etcdconf.Config{}, url: "etcd://h1:2379,h2:2379/team"}, false,
			"cockpitfs mount --store etcd://h1:2379,h2:2379/team --cacert /etc/ca.pem --user me '/home/o'\\''brien/cockpit'"},
		{storeChoice{data: "/srv/cockpitfs", etcd: &etcdconf.Config{}, url: "etcd://h1:2379/team"}, false,
			"cockpitfs mount --store etcd://h1:2379/team --cacert /etc/ca.pem --user me --data /srv/cockpitfs '/home/o'\\''brien/cockpit'"},
	} {
		if got := restartCommand("/home/o'brien/cockpit", tc.st, sf, tc.allowOther); got != tc.want {
			t.Errorf("restartCommand = %s\nwant            %s", got, tc.want)
		}
	}
}

// What prepareMountpoint made or changed, its undo takes back: the directories it made, the note,
// the mode of a directory that was there.
func TestPrepareMountpointUndo(t *testing.T) {
	base := t.TempDir()
	dir, undo, err := prepareMountpoint(base+"/a/b/mnt", false, "cockpitfs mount x")
	if err != nil {
		t.Fatal(err)
	}
	dir.Close()
	undo()
	if entries, _ := os.ReadDir(base); len(entries) != 0 {
		t.Errorf("after undo, %s holds %v", base, entries)
	}

	if err := os.Mkdir(base+"/there", 0o550); err != nil {
		t.Fatal(err)
	}
	dir, undo, err = prepareMountpoint(base+"/there", false, "cockpitfs mount x")
	if err != nil {
		t.Fatal(err)
	}
	dir.Close()
	if _, err := os.Stat(base + "/there/NOT-MOUNTED"); err != nil {
		t.Fatal(err)
	}
	undo()
	st, err := os.Stat(base + "/there")
	if entries, _ := os.ReadDir(base + "/there"); err != nil || st.Mode().Perm() != 0o550 || len(entries) != 0 {
		t.Errorf("after undo: %v, mode %v, holding %v", err, st.Mode(), entries)
	}
}

// The mountpoint may be another user's, who can put anything named NOT-MOUNTED in it while no
// daemon serves: a FIFO does not hold the mount up, and a link, put there even as the note is
// replaced, never leads the daemon's write or chmod to the file it names.
func TestNoteFollowsNothing(t *testing.T) {
	base := t.TempDir()
	mnt, target := base+"/mnt", base+"/target"
	if err := os.WriteFile(target, []byte("someone's file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	note := mnt + "/NOT-MOUNTED"
	if err := unix.Mkfifo(note, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		dir, _, err := prepareMountpoint(mnt, false, "cockpitfs mount x")
		if err == nil {
			dir.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a FIFO named NOT-MOUNTED holds the mount up")
	}
	if st, err := os.Lstat(note); err != nil || !st.Mode().IsRegular() {
		t.Fatalf("the note over a FIFO: %v %v", st, err)
	}

	// Another process puts the link back as fast as it can while the note is written anew.
	var stop atomic.Bool
	racer := make(chan struct{})
	go func() {
		defer close(racer)
		for !stop.Load() {
			os.Symlink(target, note)
		}
	}()
	t.Cleanup(func() { stop.Store(true); <-racer }) // a failure below ends the racer too
	for i := range 300 {
		os.Remove(note) // the note is written again: the racer's link may be there first
		dir, _, err := prepareMountpoint(mnt, true, fmt.Sprintf("cockpitfs mount %d", i))
		if err != nil {
			t.Fatal(err)
		}
		dir.Close()
	}
	stop.Store(true)
	<-racer
	if data, err := os.ReadFile(target); err != nil || string(data) != "someone's file\n" {
		t.Fatalf("the linked file now holds %q (%v)", data, err)
	}
	if st, err := os.Stat(target); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the linked file's mode: %v %v", st, err)
	}
}
