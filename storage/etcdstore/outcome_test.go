package etcdstore_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
)

// A commit whose answer is lost with its connection is settled, not reported as of unknown
// outcome: sent again when it never reached etcd, found in etcd's history when it applied (even
// once another writer has overwritten it), and fn run again when another writer's change to a key
// it read as present got in first. The key's Version counts its changes: the commit applied at
// most once. Only a change that could be undone (a key created in a range fn scanned) leaves the
// outcome unknown: the lost request could still be on its way.
func TestLostCommitIsSettled(t *testing.T) {
	c := etcdtest.Start(t, 3)
	for _, tc := range []struct {
		name    string
		replies bool   // the member's replies are lost (the commit applies), else the requests
		rival   string // a key another writer changes before the connection breaks
		unknown bool
		runs    int
		k       string
		changes int64 // of k, by the Update and the rival
	}{
		{"request-lost", false, "", false, 1, "mine-1", 1},
		{"request-lost-rival-on-k", false, "k", false, 2, "mine-2", 2},
		{"request-lost-rival-on-j", false, "j", false, 2, "mine-2", 1},
		{"request-lost-rival-in-range", false, "l/new", true, 1, "start", 0},
		{"reply-lost", true, "", false, 1, "mine-1", 1},
		{"reply-lost-rival-on-k", true, "k", false, 1, "theirs", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// mine reaches etcd through member 0 only, where the front loses its commit; theirs
			// through the others.
			mine, theirs := openVia(t, tc.name, c.Endpoints()[:1]), openVia(t, tc.name, c.Endpoints()[1:])
			for _, k := range []string{"k", "j", "l/a"} {
				set(t, theirs, k, "start")
			}
			// mine's cache holds theirs' writes before its Update runs fn on it, so that its first
			// run commits (WRITES THAT NEED NO READ FIRST) rather than conflicts.
			if got := get(t, mine, "l/a"); got != "start" {
				t.Fatalf("l/a read through mine: %q", got)
			}
			runs := 0
			done := make(chan error, 1)
			go func() {
				done <- mine.Update(context.Background(), func(tx storage.Txn) error {
					runs++
					for _, k := range []string{"k", "j"} {
						if _, err := tx.Get(k); err != nil {
							return err
						}
					}
					if err := tx.Scan("l/", func(string, []byte) error { return nil }); err != nil {
						return err
					}
					if runs == 1 && tc.replies {
						c.DropReplies(0)
					} else if runs == 1 {
						c.DropRequests(0)
					}
					return tx.Set("k", []byte("mine-"+string(rune('0'+runs))))
				})
			}()
			if tc.replies {
				waitFor(t, "the commit to apply", func() bool { return get(t, theirs, "k") == "mine-1" })
			} else {
				waitFor(t, "the commit to be sent", func() bool { return bytes.Contains(c.Dropped(0), []byte("mine-1")) })
			}
			if tc.rival != "" {
				set(t, theirs, tc.rival, "theirs")
			}
			c.Cut(0)
			switch err := <-done; {
			case tc.unknown && !(errors.Is(err, storage.ErrLocked) && strings.Contains(err.Error(), "may or may not")):
				t.Fatalf("Update: %v; want its outcome unknown", err)
			case !tc.unknown && err != nil:
				t.Fatalf("Update: %v", err)
			}
			resp, err := theirs.Client().Get(context.Background(), tc.name+"/k")
			if err != nil {
				t.Fatal(err)
			}
			kv := resp.Kvs[0]
			if string(kv.Value) != tc.k || kv.Version != 1+tc.changes || runs != tc.runs {
				t.Errorf("k = %s after %d changes, fn ran %d times; want %s after %d, %d runs",
					kv.Value, kv.Version-1, runs, tc.k, tc.changes, tc.runs)
			}
		})
	}
}

// openVia opens prefix through the given members' addresses only.
func openVia(t *testing.T, prefix string, endpoints []string) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.Open(etcdconf.Config{Endpoints: endpoints, Prefix: prefix, Budget: etcdtest.Budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// waitFor polls cond until it holds; the bound only keeps a broken test from hanging.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30s for %s", what)
		}
	}
}
