package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
)

// On Debian's etcd-server (3.4.23), a daemon that mounts while another daemon commits sees, at
// its first read, every stack the other acknowledged before that read began: its watch starts
// behind those commits, and such an etcd answers a progress request ahead of the events the
// watch is still owed (TestWatchCatchingUpOnOldEtcdIsNotTrusted). Twenty mounts.
func TestTeamNewDaemonOnDebianEtcdSeesAcknowledgedStacks(t *testing.T) {
	t.Parallel()
	p := etcdtest.StartProcess(t)
	store := "etcd://" + p.Endpoint() + "/old"
	a := newEtcdMount(t, store)
	a.setupApp(5, map[string]int{"HTTP": 18680})
	var acknowledged atomic.Int64
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for n := int64(1); ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			if os.Mkdir(filepath.Join(a.Dir, "app", "stacks", fmt.Sprint("s", n)), 0o755) == nil {
				acknowledged.Store(n)
			}
		}
	}()
	defer func() { close(stop); <-stopped }()
	c := newEtcdMount(t, store)
	for round := range 20 {
		c.Stop()
		c.start(c.args...)
		n := acknowledged.Load()
		if n == 0 {
			continue
		}
		if r := c.sh(fmt.Sprintf("stat $M/app/stacks/s%d", n)); r.Code != 0 {
			t.Fatalf("round %d: the new daemon's first read of s%d, acknowledged before it: %s", round, n, strings.TrimSpace(r.Stderr))
		}
	}
}
