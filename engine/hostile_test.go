package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
)

// A shared store's values are input the daemon did not write: another daemon's bug, a teammate
// with etcdctl, a restore. These tests put hostile values under a real etcd prefix, beside an
// engine serving it, with a client of their own.

// hostileEngine is an engine over prefix "team" of a one-member etcd, and a client that writes
// under the prefix behind its back.
func hostileEngine(t *testing.T) (*Engine, func(key, value string)) {
	t.Helper()
	cluster := etcdtest.Start(t, 1)
	e, err := NewShared(cluster.Open(t, "team"))
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	put := func(key, value string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := cli.Put(ctx, "team/"+key, value); err != nil {
			t.Fatal(err)
		}
	}
	return e, put
}

// TestEventsHeadOutOfRangeIsDamage: an events head whose end no appends reach (at int64's limits)
// made every offset into the file wrap, and `cat events` was served the lines again forever.
// Such a head is damage: the events file refuses (EIO), the rest of the stack's files and every
// other stack serve.
func TestEventsHeadOutOfRangeIsDamage(t *testing.T) {
	e, put := hostileEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "s", "t")
	if err := e.Claim(ctx, me("create", "h"), "app", "s", "h", untracked("h")); err != nil {
		t.Fatal(err)
	}
	for _, head := range []string{
		`{"seq":3,"end":-9223372036854775800,"windows":{"h":3}}`,
		`{"seq":3,"end":9223372036854775807,"windows":{"h":3}}`,
		`{"seq":3,"end":-1,"windows":{"h":3}}`,
		`{"seq":18446744073709551615,"end":100,"windows":{"h":3}}`,
		`{"seq":3,"end":100,"windows":{"h":18446744073709551615}}`,
	} {
		put(eventsHeadKey("app", "s"), head)
		deadline := time.Now().Add(10 * time.Second)
		var err error
		for {
			_, _, _, err = e.EventsWindow("app", "s")
			if err != nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		var malformed malformedValue
		if !errors.As(err, &malformed) {
			t.Fatalf("head %s: events read with err %v, want it refused as damage", head, err)
		}
		if err := e.Claim(ctx, me("create", "g"), "app", "s", "g", untracked("g")); err == nil {
			t.Fatalf("head %s: a claim appended a line after it", head)
		}
		if _, err := e.Stack("app", "s"); err != nil {
			t.Fatalf("head %s: the stack's record: %v", head, err)
		}
		if _, _, _, err := e.EventsWindow("app", "t"); err != nil {
			t.Fatalf("head %s: another stack's events: %v", head, err)
		}
	}
}
