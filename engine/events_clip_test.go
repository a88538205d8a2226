package engine

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage"
)

// A refusal quoting 64 KiB of junk leaves a line of a few hundred bytes that says how much it
// left out, so it neither evicts its neighbours nor reaches badger's value log.
func TestEventQuotingHugeInputIsClipped(t *testing.T) {
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "one")
	junk := strings.Repeat("\x01é", 32<<10)
	r := &Refusal{Code: StateRecordMalformed, Message: "cannot parse " + junk, Fix: "write pid=<n>"}
	if err := e.LogRefusal(me("write", "app/stacks/one/holders/me"), "app", "one", r, "EINVAL"); err != nil {
		t.Fatal(err)
	}
	events, err := e.events("app", "one")
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(events), []byte("\n"))
	last := string(lines[len(lines)-1])
	if len(last) > 3000 || !strings.Contains(last, "bytes more)") || !strings.Contains(last, `"fix":"write pid=<n>"`) {
		t.Fatalf("want a clipped line of at most 3000 bytes naming what it left out, got %d bytes:\n%.600s", len(last), last)
	}
	if !strings.Contains(last, `"code":"STATE_RECORD_MALFORMED"`) || !strings.Contains(last, `"errno":"EINVAL"`) {
		t.Errorf("the clipped line lost its code or errno: %.600s", last)
	}
}

// An events file written before lines had windows has lines but no window counts: the next line
// indexes them by what each records and cuts each window to its bound — a uid's 40 refusals to
// its last 32 — keeping every change; windows then slide as usual.
func TestEventsWindowsOfAnOldFile(t *testing.T) {
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	ctx := context.Background()
	stranger := Caller{UID: 7, Op: "write", Path: "app/stacks/main/x"}
	refusal := &Refusal{Code: UndefinedName, Message: "no"}
	for range 40 {
		if err := e.LogRefusal(stranger, "app", "main", refusal, "EPERM"); err != nil {
			t.Fatal(err)
		}
	}
	claim(t, e, "app", "main", "alice")
	// Make it old: no window counts, no index.
	if err := e.db.Update(ctx, func(tx storage.Txn) error {
		var keys []string
		if err := tx.Scan(eventsIndexPrefix("app", "main"), func(k string, _ []byte) error {
			keys = append(keys, k)
			return nil
		}); err != nil {
			return err
		}
		for _, k := range append(keys, eventsWindowsKey("app", "main")) {
			if err := tx.Delete(k); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The oldest 8 refusals were cut when the file was last written (it had windows); put two
	// lines of that era back to see the migration cut them: 34 refusals of uid 7 then.
	if err := e.db.Update(ctx, func(tx storage.Txn) error {
		for seq := range uint64(2) {
			if err := tx.Set(eventKey("app", "main", seq), []byte(`{"result":"refused","uid":7,"path":"old"}`)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.LogRefusal(stranger, "app", "main", refusal, "EPERM"); err != nil {
		t.Fatal(err)
	}
	evs := eventLines(t, e, "app", "main")
	refused, changes := 0, 0
	for _, ev := range evs {
		switch {
		case ev.Path == "old":
			t.Fatalf("a line past uid 7's window survived the migration: %+v", ev)
		case ev.Result == "refused":
			refused++
		default:
			changes++
		}
	}
	if refused != refusalsKept || changes != 1 {
		t.Fatalf("after the migration: %d refusals, %d changes; want %d and 1", refused, changes, refusalsKept)
	}
}
