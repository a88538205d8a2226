package engine

import (
	"context"
	"errors"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cockpitfs/cockpitfs/storage"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore"
	"github.com/cockpitfs/cockpitfs/storage/etcdstore/etcdtest"
)

// A shared store's values are input the daemon did not write: another daemon's bug, a teammate
// with etcdctl, a restore. These tests put hostile values under a real etcd prefix, beside an
// engine serving it, with a client of their own.

// hostileEngine is an engine over prefix "team" of a one-member etcd, and a client that writes
// under the prefix behind its back.
func hostileEngine(t *testing.T) (*Engine, func(key, value string)) {
	e, w := hostileStore(t)
	return e, w.put
}

// hostileWriter writes under the prefix "team" behind an engine's back.
type hostileWriter struct {
	t   *testing.T
	cli *clientv3.Client
}

func (w hostileWriter) put(key, value string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.cli.Put(ctx, "team/"+key, value); err != nil {
		w.t.Fatal(err)
	}
}

func (w hostileWriter) del(key string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.cli.Delete(ctx, "team/"+key); err != nil {
		w.t.Fatal(err)
	}
}

// hostileStore is hostileEngine with a writer that deletes too.
func hostileStore(t *testing.T) (*Engine, hostileWriter) {
	t.Helper()
	cluster := etcdtest.Start(t, 1)
	e, err := NewShared(cluster.Open(t, "team"))
	if err != nil {
		t.Fatal(err)
	}
	return e, hostileWriterOf(t, cluster)
}

// hostileWriterOf writes cluster's keys as a teammate with etcdctl would.
func hostileWriterOf(t *testing.T, cluster *etcdtest.Cluster) hostileWriter {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return hostileWriter{t, cli}
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

// TestDamagedCockpitOrPortEntryHidesNoOther: one cockpit's value that does not decode, or names
// another cockpit (or none), failed the listing of every cockpit (the mount's root, the web
// proxy's routes, gc's survey), and one port index entry that does not decode failed the listing
// of every port (`ls ports`). The damaged one is now listed by its key, and its own read refuses
// it as damage; every other cockpit and port is listed and served.
func TestDamagedCockpitOrPortEntryHidesNoOther(t *testing.T) {
	e, put := hostileEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "s")
	newCockpit(t, e, "other", "[ports]\nstep = 10\ncount = 5\n[ports.bases]\nWEB = 19000\n", "o")
	for _, c := range []struct{ cockpit, stack string }{{"app", "s"}, {"other", "o"}} {
		if err := e.Claim(ctx, me("create", "h"), c.cockpit, c.stack, "h", untracked("h")); err != nil {
			t.Fatal(err)
		}
	}
	for _, meta := range []string{"garbage", `{}`, `{"name":"other"}`, `[1]`} {
		put(cockpitKey("app"), meta)
		put(cockpitKey(""), meta)    // a name no cockpit may have: not listed
		put(cockpitKey("a/b"), "{}") // nor one with a '/'
		cockpits, err := e.Cockpits()
		if err != nil {
			t.Fatalf("c/app %s: cockpits: %v", meta, err)
		}
		var names []string
		for _, c := range cockpits {
			names = append(names, c.Name)
			if c.Damaged != (c.Name == "app") {
				t.Errorf("c/app %s: cockpit %s listed with Damaged %v", meta, c.Name, c.Damaged)
			}
		}
		if len(names) != 2 || names[0] != "app" || names[1] != "other" {
			t.Fatalf("c/app %s: cockpits %q, want [app other]", meta, names)
		}
		if _, err := e.Cockpit("app"); AsRefusal(err).Code != StateRecordMalformed {
			t.Errorf("c/app %s: reading it: %v, want %s", meta, err, StateRecordMalformed)
		}
		if _, err := e.Cockpit("other"); err != nil {
			t.Errorf("c/app %s: reading other: %v", meta, err)
		}
		if _, err := e.ProxiedEntrypoints(); err != nil {
			t.Errorf("c/app %s: the proxy's entrypoints: %v", meta, err)
		}
		if idx, err := e.routes.get(e, indexNow); err != nil {
			t.Errorf("c/app %s: the proxy's routes: %v", meta, err)
		} else if len(idx.stacks["other/o"]) != 1 {
			t.Errorf("c/app %s: other/o indexed %d times in the proxy's routes", meta, len(idx.stacks["other/o"]))
		}
	}

	put(portKey(19000), "garbage")
	put(portKey(19010), `{"port":-1}`)
	put(portsPrefix+"abc", "x")
	owners, err := e.Ports()
	if err != nil {
		t.Fatalf("ports: %v", err)
	}
	var ports []int
	for _, o := range owners {
		ports = append(ports, o.Port)
	}
	if want := []int{15432, 18080, 19000, 19010}; !slices.Equal(ports, want) {
		t.Fatalf("ports %v, want %v", ports, want)
	}
	if _, _, err := e.PortOwner(19000); !isMalformed(err) {
		t.Errorf("reading port 19000's garbage: %v, want it refused as damage", err)
	}
}

