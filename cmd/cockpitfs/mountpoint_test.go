package main

import (
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
		{storeChoice{etcd: &etcdstore.Config{}, url: "etcd://h1:2379,h2:2379/team"}, false,
			"cockpitfs mount --store etcd://h1:2379,h2:2379/team --cacert /etc/ca.pem --user me '/home/o'\\''brien/cockpit'"},
	} {
		if got := restartCommand("/home/o'brien/cockpit", tc.st, sf, tc.allowOther); got != tc.want {
			t.Errorf("restartCommand = %s\nwant            %s", got, tc.want)
		}
	}
}
