package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// stallWatch stops s's cache from following etcd: the watch goroutine calls Watch's fn after
// applying a change, and this fn blocks from the first change after arm until the test ends.
// So the cache holds that first change and nothing after it.
func stallWatch(t *testing.T, s *etcdstore.Store) (arm func()) {
	armed, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) }) // before the store closes: cleanups run last first
	if err := s.Watch("", func(string) {
		select {
		case <-armed:
			<-release
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	return func() { close(armed) }
}

// A read is never served from a cache that misses a commit acknowledged before it began, however
// far behind the watch is: b's watch is stalled after a's first write, a writes twice more, and
// b's next View, Update and failed Update all see a's last write, never the one its cache holds.
func TestReadsNeverServeAStaleCache(t *testing.T) {
	c := etcdtest.Start(t, 3)
	a := c.Open(t, "stale")
	b := c.Open(t, "stale")
	arm := stallWatch(t, b)
	set(t, a, "k", "1")
	if got := get(t, b, "k"); got != "1" {
		t.Fatalf("b reads k=%s, want 1", got)
	}
	arm()
	set(t, a, "k", "2") // b's cache takes this one, then its watch stalls
	set(t, a, "k", "3")
	set(t, a, "l/x", "3")

	if got := get(t, b, "k"); got != "3" {
		t.Errorf("b's View reads k=%s after a wrote 3: served from a stale cache", got)
	}
	var listed []string
	err := b.View(func(tx storage.Txn) error {
		return tx.Scan("l/", func(k string, _ []byte) error { listed = append(listed, k); return nil })
	})
	if err != nil || len(listed) != 1 {
		t.Errorf("b's Scan of l/ = %v, %v; want a's l/x", listed, err)
	}
	// An outcome that writes nothing rests on the reads alone.
	errTwo := errors.New("k is 2")
	err = b.Update(context.Background(), func(tx storage.Txn) error {
		if v, err := tx.Get("k"); err != nil || string(v) == "2" {
			return errors.Join(err, errTwo)
		}
		return nil
	})
	if err != nil {
		t.Errorf("b's Update that refuses on k=2: %v", err)
	}
	// A commit compares what it read: copying k must copy 3.
	err = b.Update(context.Background(), func(tx storage.Txn) error {
		v, err := tx.Get("k")
		if err != nil {
			return err
		}
		return tx.Set("copy", v)
	})
	if err != nil || get(t, a, "copy") != "3" {
		t.Errorf("b copied k as %s (%v), want 3", get(t, a, "copy"), err)
	}
}

// With the cache current, a View costs one linearizable read however many keys and ranges it
// reads; an Update that commits costs its commit alone (its compares prove what it read), and one
// that writes nothing, or refuses, one read confirming what it read (a Txn of its compares). A
// quorum answered just before each (the operation before it). (A cache the watch has not yet
// brought up to date costs the reads from etcd instead: each count is the fewest of a few tries.)
func TestCurrentCacheRoundTrips(t *testing.T) {
	s := etcdtest.Start(t, 1).Open(t, "trips")
	set(t, s, "a", "1")
	set(t, s, "l/b", "1")
	trips := func(do func() error) uint64 {
		t.Helper()
		fewest := uint64(1 << 62)
		for range 5 {
			before := s.RoundTrips()
			if err := do(); err != nil {
				t.Fatal(err)
			}
			fewest = min(fewest, s.RoundTrips()-before)
		}
		return fewest
	}
	readAll := func(tx storage.Txn) error {
		for _, k := range []string{"a", "missing", "l/b"} {
			if _, err := tx.Get(k); err != nil && !errors.Is(err, storage.ErrNotFound) {
				return err
			}
		}
		return tx.Scan("l/", func(string, []byte) error { return nil })
	}
	if n := trips(func() error { return s.View(readAll) }); n != 1 {
		t.Errorf("a View of three keys and a range took %d round trips, want 1", n)
	}
	update := func() error {
		return s.Update(context.Background(), func(tx storage.Txn) error {
			if err := readAll(tx); err != nil {
				return err
			}
			return tx.Set("a", []byte("2"))
		})
	}
	if n := trips(update); n != 1 {
		t.Errorf("an Update reading three keys and a range took %d round trips, want 1", n)
	}
	refused := errors.New("refused")
	refuse := func() error {
		err := s.Update(context.Background(), func(tx storage.Txn) error {
			if err := readAll(tx); err != nil {
				return err
			}
			return refused
		})
		if err != refused {
			return fmt.Errorf("a refusing Update returned %v", err)
		}
		return nil
	}
	if n := trips(refuse); n != 1 {
		t.Errorf("a refusing Update reading three keys and a range took %d round trips, want 1", n)
	}
	if n := trips(func() error { return s.Recent(readAll) }); n != 0 {
		t.Errorf("Recent took %d round trips, want none", n)
	}
}

// A store whose watch was cut off while another wrote and etcd compacted its history past where
// the watch was reads the store as it is once it is back: its watch cannot resume, so the store
// loads the prefix again, and no read serves what the compacted history changed (a key deleted,
// one created, one changed).
func TestReadAfterCompactionPastTheWatch(t *testing.T) {
	c := etcdtest.Start(t, 3)
	mine := openVia(t, "compacted", c.Endpoints()[:1])
	theirs := openVia(t, "compacted", c.Endpoints()[1:])
	set(t, theirs, "gone", "1")
	set(t, theirs, "changed", "1")
	if got := get(t, mine, "gone"); got != "1" {
		t.Fatalf("gone before: %s", got)
	}
	c.DropReplies(0) // mine hears nothing from here on
	if err := theirs.Update(context.Background(), func(tx storage.Txn) error { return tx.Delete("gone") }); err != nil {
		t.Fatal(err)
	}
	set(t, theirs, "changed", "2")
	set(t, theirs, "new", "1")
	cli := theirs.Client()
	head, err := cli.Get(context.Background(), "compacted/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(context.Background(), head.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	c.Cut(0) // mine reconnects; its watch would resume below the compaction
	for key, want := range map[string]string{"gone": "<missing>", "changed": "2", "new": "1"} {
		if got := get(t, mine, key); got != want {
			t.Errorf("%s after the compaction: %s, want %s", key, got, want)
		}
	}
	readThenSet(t, mine, "changed", "3")
	set(t, theirs, "later", "1")
	waitFor(t, "the watch to follow again", func() bool {
		var v []byte
		err := mine.Recent(func(tx storage.Txn) (err error) { v, err = tx.Get("later"); return err })
		return err == nil && string(v) == "1"
	})
	if got := get(t, theirs, "changed"); got != "3" {
		t.Errorf("changed, written by mine after the compaction: %s", got)
	}
}

// A member replaced (removed, and a new one added on an empty data directory in its place) while
// a store reaches etcd through it alone: the store reads what was written before and after, writes,
// and its watch follows again; a new member id is no other cluster.
func TestReadsThroughAReplacedMember(t *testing.T) {
	c := etcdtest.Start(t, 3)
	mine := openVia(t, "replaced", c.Endpoints()[:1])
	theirs := openVia(t, "replaced", c.Endpoints()[1:])
	set(t, theirs, "before", "1")
	if got := get(t, mine, "before"); got != "1" {
		t.Fatalf("before the replacement: %s", got)
	}
	c.ReplaceMember(0)
	set(t, theirs, "after", "1")
	for key, want := range map[string]string{"before": "1", "after": "1"} {
		if got := get(t, mine, key); got != want {
			t.Errorf("%s after the replacement: %s, want %s", key, got, want)
		}
	}
	readThenSet(t, mine, "before", "2")
	set(t, theirs, "later", "1")
	waitFor(t, "the watch to follow again", func() bool {
		var v []byte
		err := mine.Recent(func(tx storage.Txn) (err error) { v, err = tx.Get("later"); return err })
		return err == nil && string(v) == "1"
	})
	if got := get(t, theirs, "before"); got != "2" {
		t.Errorf("before, written by mine after the replacement: %s", got)
	}
}

// TestWithheldValuesAreNotKept: every store kept in memory the value of every key under its
// prefix, keys its caller never reads too (100 values of 1.4 MiB put by hand took a daemon from 25
// to 167 MB). A store told which keys to keep holds of the others their keys alone, loaded before
// or put after, and reads them from etcd as before.
func TestWithheldValuesAreNotKept(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := c.Open(t, "withheld")
	big := strings.Repeat("x", 512<<10)
	set(t, a, "junk/loaded", big)
	b := c.Open(t, "withheld")
	b.Withhold(func(key string) bool { return !strings.HasPrefix(key, "junk/") })
	for i := range 20 {
		set(t, a, fmt.Sprintf("junk/%02d", i), big)
	}
	set(t, a, "k", "v")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var got []byte
		_ = b.Recent(func(tx storage.Txn) (err error) { got, err = tx.Get("k"); return err })
		if string(got) == "v" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b's watch never delivered k")
		}
	}
	if held := b.HeldValueBytes(); held > 1<<10 {
		t.Errorf("b holds %d bytes of values, want only k's", held)
	}
	if held := a.HeldValueBytes(); held < 21*len(big) {
		t.Errorf("a, which withholds nothing, holds %d bytes of values", held)
	}
	if got := get(t, b, "junk/03"); got != big {
		t.Errorf("b reads junk/03 as %d bytes", len(got))
	}
	var listed int
	err := b.Recent(func(tx storage.Txn) error {
		return tx.Scan("junk/", func(_ string, v []byte) error {
			if string(v) == big {
				listed++
			}
			return nil
		})
	})
	if err != nil || listed != 21 {
		t.Errorf("b's Scan of junk/: %d whole values, %v", listed, err)
	}
	// A transaction that read a withheld value commits with its compares as any other.
	if err := b.Update(context.Background(), func(tx storage.Txn) error {
		if _, err := tx.Get("junk/04"); err != nil {
			return err
		}
		return tx.Set("k", []byte("w"))
	}); err != nil || get(t, a, "k") != "w" {
		t.Errorf("update after reading junk/04: %v, k=%s", err, get(t, a, "k"))
	}
}

// TestWithheldReadOfAnIdleCache: Recent reads the cache at its revision, which stays where the
// prefix's last commit left it while only keys outside the prefix are written; a value it
// withholds is read from etcd at that revision. Once etcd compacted past it, that read failed
// ("snapshot revision compacted"), and so did every claim of a daemon whose first claim read the
// stacks beside a key outside its layout, until the prefix changed again.
func TestWithheldReadOfAnIdleCache(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := c.Open(t, "idle")
	b := c.Open(t, "idle")
	b.Withhold(func(key string) bool { return !strings.HasPrefix(key, "junk/") })
	set(t, a, "junk/x", "v")
	set(t, a, "k", "v")
	waitFor(t, "b's watch to deliver k", func() bool {
		var got []byte
		_ = b.Recent(func(tx storage.Txn) (err error) { got, err = tx.Get("k"); return err })
		return string(got) == "v"
	})
	elsewhere := c.Open(t, "elsewhere")
	for i := range 5 {
		set(t, elsewhere, "z", fmt.Sprint(i))
	}
	cli := a.Client()
	head, err := cli.Get(context.Background(), "elsewhere/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(context.Background(), head.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	var listed []string
	err = b.Recent(func(tx storage.Txn) error {
		return tx.Scan("", func(key string, v []byte) error {
			listed = append(listed, key+"="+string(v))
			return nil
		})
	})
	if err != nil || strings.Join(listed, " ") != "junk/x=v k=v" {
		t.Errorf("Recent's scan past a compaction: %q, %v", listed, err)
	}
}