// TestRecordOfAnotherStackIsDamage: a stack's key holding {} (which decodes) or another stack's
// record was served as this stack's: a stack of no name, or another's lease and names, under its
// path. It is refused as damage; the other stack serves.
func TestRecordOfAnotherStackIsDamage(t *testing.T) {
	e, put := hostileEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "s", "t")
	for _, stack := range []string{"s", "t"} {
		if err := e.Claim(ctx, me("create", "h"), "app", stack, "h", untracked("h")); err != nil {
			t.Fatal(err)
		}
	}
	var other []byte
	if err := e.db.View(func(tx storage.Txn) (err error) {
		other, err = tx.Get(stackKey("app", "t"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, head := range []string{`{}`, `null`, string(other), strings.Replace(string(other), `"format":"cockpit-state/v1"`, `"format":"cockpit-state/v2"`, 1)} {
		put(stackKey("app", "s"), head)
		if r, err := e.Stack("app", "s"); !isMalformed(err) {
			t.Errorf("s/app/s %.60s: read as %s/%s, err %v; want it refused as damage", head, r.Cockpit, r.Stack, err)
		}
		if _, err := e.Stack("app", "t"); err != nil {
			t.Errorf("s/app/s %.60s: the other stack: %v", head, err)
		}
	}
}

// TestStatusShowsDamageBesideEverythingElse: one stack's record or one cockpit's value that does
// not decode failed status and status.json for every user of every machine on the prefix. Each
// is now a row that says it is damaged, and every other row is shown; once the value is whole
// again, so is its row.
func TestStatusShowsDamageBesideEverythingElse(t *testing.T) {
	e, put := hostileEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "s", "t")
	newCockpit(t, e, "other", "[ports]\nstep = 10\ncount = 5\n[ports.bases]\nWEB = 19000\n", "o")
	for _, c := range []struct{ cockpit, stack string }{{"app", "s"}, {"app", "t"}, {"other", "o"}} {
		if err := e.Claim(ctx, me("create", "h"), c.cockpit, c.stack, "h", untracked("h")); err != nil {
			t.Fatal(err)
		}
	}
	status := func() (table, js string) {
		t.Helper()
		tb, _, err := e.StatusFile(StatusTable)
		if err != nil {
			t.Fatalf("status: %v", err)
		}
		j, _, err := e.StatusFile(StatusJSON)
		if err != nil {
			t.Fatalf("status.json: %v", err)
		}
		return string(tb), string(j)
	}
	whole, _ := status()
	var kept []byte
	if err := e.db.View(func(tx storage.Txn) (err error) { kept, err = tx.Get(stackKey("app", "t")); return err }); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"garbage", `{}`, string(kept[:len(kept)/2])} {
		put(stackKey("app", "t"), bad)
		waitStatus(t, e, func(table string) bool { return strings.Contains(table, "damaged") })
		table, js := status()
		for _, want := range []string{"app      s  ", "app      t      -    -", "damaged", "other    o  "} {
			if !strings.Contains(table, want) {
				t.Fatalf("s/app/t %q: status lacks %q:\n%s", bad, want, table)
			}
		}
		if !strings.Contains(js, `"name": "t",`) || !strings.Contains(js, `"damaged": "decode `) || !strings.Contains(js, `"name": "o",`) {
			t.Fatalf("s/app/t %q: status.json:\n%s", bad, js)
		}
	}
	put(stackKey("app", "t"), string(kept))
	waitStatus(t, e, func(table string) bool { return !strings.Contains(table, "damaged") })
	if table, _ := status(); table != whole {
		t.Fatalf("whole again, status:\n%s\nwas:\n%s", table, whole)
	}

	put(cockpitKey("app"), "garbage")
	waitStatus(t, e, func(table string) bool { return strings.Contains(table, "damaged") })
	table, js := status()
	if !regexp.MustCompile(`(?m)^app +- +- +- +- +damaged +- +- +- +-$`).MatchString(table) || strings.Contains(table, "app      s") || !strings.Contains(table, "other    o  ") {
		t.Fatalf("c/app garbage: status:\n%s", table)
	}
	if !strings.Contains(js, `"damaged": "decode `) || !strings.Contains(js, `"name": "o",`) {
		t.Fatalf("c/app garbage: status.json:\n%s", js)
	}
}

// waitStatus waits for the engine's status table to satisfy ok: a value put behind the engine's
// back reaches it through the store's watch.
func waitStatus(t *testing.T, e *Engine, ok func(table string) bool) {
	t.Helper()
	var table []byte
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var err error
		if table, _, err = e.StatusFile(StatusTable); err == nil && ok(string(table)) {
			return
		}
	}
	t.Fatalf("status never as wanted:\n%s", table)
}

