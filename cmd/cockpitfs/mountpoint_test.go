package main

import (
	"os"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage/etcdstore"
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
		{storeChoice{data: defaultDataDir(), etcd: &etcdstore.Config{}, url: "etcd://h1:2379,h2:2379/team"}, false,
			"cockpitfs mount --store etcd://h1:2379,h2:2379/team --cacert /etc/ca.pem --user me '/home/o'\\''brien/cockpit'"},
		{storeChoice{data: "/srv/cockpitfs", etcd: &etcdstore.Config{}, url: "etcd://h1:2379/team"}, false,
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
