package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage"
)

// storedLayout reads what the store holds for a stack: how many holders its head keeps inline, how
// many keys of their own, and the largest value of the two.
func storedLayout(t *testing.T, db storage.Store, cockpit, stack string) (inline, keyed, largest int) {
	t.Helper()
	err := db.View(func(tx storage.Txn) error {
		head, err := tx.Get(stackKey(cockpit, stack))
		if err != nil {
			return err
		}
		var raw struct {
			Value struct {
				Holders []json.RawMessage `json:"holders"`
			} `json:"value"`
		}
		if err := json.Unmarshal(head, &raw); err != nil {
			return err
		}
		inline, largest = len(raw.Value.Holders), len(head)
		return tx.Scan(holdersPrefix(cockpit, stack), func(_ string, v []byte) error {
			keyed++
			largest = max(largest, len(v))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return inline, keyed, largest
}

func requireVerified(t *testing.T, db storage.Store) {
	t.Helper()
	violations, _, err := Verify(db)
	if err != nil || len(violations) > 0 {
		t.Fatalf("verify: %v\n%s", err, strings.Join(violations, "\n"))
	}
}

// A stack's holders each have a key of their own; its key holds the rest of the record.
func TestHoldersStoredUnderTheirOwnKeys(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "s")
	for _, name := range []string{"alice", "bob", "carol"} {
		claim(t, e, "app", "s", name)
	}
	if err := e.Release(t.Context(), me("unlink", "app/stacks/s/holders/bob"), "app", "s", "bob"); err != nil {
		t.Fatal(err)
	}
	if inline, keyed, _ := storedLayout(t, e.db, "app", "s"); inline != 0 || keyed != 2 {
		t.Fatalf("%d holders inline and %d under keys, want 0 and 2", inline, keyed)
	}
	// A reader without the cache (a restarted daemon) assembles the same record.
	want := stackRecord(t, e, "app", "s")
	if got := stackRecord(t, New(e.db), "app", "s"); !reflect.DeepEqual(got, want) {
		t.Fatalf("read back:\n%+v\nwant\n%+v", got, want)
	}
	requireVerified(t, e.db)
}

// A record written before holders had keys of their own keeps them all in the stack's key. It
// reads the same, and each commit on the stack moves migrateBatch of them to their own keys.
func TestInlineHoldersMigrate(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "s")
	n := 2*migrateBatch + 10
	for i := range n {
		claim(t, e, "app", "s", fmt.Sprintf("h%03d", i))
	}
	want := stackRecord(t, e, "app", "s")
	// As the previous version wrote it: the whole record, holders included, under the stack's key.
	err := e.db.Update(t.Context(), func(tx storage.Txn) error {
		var keys []string
		if err := tx.Scan(holdersPrefix("app", "s"), func(k string, _ []byte) error { keys = append(keys, k); return nil }); err != nil {
			return err
		}
		for _, k := range keys {
			if err := tx.Delete(k); err != nil {
				return err
			}
		}
		return setJSON(tx, stackKey("app", "s"), want)
	})
	if err != nil {
		t.Fatal(err)
	}
	e = New(e.db) // restarted: nothing cached
	if got := stackRecord(t, e, "app", "s"); !reflect.DeepEqual(got, want) {
		t.Fatalf("the old record reads differently: %d holders, revision %d; want %d, %d", len(got.Value.Holders), got.Revision, len(want.Value.Holders), want.Revision)
	}
	requireVerified(t, e.db)
	for step, wantInline := range []int{n, n - migrateBatch, n - 2*migrateBatch, 0, 0, 0} {
		inline, keyed, _ := storedLayout(t, e.db, "app", "s")
		if inline != wantInline || inline+keyed != len(stackRecord(t, e, "app", "s").Value.Holders) {
			t.Fatalf("after %d commits: %d holders inline, %d under keys; want %d inline", step, inline, keyed, wantInline)
		}
		requireVerified(t, e.db)
		if step%2 == 0 {
			claim(t, e, "app", "s", "new")
		} else if err := e.Release(t.Context(), me("unlink", "app/stacks/s/holders/new"), "app", "s", "new"); err != nil {
			t.Fatal(err)
		}
	}
	// Every holder is still there, unchanged.
	got := stackRecord(t, New(e.db), "app", "s")
	if !reflect.DeepEqual(got.Value.Holders, want.Value.Holders) {
		t.Fatalf("%d holders after the migration differ from the %d before", len(got.Value.Holders), len(want.Value.Holders))
	}
}

// Verify names a holder's key that no stack has, or that holds another holder, and a holder
// stored both inline and under its key.
func TestVerifyNamesKeyDamage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, key, says string
		corrupt         func(tx storage.Txn, h Holder) error
	}{
		{"a holder of no stack", "h/app/gone/", "a holder of stack app/gone, which does not exist", func(tx storage.Txn, h Holder) error {
			return setJSON(tx, holderKey("app", "gone", h.HolderID), h)
		}},
		{"a key holding another holder", "s/app/s", "holds holder", func(tx storage.Txn, h Holder) error {
			other := h
			other.Name = "other"
			other.HolderID = holderID("other")
			return setJSON(tx, holderKey("app", "s", h.HolderID), other)
		}},
		{"declared values of no stack", "d/app/gone", "declared values of stack app/gone, which does not exist", func(tx storage.Txn, _ Holder) error {
			return setJSON(tx, declaredValuesKey("app", "gone"), DeclaredValues{Text: "WEB=http://x/\n", Values: map[string]string{"WEB": "http://x/"}})
		}},
		{"declared values not their text's", "d/app/s", "do not parse from the text", func(tx storage.Txn, _ Holder) error {
			return setJSON(tx, declaredValuesKey("app", "s"), DeclaredValues{Text: "WEB=http://x/\n", Values: map[string]string{"WEB": "http://y/"}})
		}},
		{"a holder both inline and under its key", "s/app/s", "stored both in the record and under its own key", func(tx storage.Txn, h Holder) error {
			r, err := assembleRecord(tx, stackKey("app", "s"), mustGet(tx, stackKey("app", "s")))
			if err != nil {
				return err
			}
			return setJSON(tx, stackKey("app", "s"), r.Record)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEngine(t)
			newCockpit(t, e, "app", exampleConfig, "s")
			claim(t, e, "app", "s", "alice")
			h, _ := stackRecord(t, e, "app", "s").Value.Holder("alice")
			if err := e.db.Update(t.Context(), func(tx storage.Txn) error { return c.corrupt(tx, h) }); err != nil {
				t.Fatal(err)
			}
			violations, _, err := Verify(e.db)
			if err != nil {
				t.Fatal(err)
			}
			if len(violations) != 1 || !strings.HasPrefix(violations[0], c.key) || !strings.Contains(violations[0], c.says) {
				t.Fatalf("violations %q, want one on %s saying %q", violations, c.key, c.says)
			}
		})
	}
}