// TestHolderDeletedBehindTheDaemonIsGone: a holder's key deleted by a third party left the stack's
// head as it was, and a running daemon, which decodes a record again only when its head changes,
// kept showing the holder until the next commit on the stack; a fresh daemon showed none. The
// watch now drops the cached record, so the running daemon reads the stack as the store holds it.
func TestHolderDeletedBehindTheDaemonIsGone(t *testing.T) {
	e, w := hostileStore(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "s")
	for _, h := range []string{"h", "g"} {
		if err := e.Claim(ctx, me("create", h), "app", "s", h, untracked(h)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := e.Stack("app", "s")
	if err != nil || len(r.Value.Holders) != 2 {
		t.Fatalf("before: %v, %d holders", err, len(r.Value.Holders))
	}
	w.del(holderKey("app", "s", holderID("g")))
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := e.Stack("app", "s")
		if err != nil {
			t.Fatal(err)
		}
		if _, held := r.Value.Holder("g"); !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("holder g, whose key is gone, still shown: %+v", r.Value.Holders)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, held := r.Value.Holder("h"); !held {
		t.Fatal("holder h gone too")
	}
}

// TestPortIndexEntryDeletedIsNoFreePort: a port's index entry deleted behind the daemons (etcdctl)
// made the port free to the next claim while another stack's active lease still held it, so two
// stacks leased one port. A claim now checks, for a port with no entry, the record of the stack
// the leases name for it: the family is passed as that stack's.
func TestPortIndexEntryDeletedIsNoFreePort(t *testing.T) {
	e, w := hostileStore(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "s")
	newCockpit(t, e, "other", exampleConfig, "o")
	s := unindexedLease(t, e, w)
	if s.Value.Lease.Offset != 0 {
		t.Fatalf("app/s leased at offset %d", s.Value.Lease.Offset)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok, err := e.PortOwner(18080); err == nil && !ok {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("port 18080 still indexed: %v", err)
		}
	}
	if err := e.Claim(ctx, me("create", "h"), "other", "o", "h", untracked("h")); err != nil {
		t.Fatal(err)
	}
	leasedBeside(t, e, "o", s)
}

// TestVerifyChecksEventsKeys: verify checked every record, the port index and the counts, but
// none of the events files' keys, so an events head or line no daemon wrote (which refuses the
// file, or is served in it) passed as clean. Each is now named, and an untouched store is clean.
func TestVerifyChecksEventsKeys(t *testing.T) {
	e, w := hostileStore(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "s")
	if err := e.Claim(ctx, me("create", "h"), "app", "s", "h", untracked("h")); err != nil {
		t.Fatal(err)
	}
	if violations, _, err := Verify(e.db); err != nil || len(violations) > 0 {
		t.Fatalf("before: %v %q", err, violations)
	}
	for _, c := range []struct{ key, value, want string }{
		{eventsHeadKey("app", "s"), "garbage", eventsHeadKey("app", "s") + ": "},
		{eventsHeadKey("app", "s"), `{"seq":3,"end":-1,"windows":{"h":3}}`, "out of range"},
		{eventsHeadKey("app", "gone"), `{"seq":1,"end":10,"windows":{"h":1}}`, "app/gone, which does not exist"},
		{eventKey("app", "s", 0), "garbage", eventKey("app", "s", 0) + ": "},
		{eventKey("app", "s", 1000), `{"at":"x"}`, "at or past its file's next seq"},
		{eventsPrefix("app", "s") + "zz", `{}`, "is not the key of an events line"},
		{eventsIndexKey("app", "s", historyWindow, 0), "garbage", eventsIndexKey("app", "s", historyWindow, 0) + ": "},
		{eventsIndexKey("app", "s", historyWindow, 0), "77", "names line 77, which is not there"},
		{eventsIndexKey("app", "s", historyWindow, 500), "0", "which has had"},
		{eventsSeqKey("app", cockpitLevel), "-1", eventsSeqKey("app", cockpitLevel) + ": "},
		{eventsEndKey("app", "s"), "-5", "out of range"},
	} {
		var kept []byte
		if err := e.db.View(func(tx storage.Txn) (err error) {
			kept, err = tx.Get(c.key)
			if errors.Is(err, storage.ErrNotFound) {
				err = nil
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		w.put(c.key, c.value)
		violations, _, err := Verify(e.db)
		if err != nil {
			t.Fatal(err)
		}
		if len(violations) != 1 || !strings.HasPrefix(violations[0], c.key+": ") || !strings.Contains(violations[0], c.want) {
			t.Errorf("%s = %s: verify says %q, want one line naming it with %q", c.key, c.value, violations, c.want)
		}
		if kept != nil {
			w.put(c.key, string(kept))
		} else {
			w.del(c.key)
		}
	}
}

// TestCountThatDoesNotDecodeIsRecounted: a count that does not decode (the cockpit's active
// leases, its leased ports, a uid's leases or cockpits) refused every new lease of the cockpit,
// or every cockpit of the uid, with EIO until someone repaired it by hand. A count says no more
// than the records it counts, and never chooses a port: it is recounted from them, the operation
// goes on, its events line names the recount, and its commit writes the count whole.
func TestCountThatDoesNotDecodeIsRecounted(t *testing.T) {
	e, w := hostileStore(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "s", "t", "u", "v")
	if err := e.Claim(ctx, me("create", "h"), "app", "s", "h", untracked("h")); err != nil {
		t.Fatal(err)
	}
	uid := uint32(os.Getuid())
	for _, c := range []struct{ key, stack string }{{leaseCountKey("app"), "t"}, {leasedPortsKey("app"), "u"}, {uidLeasesKey(uid), "v"}} {
		w.put(c.key, "garbage")
		if err := e.Claim(ctx, me("create", "h"), "app", c.stack, "h", untracked("h")); err != nil {
			t.Fatalf("%s garbage: claim of app/%s: %v", c.key, c.stack, err)
		}
		lines, err := e.events("app", c.stack)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(lines), c.key+` did not decode: recounted`) && !strings.Contains(string(lines), "decode "+c.key) {
			t.Errorf("%s garbage: the claim's line does not name it:\n%s", c.key, lines)
		}
		if violations, _, err := Verify(e.db); err != nil || len(violations) > 0 {
			t.Fatalf("%s garbage: after the claim, verify: %v %q", c.key, err, violations)
		}
	}

	w.put(uidCockpitsKey(uid), "garbage")
	newCockpit(t, e, "other", "")
	if violations, _, err := Verify(e.db); err != nil || len(violations) > 0 {
		t.Fatalf("k/ garbage: after mkdir, verify: %v %q", err, violations)
	}
}

// TestKeysOutsideTheLayout: a key under the prefix that is none of the layout's (junk put by hand,
// a port key spelled otherwise, a stack key of three names) is one no daemon reads: each daemon's
// store keeps no value of it (storage.Shared.Withhold), and verify names it. Every key a daemon
// writes is in the layout.
func TestKeysOutsideTheLayout(t *testing.T) {
	e, w := hostileStore(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "s")
	if err := e.Claim(ctx, me("create", "h"), "app", "s", "h", untracked("h")); err != nil {
		t.Fatal(err)
	}
	if err := e.db.View(func(tx storage.Txn) error {
		return tx.Scan("", func(key string, _ []byte) error {
			if !inLayout(key) {
				t.Errorf("the daemon wrote %s, outside the layout", key)
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	outside := []string{"junk/1", "p/abc", "p/8080", "s/app/s/x", "s/app", "zz", "h/app/s/", "u/01", "u/-1", "k/4294967296", "t/", "t/1/2"}
	for _, key := range outside {
		w.put(key, "x")
	}
	violations, _, err := Verify(e.db)
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	for _, v := range violations {
		if key, _, ok := strings.Cut(v, ": is not a key of cockpitfs's layout"); ok {
			named = append(named, key)
		}
	}
	slices.Sort(outside)
	if !slices.Equal(named, outside) {
		t.Errorf("verify names %q outside the layout, want %q (all: %q)", named, outside, violations)
	}
}

// TestStatusShowsNoHostileName: a stack's key or a holder's name is input too. A key no stack
// may have (a newline, an escape, a slash in its name) was a damaged row whose name the table
// printed as it is, forging rows and writing escapes to every user's terminal, and `ls stacks`
// listed it (a '/' in a name fails the kernel's whole listing: EIO); a holder's name was printed
// as it is. Such a key is not a stack (verify names it), and a name is printed as text views
// print values.
func TestStatusShowsNoHostileName(t *testing.T) {
	e, put := hostileEngine(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "s", "t")
	if err := e.Claim(ctx, me("create", "h"), "app", "s", "h", untracked("h")); err != nil {
		t.Fatal(err)
	}
	put(stackKey("app", "x\napp      forged  1    HTTP=1"), "garbage")
	put(stackKey("app", "e\x1b]0;owned\x07"), "garbage")
	put(stackKey("app", "a/b"), "garbage")
	put(holderKey("app", "t", "zz"), `{"holderId":"zz","name":"h\u001b[2J\nforged","checkoutId":"c","claimedAt":"2026-01-01T00:00:00.000Z"}`)
	waitStatus(t, e, func(table string) bool { return strings.Contains(table, "forged") })
	table, _, err := e.StatusFile(StatusTable)
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(string(table), "\x1b\x07") || regexp.MustCompile(`(?m)^forged|^app +forged`).Match(table) {
		t.Fatalf("status printed a hostile name as it is:\n%q", table)
	}
	stacks, err := e.Stacks("app")
	if err != nil || !slices.Equal(stacks, []string{"s", "t"}) {
		t.Fatalf("stacks of app: %q, %v; want s and t", stacks, err)
	}
	// verify names each, one line apiece, with nothing a terminal acts on.
	violations, _, err := Verify(e.db)
	if err != nil {
		t.Fatal(err)
	}
	named := strings.Join(violations, "\n")
	for _, key := range []string{`s/app/x\napp      forged`, `s/app/e\x1b]0;owned\a`, "s/app/a/b", `s/app/t: holder "h\\x1b[2J\\nforged"`} {
		if !strings.Contains(named, key) {
			t.Errorf("verify does not name %s", key)
		}
	}
	if strings.ContainsAny(named, "\x1b\x07") || regexp.MustCompile(`(?m)^app +forged`).MatchString(named) {
		t.Fatalf("verify printed a hostile name as it is:\n%q", named)
	}
}

// TestClaimBesideJunkAfterACompaction: a key outside the layout under s/ (junk put by hand) is
// one the daemon's store withholds, so the first claim's read of every stack (leaseHolders, from
// the store's own copy) read it from etcd at the copy's revision. With the prefix idle while other
// keys of the cluster changed, and etcd compacted past that revision, the read failed, and the
// claim with it ("snapshot revision compacted"), and every claim after it, until the prefix
// changed again.
func TestClaimBesideJunkAfterACompaction(t *testing.T) {
	e, w := hostileStore(t)
	ctx := context.Background()
	w.put("s/junk", "x")
	newCockpit(t, e, "app", exampleConfig, "s")
	for i := range 5 {
		if _, err := w.cli.Put(ctx, "elsewhere/z", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	head, err := w.cli.Get(ctx, "elsewhere/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.cli.Compact(ctx, head.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if err := e.Claim(ctx, me("create", "h"), "app", "s", "h", untracked("h")); err != nil {
		t.Fatalf("claim after the compaction: %v", err)
	}
}

// pausedStore is an etcd store whose next Commit, and next Recent scan of every stack, wait
// for the test once armed.
type pausedStore struct {
	*etcdstore.Store
	commit, scan chan chan struct{} // each armed pause: the test hears of it, then releases it
}

func (s *pausedStore) Commit(ctx context.Context, fn func(storage.Txn) error) (func() error, error) {
	pause(s.commit)
	return s.Store.Commit(ctx, fn)
}

func (s *pausedStore) Recent(fn func(storage.Txn) error) error {
	return s.Store.Recent(func(tx storage.Txn) error { return fn(pausedTxn{tx, s}) })
}

type pausedTxn struct {
	storage.Txn
	s *pausedStore
}

func (t pausedTxn) Scan(prefix string, fn func(key string, value []byte) error) error {
	if prefix == allStacksPrefix {
		pause(t.s.scan)
	}
	return t.Txn.Scan(prefix, fn)
}

// pause waits for the test to release it, if armed.
func pause(armed chan chan struct{}) {
	select {
	case release := <-armed:
		release <- struct{}{} // paused
		<-release
	default:
	}
}

// TestPortIndexEntryDeletedStaysHeldThroughAReload: a watch that may have missed changes ("":
// etcd compacted its history) has the next claim read every record again. That read emptied the
// ports the leases hold first and read the records after, so a claim of another stack whose
// transaction ran meanwhile found no lease holding a port whose index entry had long been deleted,
// and leased it: two active leases on one port. A reload now replaces what the records say,
// stack by stack, and then forgets the stacks that are gone.
func TestPortIndexEntryDeletedStaysHeldThroughAReload(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	db := &pausedStore{Store: cluster.Open(t, "team"), commit: make(chan chan struct{}, 1), scan: make(chan chan struct{}, 1)}
	e, err := NewShared(db)
	if err != nil {
		t.Fatal(err)
	}
	w := hostileWriterOf(t, cluster)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "s", "t")
	newCockpit(t, e, "other", exampleConfig, "o")
	s := unindexedLease(t, e, w)
	// pauseIn runs op in a goroutine, and returns once op paused where armed is waited on.
	pauseIn := func(armed chan chan struct{}, op func()) (release chan struct{}) {
		release = make(chan struct{})
		armed <- release
		go op()
		select {
		case <-release:
		case <-time.After(10 * time.Second):
			t.Fatal("never paused")
		}
		return release
	}
	// other/o's claim has read what leases hold; its commit waits.
	claimed := make(chan error, 2)
	releaseCommit := pauseIn(db.commit, func() { claimed <- e.Claim(ctx, me("create", "h"), "other", "o", "h", untracked("h")) })
	// The watch may have missed changes: app/t's claim reads every record, and waits midway.
	e.published("")
	releaseScan := pauseIn(db.scan, func() { claimed <- e.Claim(ctx, me("create", "h"), "app", "t", "h", untracked("h")) })
	// other/o's run reads what leases hold again, after the reload (which it waits for).
	close(releaseCommit)
	close(releaseScan)
	err = <-claimed
	if err2 := <-claimed; err == nil {
		err = err2
	}
	if err != nil {
		t.Fatal(err)
	}
	leasedBeside(t, e, "o", s)
}

// TestPortIndexEntryDeletedStaysHeldAfterACopyGoes: what leases hold was kept as one stack for
// each port, the last record read that held it. A second record holding the same port (a copy of
// a stack's record put under another key, a restored one) took the port over, and when it went
// the port was held by no one: its index entry deleted, the next claim leased the port that the
// first stack's active lease held.
func TestPortIndexEntryDeletedStaysHeldAfterACopyGoes(t *testing.T) {
	e, w := hostileStore(t)
	ctx := context.Background()
	newCockpit(t, e, "app", exampleConfig, "s")
	newCockpit(t, e, "other", exampleConfig, "o", "p")
	s := unindexedLease(t, e, w)
	var head []byte
	if err := e.db.View(func(tx storage.Txn) (err error) { head, err = tx.Get(stackKey("app", "s")); return err }); err != nil {
		t.Fatal(err)
	}
	w.put(stackKey("app", "copy"), string(head))
	waitLeased := func(stack string) Record {
		t.Helper()
		if err := e.Claim(ctx, me("create", "h"), "other", stack, "h", untracked("h")); err != nil {
			t.Fatal(err)
		}
		return leasedBeside(t, e, stack, s)
	}
	// seen waits for the daemon's watch to deliver the copy's key as there or gone.
	seen := func(there bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			err := e.db.(storage.Shared).Recent(func(tx storage.Txn) error { _, err := tx.Get(stackKey("app", "copy")); return err })
			if (err == nil) == there {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the watch never delivered app/copy (there: %v): %v", there, err)
			}
		}
	}
	seen(true)
	waitLeased("o")
	w.del(stackKey("app", "copy"))
	seen(false)
	waitLeased("p")
}

// hookedStore is an etcd store that calls afterRun once, after the first run of its next
// Commit's fn, before that run commits.
type hookedStore struct {
	*etcdstore.Store
	afterRun func()
}

func (s *hookedStore) Commit(ctx context.Context, fn func(storage.Txn) error) (func() error, error) {
	hook := s.afterRun
	s.afterRun = nil
	return s.Store.Commit(ctx, func(tx storage.Txn) error {
		err := fn(tx)
		if hook != nil {
			hook()
			hook = nil
		}
		return err
	})
}

// TestPortIndexEntryDeletedBeforeARetry: a claim read what leases hold once, before its
// transaction, and ran that transaction again on each conflict with what it had read. Another
// daemon's lease that made it conflict (the uid's count both write), its index entries deleted
// before the run after the conflict, was no lease to it: it leased the same port.
func TestPortIndexEntryDeletedBeforeARetry(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	theirs, err := NewShared(cluster.Open(t, "team"))
	if err != nil {
		t.Fatal(err)
	}
	db := &hookedStore{Store: cluster.Open(t, "team")}
	mine, err := NewShared(db)
	if err != nil {
		t.Fatal(err)
	}
	w := hostileWriterOf(t, cluster)
	ctx := context.Background()
	newCockpit(t, theirs, "one", exampleConfig, "o")
	newCockpit(t, mine, "two", exampleConfig, "t")
	// mine has read every record before its claim.
	if err := mine.refreshLeaseHolders(); err != nil {
		t.Fatal(err)
	}
	var o Record
	db.afterRun = func() {
		if err := theirs.Claim(ctx, me("create", "h"), "one", "o", "h", untracked("h")); err != nil {
			t.Error(err)
			return
		}
		if o, err = theirs.Stack("one", "o"); err != nil {
			t.Error(err)
			return
		}
		for _, port := range o.Value.Lease.Ports {
			w.del(portKey(port))
		}
		// Once mine's watch has delivered the deletions, it has delivered the lease before them.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			var found int
			_ = db.Recent(func(tx storage.Txn) error {
				for _, port := range o.Value.Lease.Ports {
					if _, err := tx.Get(portKey(port)); err == nil {
						found++
					}
				}
				return nil
			})
			if found == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Error("mine's watch never delivered the deletions")
				return
			}
		}
	}
	if err := mine.Claim(ctx, me("create", "h"), "two", "t", "h", untracked("h")); err != nil {
		t.Fatal(err)
	}
	tr, err := mine.Stack("two", "t")
	if err != nil {
		t.Fatal(err)
	}
	for key, port := range tr.Value.Lease.Ports {
		if port == o.Value.Lease.Ports[key] {
			t.Fatalf("two/t leased port %d (%s), which one/o's active lease holds", port, key)
		}
	}
}

// leasedBeside is the record of other/<stack>, which must lease none of the ports held's active
// lease (app/s's) holds.
func leasedBeside(t *testing.T, e *Engine, stack string, held Record) Record {
	t.Helper()
	r, err := e.Stack("other", stack)
	if err != nil {
		t.Fatal(err)
	}
	for key, port := range r.Value.Lease.Ports {
		if port == held.Value.Lease.Ports[key] {
			t.Fatalf("other/%s leased port %d (%s), which app/s's active lease holds", stack, port, key)
		}
	}
	return r
}

// unindexedLease claims app/s (a new lease) and deletes its ports' index entries behind the
// engine, as a teammate with etcdctl would: the record that then alone says they are held.
func unindexedLease(t *testing.T, e *Engine, w hostileWriter) Record {
	t.Helper()
	if err := e.Claim(context.Background(), me("create", "h"), "app", "s", "h", untracked("h")); err != nil {
		t.Fatal(err)
	}
	s, err := e.Stack("app", "s")
	if err != nil {
		t.Fatal(err)
	}
	for _, port := range s.Value.Lease.Ports {
		w.del(portKey(port))
	}
	return s
}
