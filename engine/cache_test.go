package engine

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
)

// A read that raced a commit must not cache what it read before the commit.
func TestRecordCacheGenerations(t *testing.T) {
	var c recordCache
	old := cachedRecord{Record: Record{Revision: 1}, raw: []byte("1")}
	_, gen, ok := c.get("k")
	if ok {
		t.Fatal("empty cache hit")
	}
	two := cachedRecord{Record: Record{Revision: 2}, raw: []byte("2")}
	c.commitBegins("k")
	committed := c.invalidate("k", &two) // a commit lands between the read's get and its put
	c.put("k", old, gen)
	if _, _, ok := c.get("k"); ok {
		t.Fatal("a read from before the commit was cached")
	}
	c.done("k", &two, committed)
	if r, _, ok := c.get("k"); !ok || r.Revision != 2 {
		t.Fatalf("after fill: %v %v", r.Revision, ok)
	}
	_, gen, _ = c.get("k")
	c.put("k", cachedRecord{Record: Record{Revision: 3}, raw: []byte("3")}, gen)
	if r, _, _ := c.get("k"); r.Revision != 3 {
		t.Fatalf("a put at the current generation was dropped: %d", r.Revision)
	}
}

// Commits on one stack become durable in any order once each released the stack: readers see a
// commit only once it is durable, never an older one after a newer, and a transaction meanwhile
// skips decoding the newest commit's bytes.
func TestRecordCacheCommitsOvertaken(t *testing.T) {
	var c recordCache
	four := cachedRecord{Record: Record{Revision: 4}, raw: []byte("4")}
	five := cachedRecord{Record: Record{Revision: 5}, raw: []byte("5")}
	c.commitBegins("k")
	genFour := c.invalidate("k", &four)
	c.commitBegins("k")
	genFive := c.invalidate("k", &five)
	if _, _, ok := c.get("k"); ok {
		t.Fatal("a reader was served a commit not yet durable")
	}
	if r, ok := c.decoded("k", []byte("5")); !ok || r.Revision != 5 {
		t.Fatalf("a transaction reading the latest commit's bytes decodes them again: %v %v", r.Revision, ok)
	}
	c.done("k", &five, genFive) // the later commit is acknowledged first
	if _, _, ok := c.get("k"); ok {
		t.Fatal("a reader was served the cache while a commit on its key was still under way")
	}
	c.done("k", &four, genFour)
	if r, _, ok := c.get("k"); !ok || r.Revision != 5 {
		t.Fatalf("after both are durable readers see revision %d (%v), want 5", r.Revision, ok)
	}
}

// A transaction skips decoding only bytes identical to those the cached record came from.
func TestRecordCacheDecodedOnlyFromTheSameBytes(t *testing.T) {
	var c recordCache
	if _, ok := c.decoded("k", []byte("3")); ok {
		t.Fatal("empty cache hit")
	}
	c.put("k", cachedRecord{Record: Record{Revision: 3}, raw: []byte("3")}, 0)
	if r, ok := c.decoded("k", []byte("3")); !ok || r.Revision != 3 {
		t.Fatalf("same bytes: %v %v", r.Revision, ok)
	}
	for _, other := range []string{"4", "", "33"} {
		if _, ok := c.decoded("k", []byte(other)); ok {
			t.Fatalf("bytes %q were taken for the cached %q", other, "3")
		}
	}
	if _, ok := c.decoded("j", []byte("3")); ok {
		t.Fatal("another key's entry was used")
	}
}

// Reads see every commit at once: the engine's cached record follows claims and releases.
func TestStackReadsFollowCommits(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "s")
	for i := range 5 {
		if err := e.Claim(t.Context(), me("create", "h"), "app", "s", "h", untracked("h")); err != nil {
			t.Fatal(err)
		}
		if err := e.Claim(t.Context(), me("create", "g"), "app", "s", "g", untracked("g")); err != nil {
			t.Fatal(err)
		}
		r, err := e.Stack("app", "s")
		if err != nil || len(r.Value.Holders) != 2 {
			t.Fatalf("round %d: %d holders, %v", i, len(r.Value.Holders), err)
		}
		if err := e.Release(t.Context(), me("unlink", "g"), "app", "s", "g"); err != nil {
			t.Fatal(err)
		}
		r, err = e.Stack("app", "s")
		if err != nil || len(r.Value.Holders) != 1 || r.Value.Holders[0].Name != "h" {
			t.Fatalf("round %d after release: %+v, %v", i, r.Value.Holders, err)
		}
	}
}

