package etcdstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
)

// etcd before 3.4.31 and 3.5.13 (Debian's etcd-server is 3.4.23) answers a progress request at
// once with its current revision, even on a watch still catching up on events it has not sent
// (etcd issue 15220): a cache that took that answer as complete would serve a read from before
// those events. A store's watch starts behind when commits land between its first read of the
// prefix and the watch's start, as another writer's do here; the store's first read must see
// the last commit acknowledged before it began, for every store opened.
func TestWatchCatchingUpOnOldEtcdIsNotTrusted(t *testing.T) {
	p := etcdtest.StartProcess(t)
	writer, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Endpoint()}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	var acknowledged atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := int64(1); ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := writer.Put(context.Background(), "p/k", strconv.FormatInt(n, 10)); err != nil {
				return
			}
			acknowledged.Store(n)
		}
	}()
	defer func() { close(stop); <-done }()
	for round := range 20 {
		s, err := etcdstore.Open(etcdconf.Config{Endpoints: []string{p.Endpoint()}, Prefix: "p", Budget: etcdtest.Budget})
		if err != nil {
			t.Fatal(err)
		}
		before := acknowledged.Load()
		got, err := strconv.ParseInt(get(t, s, "k"), 10, 64)
		s.Close()
		if err != nil || got < before {
			t.Fatalf("round %d: the store read k=%d (%v), after k=%d was acknowledged", round, got, err, before)
		}
	}
}
