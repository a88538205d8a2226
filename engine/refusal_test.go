package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
)

// A refusal code per cause: a store that fails is STATE_ROOT_UNAVAILABLE (the seeds' code for a
// store that cannot be read), a stored record that does not decode is STATE_RECORD_MALFORMED.
func TestStoreFailuresHaveTheirOwnCode(t *testing.T) {
	t.Parallel()
	db, err := kv.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := New(db)
	newCockpit(t, e, "app", exampleConfig, "s", "t")
	if err := db.Update(context.Background(), func(tx storage.Txn) error { return tx.Set(stackKey("app", "t"), []byte("{")) }); err != nil {
		t.Fatal(err)
	}
	if code := AsRefusal(claimErr(e, "app", "t", "me")).Code; code != StateRecordMalformed {
		t.Fatalf("a claim on an undecodable record: %s, want %s", code, StateRecordMalformed)
	}
	db.Close()
	err = claimErr(e, "app", "s", "me")
	if err == nil {
		t.Fatal("a claim on a closed store succeeded")
	}
	if r := AsRefusal(err); r.Code != StateRootUnavailable || r.Message == "" {
		t.Fatalf("a claim on a closed store: %+v, want %s", r, StateRootUnavailable)
	}
}

// A cockpit holds at most MaxStacks stacks, as the seeds' inventory reads at most that many.
func TestStackLimit(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "s")
	e.cockpits.begin()
	err := e.db.Update(context.Background(), func(tx storage.Txn) error {
		m, err := e.loadCockpit(tx, "app")
		if err != nil {
			return err
		}
		m.Stacks = MaxStacks // as if 1023 more had been made
		return setJSON(tx, cockpitKey("app"), m)
	})
	if err != nil {
		t.Fatal(err)
	}
	e.cockpits.end()
	err = e.CreateStack(context.Background(), me("mkdir", "app/stacks/late"), "app", "late")
	if r := AsRefusal(err); r.Code != StateInventoryLimit || !strings.Contains(r.Message, "1024") {
		t.Fatalf("the 1025th stack: %v, want %s", err, StateInventoryLimit)
	}
	if _, err := e.Stack("app", "late"); AsRefusal(err).Code != NotFound {
		t.Fatalf("the refused stack exists: %v", err)
	}
}

// A record is at most MaxRecordBytes: the claim that would grow it past that is refused and
// changes nothing.
func TestRecordByteLimit(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "s")
	long := "/" + strings.Repeat("c", 4000)
	var refused error
	n := 0
	for ; n < maxHolders && refused == nil; n++ {
		name := fmt.Sprintf("h%04d", n)
		refused = e.Claim(context.Background(), me("create", "app/stacks/s/holders/"+name), "app", "s", name, &Holder{CheckoutPath: long + "/" + name})
	}
	if r := AsRefusal(refused); refused == nil || r.Code != StateRecordTooLarge {
		t.Fatalf("after %d claims: %v, want %s", n, refused, StateRecordTooLarge)
	}
	r := stackRecord(t, e, "app", "s")
	if len(r.Value.Holders) != n-1 || len(canonicalJSON(r)) > maxRecordBytes {
		t.Fatalf("%d holders after %d claims, record of %d bytes", len(r.Value.Holders), n, len(canonicalJSON(r)))
	}
	// Refused at the bound, not before it: one more holder of that size would pass it.
	if holder := len(canonicalJSON(r.Value.Holders[0])); len(canonicalJSON(r))+holder+1 <= maxRecordBytes {
		t.Fatalf("refused at %d bytes, with room for a holder of %d", len(canonicalJSON(r)), holder)
	}
	// However large the record, no value stored reaches kv's value threshold (512 KiB), from
	// which badger keeps it in its value log, which is never reclaimed.
	if _, _, largest := storedLayout(t, e.db, "app", "s"); largest > 64<<10 {
		t.Fatalf("a value of %d bytes is stored, more than 64 KiB", largest)
	}
}

// TestAsRefusal: no error is no refusal (it once called nil.Error() and panicked); a store's
// errors each get their code.
func TestAsRefusal(t *testing.T) {
	if r := AsRefusal(nil); r != nil {
		t.Errorf("AsRefusal(nil) = %v, want nil", r)
	}
	for _, c := range []struct {
		err  error
		want Code
	}{
		{storage.ErrLocked, StateLocked},
		{malformedValue{errors.New("bad")}, StateRecordMalformed},
		{errors.New("disk gone"), StateRootUnavailable},
		{refuse(NotFound, "x", "", "no"), NotFound},
	} {
		if r := AsRefusal(c.err); r == nil || r.Code != c.want {
			t.Errorf("AsRefusal(%v) = %v, want code %s", c.err, r, c.want)
		}
	}
}
