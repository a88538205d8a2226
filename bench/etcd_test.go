package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
)

// BenchmarkEtcdClaim: one claim through an engine over etcd (a three-member cluster on loopback in
// this process) beside the bare compare-and-swap it is built on, on the same cluster: a
// linearizable Get of the stack's record and a Txn that puts it back if its ModRevision is
// unchanged; and beside the same claim through an engine over badger on the data disk. Issue 16's
// target: claim ≤ 1.5× bare. The release after each claim is not counted. roundtrips/claim is how
// many requests the etcd claim sent (the linearizable read that proves the cache current, and the
// commit). Also side by side: a read of the record through the engine and a bare linearizable Get.
var etcdClaimRuns int

func BenchmarkEtcdClaim(b *testing.B) {
	cluster := etcdtest.Start(b, 3)
	store := cluster.Open(b, "bench")
	eng, err := engine.NewShared(store)
	if err != nil {
		b.Fatal(err)
	}
	f := &engineFixture{eng: eng}
	f.cockpit(b, "app", 20000, 10, 20)
	f.heldStack(b, "app", "s")
	etcdClaimRuns++ // each run of the function gets its own data directory
	badger := newEngine(b, fmt.Sprintf("etcd-claim-badger-%d", etcdClaimRuns))
	badger.cockpit(b, "app", 20000, 10, 20)
	badger.heldStack(b, "app", "s")
	cli, key := store.Client(), "bench/s/app/s"
	var claimTrips uint64
	claim := func(eng *engine.Engine) op {
		return op{
			run:  func() error { return eng.Claim(ctx, caller("create"), "app", "s", "c", untracked("c")) },
			undo: func() error { return eng.Release(ctx, caller("unlink"), "app", "s", "c") },
		}
	}
	etcdClaim := claim(eng)
	paired(b, map[string]op{
		"claim": {
			run: func() error {
				before := store.RoundTrips()
				defer func() { claimTrips += store.RoundTrips() - before }()
				return etcdClaim.run()
			},
			undo: etcdClaim.undo,
		},
		"badger-claim": claim(badger.eng),
		// A read of the stack's record, as every open and stat does: one linearizable round trip
		// proves the daemon's copy current, beside the bare linearizable Get of the same key.
		"read": {run: func() error { _, err := eng.Stack("app", "s"); return err }},
		"bare-read": {run: func() error {
			_, err := cli.Get(ctx, key)
			return err
		}},
		"bare": bareCAS(cli, key),
	})
	b.ReportMetric(float64(claimTrips)/float64(b.N), "roundtrips/claim")
}

// BenchmarkEtcdMountClaim: the claim as a user makes it, `touch` through a daemon's mount over
// etcd (a three-member cluster on loopback in this process): open O_CREAT and close of a holder of
// a stack another holder keeps, beside the bare compare-and-swap of BenchmarkEtcdClaim on the
// same cluster. Issue 44's target: ≤ 1.5× bare. The release after each claim is not counted.
func BenchmarkEtcdMountClaim(b *testing.B) {
	cluster := etcdtest.Start(b, 3)
	d := newDaemon(fmt.Sprintf("etcd-mount-%d", time.Now().UnixNano()))
	d.hostNet = true
	d.bin = teamDaemonBinary(b)
	d.args = []string{"--store", cluster.URL("bench-mount")}
	defer os.RemoveAll(filepath.Dir(d.Dir))
	defer d.stop()
	d.startStack(b)
	cli := cluster.Open(b, "bench-mount").Client()
	key := "bench-mount/s/app/s"
	paired(b, map[string]op{
		"mount-claim": create(d.path("app", "stacks", "s", "holders", "c")),
		"bare":        bareCAS(cli, key),
	})
}

// bareCAS is the compare-and-swap a claim over etcd is built on: a linearizable Get of key and a
// Txn that puts it back if its ModRevision is unchanged.
func bareCAS(cli *clientv3.Client, key string) op {
	return op{run: func() error {
		got, err := cli.Get(ctx, key)
		if err != nil {
			return err
		}
		kv := got.Kvs[0]
		_, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(clientv3.OpPut(key, string(kv.Value))).Commit()
		return err
	}}
}