func mustGet(tx storage.Txn, key string) []byte {
	v, err := tx.Get(key)
	if err != nil {
		panic(err)
	}
	return v
}

// A commit checks the holders it changes and trusts those it keeps as the record it follows held
// them; their order, count and the rest of the record it checks whole.
func TestCheckTrustsOnlyUnchangedHolders(t *testing.T) {
	r := validRecord()
	bad := r
	bad.Value.Holders = slices.Clone(r.Value.Holders)
	bad.Value.Holders[0].ClaimedAt = "yesterday"
	if err := check(bad, r.Value); err == nil || !strings.Contains(err.Error(), "claimedAt") {
		t.Fatalf("a changed holder went unchecked: %v", err)
	}
	// The same holder, unchanged since a check passed it, is not checked again.
	if err := check(bad, bad.Value); err != nil {
		t.Fatalf("an unchanged holder was checked again: %v", err)
	}
	unsorted := r
	unsorted.Value.Holders = []Holder{r.Value.Holders[1], r.Value.Holders[0]}
	if err := check(unsorted, r.Value); err == nil || !strings.Contains(err.Error(), "not unique and sorted") {
		t.Fatalf("holders out of order went unchecked: %v", err)
	}
	released := r
	released.Value.LastReleasedHolder = &r.Value.Holders[1].HolderID
	if err := check(released, r.Value); err == nil || !strings.Contains(err.Error(), "still a holder") {
		t.Fatalf("a released holder still holding went unchecked: %v", err)
	}
}

// A lease is trusted only when the next record keeps the very lease the checked one had: an equal
// but new lease (every step that changes a lease makes a new one) is checked again.
func TestCheckTrustsOnlyTheSameLease(t *testing.T) {
	checked := validRecord()
	kept := checked
	if err := check(kept, checked.Value); err != nil {
		t.Fatalf("the checked record itself: %v", err)
	}
	moved := *checked.Value.Lease
	moved.Offset++ // no family of the declaration starts there
	bad := checked
	bad.Value.Lease = &moved
	if err := check(bad, checked.Value); err == nil || !strings.Contains(err.Error(), "lease") {
		t.Fatalf("a new lease went unchecked: %v", err)
	}
	if err := check(bad, bad.Value); err != nil {
		t.Fatalf("the same lease, already checked, was checked again: %v", err)
	}
}

// The first commit on a record read from the store checks every holder: a holder damaged on disk
// (or by a bug) refuses the commit instead of being carried on.
func TestFirstCommitAfterReadChecksEveryHolder(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "s")
	claim(t, e, "app", "s", "alice")
	h, _ := stackRecord(t, e, "app", "s").Value.Holder("alice")
	h.ClaimedAt = "yesterday"
	if err := e.db.Update(t.Context(), func(tx storage.Txn) error { return setJSON(tx, holderKey("app", "s", h.HolderID), h) }); err != nil {
		t.Fatal(err)
	}
	e = New(e.db)
	before, err := e.Stack("app", "s")
	if err != nil {
		t.Fatal(err)
	}
	requireCode(t, claimErr(e, "app", "s", "bob"), StateRecordMalformed)
	if after, _ := e.Stack("app", "s"); after.Revision != before.Revision || len(after.Value.Holders) != 1 {
		t.Fatalf("the refused claim changed the stack: revision %d → %d, %d holders", before.Revision, after.Revision, len(after.Value.Holders))
	}
}

