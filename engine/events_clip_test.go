package engine

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cockpitfs/cockpitfs/storage"
)

// A refusal quoting 64 KiB of junk leaves a line of a few hundred bytes that says how much it
// left out, so it neither evicts its neighbours nor reaches badger's value log.
func TestEventQuotingHugeInputIsClipped(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "one")
	junk := strings.Repeat("\x01é", 32<<10)
	r := &Refusal{Code: StateRecordMalformed, Message: "cannot parse " + junk, Fix: "write pid=<n>"}
	if err := e.LogRefusal(me("write", "app/stacks/one/holders/me"), "app", "one", r, "EINVAL", 0); err != nil {
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
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	ctx := context.Background()
	stranger := Caller{UID: 7, Op: "write", Path: "app/stacks/main/x"}
	refusal := &Refusal{Code: UndefinedName, Message: "no"}
	for range 40 {
		if err := e.LogRefusal(stranger, "app", "main", refusal, "EPERM", 0); err != nil {
			t.Fatal(err)
		}
	}
	claim(t, e, "app", "main", "alice")
	// Make it old: its sequence and end in keys of their own, no window counts, no index.
	legacyEvents(t, e, "app", "main", false)
	if err := e.db.Update(ctx, func(tx storage.Txn) error {
		var keys []string
		if err := tx.Scan(eventsIndexPrefix("app", "main"), func(k string, _ []byte) error {
			keys = append(keys, k)
			return nil
		}); err != nil {
			return err
		}
		return deleteKeys(tx, keys)
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
	if err := e.LogRefusal(stranger, "app", "main", refusal, "EPERM", 0); err != nil {
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

// legacyEvents rewrites the head of an events file as the versions before eventsHead kept it:
// its sequence, its end and (withWindows) its window counts in a key each.
func legacyEvents(t *testing.T, e *Engine, cockpit, stack string, withWindows bool) {
	t.Helper()
	if err := e.db.Update(context.Background(), func(tx storage.Txn) error {
		h, found, err := readEventsHead(tx, cockpit, stack)
		if err != nil || !found {
			t.Fatalf("no head to make old: %v", err)
		}
		if err := setJSON(tx, eventsSeqKey(cockpit, stack), h.Seq); err != nil {
			return err
		}
		if err := setJSON(tx, eventsEndKey(cockpit, stack), h.End); err != nil {
			return err
		}
		if withWindows {
			if err := setJSON(tx, eventsWindowsKey(cockpit, stack), h.Windows); err != nil {
				return err
			}
		}
		return tx.Delete(eventsHeadKey(cockpit, stack))
	}); err != nil {
		t.Fatal(err)
	}
}

// An events file whose sequence, end and window counts an earlier version kept in three keys
// reads the same, and its next line goes on from them into one head, the three keys gone.
func TestEventsHeadOfAnOldFile(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	claim(t, e, "app", "main", "alice")
	claim(t, e, "app", "main", "bob")
	window, start, seqs, err := e.EventsWindow("app", "main")
	if err != nil {
		t.Fatal(err)
	}
	legacyEvents(t, e, "app", "main", true)
	oldWindow, oldStart, oldSeqs, err := e.EventsWindow("app", "main")
	if err != nil || !bytes.Equal(oldWindow, window) || oldStart != start || !slices.Equal(oldSeqs, seqs) {
		t.Fatalf("the old file reads %q from %d, seqs %v (%v); want %q from %d, %v", oldWindow, oldStart, oldSeqs, err, window, start, seqs)
	}
	claim(t, e, "app", "main", "carol")
	after, afterStart, afterSeqs, err := e.EventsWindow("app", "main")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(after, window) || afterStart != start || !slices.Equal(afterSeqs, append(seqs, seqs[len(seqs)-1]+1)) {
		t.Fatalf("after the next line: %q from %d, seqs %v; want %q and one more line from %d", after, afterStart, afterSeqs, window, start)
	}
	if err := e.db.View(func(tx storage.Txn) error {
		h, found, err := readEventsHead(tx, "app", "main")
		if err != nil || !found || h.Seq != afterSeqs[len(afterSeqs)-1]+1 || h.End != start+int64(len(after)) || h.Windows[historyWindow] != uint64(len(afterSeqs)) {
			t.Errorf("head %+v found=%v (%v); want seq %d, end %d, %d lines in the history", h, found, err, afterSeqs[len(afterSeqs)-1]+1, start+int64(len(after)), len(afterSeqs))
		}
		for _, k := range legacyEventsKeys("app", "main") {
			if _, err := tx.Get(k); !errors.Is(err, storage.ErrNotFound) {
				t.Errorf("%s is still there (%v)", k, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// An old file's end key is read with the head's range check: an end no appends reach is damage,
// as in a head (TestEventsHeadOutOfRangeIsDamage), and the file is refused, not served.
func TestLegacyEventsEndOutOfRangeIsDamage(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "main")
	claim(t, e, "app", "main", "alice")
	legacyEvents(t, e, "app", "main", false)
	for _, end := range []int64{-1, maxEventsCount + 1} {
		if err := e.db.Update(context.Background(), func(tx storage.Txn) error {
			return setJSON(tx, eventsEndKey("app", "main"), end)
		}); err != nil {
			t.Fatal(err)
		}
		var malformed malformedValue
		if _, _, _, err := e.EventsWindow("app", "main"); !errors.As(err, &malformed) {
			t.Fatalf("end %d: events read with err %v, want it refused as damage", end, err)
		}
	}
}