// A cockpit's metadata is decoded from exactly the bytes read: new bytes are decoded anew, and
// bytes that fail to decode are refused without replacing the cached entry.
func TestCockpitCacheDecodesTheBytesRead(t *testing.T) {
	var c cockpitCache
	first := []byte(`{"name":"app","uid":1000}`)
	second := []byte(`{"name":"app","uid":1001}`)
	for i, step := range []struct {
		raw     []byte
		wantUID uint32
	}{{first, 1000}, {first, 1000}, {second, 1001}, {first, 1000}} {
		m, err := c.decode("c/app", step.raw)
		if err != nil || m.UID != step.wantUID {
			t.Fatalf("step %d: uid %d, %v; want %d", i, m.UID, err, step.wantUID)
		}
	}
	if _, err := c.decode("c/app", []byte(`{"uid":`)); err == nil {
		t.Fatal("malformed bytes decoded")
	}
	if m, err := c.decode("c/app", first); err != nil || m.UID != 1000 {
		t.Fatalf("after a malformed read: uid %d, %v; want 1000", m.UID, err)
	}
}

// A cockpit read outside a transaction is served from the cache only until the next commit, and
// not at all if a commit happened while it was read.
func TestCockpitCacheCurrency(t *testing.T) {
	var c cockpitCache
	raw := []byte(`{"name":"app","uid":1000}`)
	if _, err := c.decode("c/app", raw); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.current("c/app"); ok {
		t.Fatal("decoded inside a transaction, yet current")
	}
	other := []byte(`{"name":"app","uid":1001}`)
	c.read("c/app", other, c.since()) // a View read other bytes than the entry holds
	if _, ok := c.current("c/app"); ok {
		t.Fatal("current though the View read other bytes")
	}
	c.read("c/app", raw, c.since())
	if m, ok := c.current("c/app"); !ok || m.UID != 1000 {
		t.Fatalf("after a read: %+v, %v", m, ok)
	}
	c.begin()
	if _, ok := c.current("c/app"); ok {
		t.Fatal("current while a commit is under way")
	}
	c.read("c/app", raw, c.since()) // a View while the commit is under way may or may not see it
	if _, ok := c.current("c/app"); ok {
		t.Fatal("current though read while a commit was under way")
	}
	c.end()
	at := c.since()
	c.begin() // a commit while the View ran
	c.end()
	c.read("c/app", raw, at)
	if _, ok := c.current("c/app"); ok {
		t.Fatal("current though a commit raced its read")
	}
}

// A removed cockpit decoded afterwards (by a read begun before its removal) is not kept, until a
// cockpit of its name is made again; only the newest goneKept removals are remembered.
func TestCockpitCacheKeepsNoRemovedCockpit(t *testing.T) {
	var c cockpitCache
	raw := []byte(`{"name":"app","uid":1000}`)
	cached := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.m)
	}
	if _, err := c.decode("c/app", raw); err != nil || cached() != 1 {
		t.Fatalf("not kept: %v", err)
	}
	c.removed("c/app")
	if m, err := c.decode("c/app", raw); err != nil || m.UID != 1000 || cached() != 0 {
		t.Fatalf("after the removal: %+v, %v, %d kept", m, err, cached())
	}
	c.created("c/app")
	if _, err := c.decode("c/app", raw); err != nil || cached() != 1 {
		t.Fatalf("made again, yet not kept: %v", err)
	}
	c.removed("c/app")
	for i := range goneKept {
		c.removed(fmt.Sprintf("c/other%d", i))
	}
	if len(c.gone) != goneKept || len(c.goneOrder) != goneKept {
		t.Fatalf("%d marks, %d in order; want %d", len(c.gone), len(c.goneOrder), goneKept)
	}
	if _, err := c.decode("c/app", raw); err != nil || cached() != 1 {
		t.Fatalf("the oldest mark outlived %d newer ones: %v", goneKept, err)
	}
}

// Engine.Cockpit follows every change: a config written, the cockpit removed.
func TestCockpitReadsFollowCommits(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig)
	for range 2 { // the second from the cache
		if info, err := e.Cockpit("app"); err != nil || info.Config != exampleConfig {
			t.Fatalf("Cockpit: %q, %v", info.Config, err)
		}
	}
	changed := strings.Replace(exampleConfig, "count = ", "count = 1", 1)
	if err := e.SetConfig(t.Context(), me("write", "config"), "app", []byte(changed)); err != nil {
		t.Fatal(err)
	}
	if info, err := e.Cockpit("app"); err != nil || info.Config != changed {
		t.Fatalf("after a config change: %q, %v; want %q", info.Config, err, changed)
	}
	if err := e.RemoveCockpit(t.Context(), me("rmdir", "app"), "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Cockpit("app"); AsRefusal(err).Code != NotFound {
		t.Fatalf("after rmdir: %v, want NotFound", err)
	}
}

// pausingStore is a real store whose armed commit (one, then it disarms) waits for the test:
// readable, the commit made durable before Commit returns, so readable by every View, as a store
// durable at commit does (or one whose sync round another committer led), then paused: the
// moment between a commit becoming readable and its committer getting back. Otherwise paused in
// its sync, before it is durable.
type pausingStore struct {
	*kv.DB
	readable bool
	armed    atomic.Bool
	paused   chan struct{}
	resume   chan struct{}
}

func newPausingStore(t *testing.T, readable bool) *pausingStore {
	db, err := kv.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &pausingStore{DB: db, readable: readable, paused: make(chan struct{}), resume: make(chan struct{})}
}