// The index check compares an entry's bytes with appendPortOwnerJSON's instead of decoding it, so
// for the names a cockpit can have the two must agree byte for byte; where they do not (a name
// json.Marshal escapes), the check decodes the entry as before.
func TestPortOwnerJSON(t *testing.T) {
	for _, o := range []PortOwner{
		{Port: 0, Cockpit: "a", Stack: "b", Key: "HTTP", Offset: 0},
		{Port: 65535, Cockpit: "my-app_2.x", Stack: "feature.login-fix", Key: "DB_PORT", Offset: 190},
		{Port: 8080, Cockpit: "c", Stack: "s", Key: "API", Offset: -1},
		// Names no cockpit or stack can have, escaped as json.Marshal escapes them: setJSON
		// writes every entry this way.
		{Port: 1, Cockpit: "a<b&c>", Stack: "é", Key: "q\"t\\", Offset: 2},
		{Port: 2, Cockpit: "tab\there", Stack: "<\u2028>", Key: "\x7f&", Offset: 3},
	} {
		want, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendPortOwnerJSON(nil, o); string(got) != string(want) {
			t.Errorf("appendPortOwnerJSON(%+v) = %s, json.Marshal: %s", o, got, want)
		}
		// The names JSON escapes are left to json.Unmarshal; every other entry decodes.
		names := o.Cockpit + o.Stack + o.Key
		plain := plainJSONString([]byte(names)) && !strings.ContainsAny(names, "<>&")
		if got, ok := decodePortOwner(want); ok && got != o || !ok && plain {
			t.Errorf("decodePortOwner(%s) = %+v, %v; want %+v", want, got, ok, o)
		}
	}
	// A claim decodes every occupied family's entry without reflection where it can; what it
	// takes, it takes as json.Unmarshal does, and anything else it leaves to it.
	for _, in := range []string{
		`{"port":1,"cockpit":"a","stack":"b","key":"K","offset":0}`,
		`{"port":1,"cockpit":"a\"b","stack":"b","key":"K","offset":0}`,
		`{"port":1,"cockpit":"a<b","stack":"b","key":"K","offset":0}`,
		`{"port":1,"cockpit":"a","stack":"b","key":"K","offset":0,"x":1}`,
		`{"cockpit":"a","port":1,"stack":"b","key":"K","offset":0}`,
		`{"port":01,"cockpit":"a","stack":"b","key":"K","offset":0}`,
		`{"port":1,"cockpit":"a","stack":"b","key":"K","offset":1.5}`,
		`{"port":1,"cockpit":"é","stack":"b","key":"K","offset":0}`,
		`{"port":1,"cockpit":"a","stack":"b","key":"K","offset":0}}`,
		"{\"port\":1,\"cockpit\":\"a\tb\",\"stack\":\"b\",\"key\":\"K\",\"offset\":0}",
	} {
		var slow PortOwner
		jsonErr := json.Unmarshal([]byte(in), &slow)
		if fast, ok := decodePortOwner([]byte(in)); ok && (jsonErr != nil || fast != slow) {
			t.Errorf("decodePortOwner(%s) = %+v; json.Unmarshal: %+v, %v", in, fast, slow, jsonErr)
		}
	}
	for _, port := range []int{0, 7, 80, 443, 5432, 10000, 65535} {
		if got, want := portKey(port), fmt.Sprintf("%s%05d", portsPrefix, port); got != want {
			t.Errorf("portKey(%d) = %q, want %q", port, got, want)
		}
	}
}

// A claim reads the owner of every port it passes from the port index: plain entries without
// decoding them, any other (escaped names) decoded, its own stack's as free, a malformed entry as
// an error.
func TestPortOwnerReadsIndexEntries(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	entries := map[int]string{
		1: `{"port":1,"cockpit":"app","stack":"other","key":"HTTP","offset":0}`,
		2: `{"port":2,"cockpit":"a\u003cb","stack":"s\"t","key":"HTTP","offset":0}`,
		3: `{"port":3,"cockpit":"app","stack":"s","key":"HTTP","offset":0}`,
		4: `{"port":4,"cockpit":"app\u0073","stack":"s","key":"HTTP","offset":0}`,
		5: `{"port":`,
	}
	if err := e.db.Update(context.Background(), func(tx storage.Txn) error {
		for port, entry := range entries {
			if err := tx.Set(portKey(port), []byte(entry)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := map[int]string{1: "app/other", 2: `a<b/s"t`, 3: "", 4: "apps/s", 6: ""}
	if err := e.db.View(func(tx storage.Txn) error {
		reads := txReads{e: e, tx: tx, cockpitName: "app", stack: "s"}
		for port, owner := range want {
			if got, err := reads.portOwner(port); err != nil || got != owner {
				t.Errorf("portOwner(%d) = %q, %v; want %q", port, got, err, owner)
			}
		}
		if got, err := reads.portOwner(5); !errors.As(err, new(malformedValue)) {
			t.Errorf("portOwner(5) of a malformed entry = %q, %v; want a malformed value", got, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
