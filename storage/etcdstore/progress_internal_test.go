package etcdstore

import "testing"

// Progress notifications are taken only from the etcd versions that send them in order with the
// watch's events; the embedded etcd of the tests is one of them.
func TestProgressInOrder(t *testing.T) {
	for version, want := range map[string]bool{
		"3.4.23": false, "3.4.30": false, "3.4.31": true,
		"3.5.12": false, "3.5.13": true,
		"3.6.0": true, "3.7.3": true, "4.0.0": true,
		"3.3.27": false, "": false, "not a version": false,
	} {
		if got := progressInOrder(version); got != want {
			t.Errorf("progressInOrder(%q) = %v, want %v", version, got, want)
		}
	}
}