// heldStackOnPausingStore is an engine on a pausingStore with stack app/s held by h.
func heldStackOnPausingStore(t *testing.T, readable bool) (*Engine, *pausingStore) {
	store := newPausingStore(t, readable)
	e := New(store)
	newCockpit(t, e, "app", exampleConfig, "s")
	if err := e.Claim(t.Context(), me("create", "h"), "app", "s", "h", untracked("h")); err != nil {
		t.Fatal(err)
	}
	return e, store
}

func (s *pausingStore) Commit(ctx context.Context, fn func(storage.Txn) error) (func() error, error) {
	durable, err := s.DB.Commit(ctx, fn)
	if err != nil || !s.armed.CompareAndSwap(true, false) {
		return durable, err
	}
	if !s.readable {
		return func() error {
			s.paused <- struct{}{}
			<-s.resume
			return durable()
		}, nil
	}
	if err := durable(); err != nil {
		return nil, err
	}
	s.paused <- struct{}{}
	<-s.resume
	return func() error { return nil }, nil
}

// A commit readable in the store before its committer is back is what every read shows: the
// cache does not answer with the record it replaced.
func TestCacheServesNothingOlderThanTheStore(t *testing.T) {
	t.Parallel()
	e, store := heldStackOnPausingStore(t, true)
	if r, err := e.Stack("app", "s"); err != nil || len(r.Value.Holders) != 1 { // now cached
		t.Fatalf("%d holders, %v", len(r.Value.Holders), err)
	}
	store.armed.Store(true)
	claimed := make(chan error, 1)
	go func() { claimed <- e.Claim(context.Background(), me("create", "g"), "app", "s", "g", untracked("g")) }()
	<-store.paused
	var inStore int
	if err := store.View(func(tx storage.Txn) error {
		return tx.Scan(holdersPrefix("app", "s"), func(string, []byte) error { inStore++; return nil })
	}); err != nil || inStore != 2 {
		t.Fatalf("the store holds %d holders (%v): the commit is not readable yet", inStore, err)
	}
	r, err := e.Stack("app", "s")
	store.resume <- struct{}{}
	if err != nil || len(r.Value.Holders) != 2 {
		t.Fatalf("with the claim of g readable in the store, a read shows %d holders (%v)", len(r.Value.Holders), err)
	}
	if err := <-claimed; err != nil {
		t.Fatal(err)
	}
	if r, err := e.Stack("app", "s"); err != nil || len(r.Value.Holders) != 2 {
		t.Fatalf("after the claim: %d holders, %v", len(r.Value.Holders), err)
	}

	for range 2 { // the second from the cache
		if info, err := e.Cockpit("app"); err != nil || info.Config != exampleConfig {
			t.Fatalf("Cockpit: %q, %v", info.Config, err)
		}
	}
	changed := strings.Replace(exampleConfig, "count = ", "count = 1", 1)
	store.armed.Store(true)
	go func() {
		claimed <- e.SetConfig(context.Background(), me("write", "app/config"), "app", []byte(changed))
	}()
	<-store.paused
	info, err := e.Cockpit("app")
	store.resume <- struct{}{}
	if err != nil || info.Config != changed {
		t.Fatalf("with the new config readable in the store, the cockpit shows %q (%v)", info.Config, err)
	}
	if err := <-claimed; err != nil {
		t.Fatal(err)
	}
}

// A claim does not wait for the sync of another commit on its stack before its own transaction:
// what it observes first is a hint, taken from the last commit, so writers queued on one stack
// share syncs.
func TestClaimDoesNotWaitForAnotherCommitsSync(t *testing.T) {
	t.Parallel()
	e, store := heldStackOnPausingStore(t, false)
	store.armed.Store(true)
	first := make(chan error, 1)
	go func() { first <- e.Claim(context.Background(), me("create", "a"), "app", "s", "a", untracked("a")) }()
	<-store.paused // a's commit is made, its sync held
	second := make(chan error, 1)
	go func() { second <- e.Claim(context.Background(), me("create", "b"), "app", "s", "b", untracked("b")) }()
	select {
	case err := <-second:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the claim of b waited for the sync of a's")
		store.resume <- struct{}{}
		<-second
		<-first
		return
	}
	store.resume <- struct{}{}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if r, err := e.Stack("app", "s"); err != nil || len(r.Value.Holders) != 3 {
		t.Fatalf("%d holders, %v", len(r.Value.Holders), err)
	}
}

// A cache the engine keeps fresh from its commits is one update walks: every field of Engine that
// is a commitObserver is in the list.
func TestEveryCommitObserverIsWalked(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	listed := map[uintptr]bool{}
	for _, o := range e.observers() {
		listed[reflect.ValueOf(o).Pointer()] = true
	}
	observer := reflect.TypeFor[commitObserver]()
	v := reflect.ValueOf(e).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		if reflect.PointerTo(f.Type()).Implements(observer) && !listed[f.UnsafeAddr()] {
			t.Errorf("Engine.%s observes commits but is not in Engine.observers", v.Type().Field(i).Name)
		}
	}
}
