package engine

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/storage"
)

const verifyConfig = `[ports]
step = 10
count = 5
[ports.bases]
HTTP = 22080
DB = 22432
`

// verifyStore builds a store through the engine only: two cockpits, claims, a release, a holder
// change, a full sleep drain and a removed stack.
func verifyStore(t *testing.T) *Engine {
	t.Helper()
	ctx := context.Background()
	e := newEngine(t)
	newCockpit(t, e, "app", verifyConfig, "a", "b", "c")
	newCockpit(t, e, "web", strings.ReplaceAll(verifyConfig, "22", "23"), "x")
	for _, claim := range []struct{ cockpit, stack, holder string }{
		{"app", "a", "me"}, {"app", "a", "you"}, {"app", "b", "me"}, {"web", "x", "me"},
	} {
		if err := e.Claim(ctx, me("create", "holders/"+claim.holder), claim.cockpit, claim.stack, claim.holder, untracked(claim.holder)); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(e.Release(ctx, me("unlink", "app/stacks/a/holders/you"), "app", "a", "you"))
	must(e.SetHolder(ctx, me("write", "app/stacks/a/holders/me"), "app", "a", "me", "pid=none", false))
	b, err := e.Stack("app", "b")
	must(err)
	drain := me("write", "app/stacks/b/drain")
	must(e.ReserveDrain(ctx, drain, "app", "b", DrainRequest{Purpose: "sleep"}, b.Revision))
	must(e.StartAttempt(ctx, drain, "app", "b", 0))
	must(e.PublishOutcome(ctx, drain, "app", "b", Outcome{Success: true}))
	must(e.RemoveStack(ctx, me("rmdir", "app/stacks/b"), "app", "b"))
	return e
}

func TestVerifyIsCleanAfterEngineOperations(t *testing.T) {
	e := verifyStore(t)
	violations, records, err := Verify(e.db)
	if err != nil {
		t.Fatal(err)
	}
	if len(violations) != 0 {
		t.Fatalf("violations on a store the engine wrote:\n%s", strings.Join(violations, "\n"))
	}
	if records != 3 {
		t.Fatalf("checked %d records, want a, c and x", records)
	}
}

// Each corruption is written straight to the store, as a bug or a hand edit would; Verify names
// its key.
func TestVerifyNamesEachCorruption(t *testing.T) {
	for _, c := range []struct {
		name, key, says string
		corrupt         func(tx storage.Txn) error
	}{
		{"holders without a lease", "s/app/c", "the stack has holders but no active lease", func(tx storage.Txn) error {
			r, err := new(Engine).loadRecord(tx, "app", "c") // no cache: always decoded
			if err != nil {
				return err
			}
			r.Value.Holders = []Holder{Holder{Name: "me", CheckoutPath: "/src/me"}.claimed(time.Now())}
			return setJSON(tx, stackKey("app", "c"), r)
		}},
		{"a record that is not JSON", "s/app/c", "decode record", func(tx storage.Txn) error {
			return tx.Set(stackKey("app", "c"), []byte(`{"format":`))
		}},
		{"an orphan index entry", "p/22090", "indexed for app/c key HTTP, which holds no such active lease", func(tx storage.Txn) error {
			return setJSON(tx, portKey(22090), PortOwner{Port: 22090, Cockpit: "app", Stack: "c", Key: "HTTP", Offset: 10})
		}},
		{"a lease port missing from the index", "s/app/a", "port 22432 (DB) is missing from the machine's port index", func(tx storage.Txn) error {
			return tx.Delete(portKey(22432))
		}},
		{"a lease port indexed to another stack", "s/web/x", "port 23080 (HTTP) is indexed to app/a HTTP at offset 0", func(tx storage.Txn) error {
			return setJSON(tx, portKey(23080), PortOwner{Port: 23080, Cockpit: "app", Stack: "a", Key: "HTTP", Offset: 0})
		}},
		{"a wrong lease count", "n/app", "counts 2 active leases, the store holds 1", func(tx storage.Txn) error {
			return setJSON(tx, leaseCountKey("app"), 2)
		}},
		{"a lease count that is not a number", "n/app", "decode n/app", func(tx storage.Txn) error {
			return tx.Set(leaseCountKey("app"), []byte("garbage")) // used to end verify, naming nothing else
		}},
		{"a cockpit naming another", "c/web", `names cockpit "app"`, func(tx storage.Txn) error {
			var m cockpitMeta
			if _, err := getJSON(tx, cockpitKey("web"), &m); err != nil {
				return err
			}
			m.Name = "app"
			return setJSON(tx, cockpitKey("web"), m)
		}},
		{"a wrong cockpit count", uidCockpitsKey(uint32(os.Getuid())), "counts 5, the store holds 2 counted cockpits made by that uid", func(tx storage.Txn) error {
			return setJSON(tx, uidCockpitsKey(uint32(os.Getuid())), 5)
		}},
		{"a missing cockpit count", uidCockpitsKey(uint32(os.Getuid())), "is missing: the store holds 2 counted cockpits made by that uid", func(tx storage.Txn) error {
			return tx.Delete(uidCockpitsKey(uint32(os.Getuid())))
		}},
		{"a stack count in a store not counted", uidStacksKey(7), "counts 5, the store holds 0 stacks made by that uid", func(tx storage.Txn) error {
			return setJSON(tx, uidStacksKey(7), 5)
		}},
		{"a wrong stack count", "c/web", "counts 0 stacks, the store holds 1", func(tx storage.Txn) error {
			var m cockpitMeta
			if _, err := getJSON(tx, cockpitKey("web"), &m); err != nil {
				return err
			}
			m.Stacks = 0
			return setJSON(tx, cockpitKey("web"), m)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := verifyStore(t)
			if err := e.db.Update(context.Background(), c.corrupt); err != nil {
				t.Fatal(err)
			}
			violations, _, err := Verify(e.db)
			if err != nil {
				t.Fatal(err)
			}
			want := c.key + ": "
			for _, v := range violations {
				if strings.HasPrefix(v, want) && strings.Contains(v, c.says) {
					return
				}
			}
			t.Fatalf("want a violation %q…%q, got:\n%s", want, c.says, strings.Join(violations, "\n"))
		})
	}
}
