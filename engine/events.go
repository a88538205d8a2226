package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/cockpitfs/cockpitfs/storage"
)

// eventsKept is how many lines of changes each events file keeps: every line but refusals.
const eventsKept = 256

// refusalsKept is how many refusal lines each events file keeps of each uid. Refusals have
// windows of their own, one per uid, so that no user's refused operations (anyone may try to
// change anything) can scroll another's history, or another's refusals, out of the file.
const refusalsKept = 32

// The windows of an events file: its changes, and each uid's refusals. A line belongs to the
// window of what it records; appending past a window's bound removes that window's oldest line,
// wherever it is in the file.
const historyWindow = "h"

// windowOf names the window of e: the history's, or its uid's refusals'.
func windowOf(e event) string {
	if e.Result == "refused" {
		return strconv.FormatUint(uint64(e.UID), 10)
	}
	return historyWindow
}

// keptIn is how many lines window keeps.
func keptIn(window string) uint64 {
	if window == historyWindow {
		return eventsKept
	}
	return refusalsKept
}

// windows counts, for each window of an events file, the lines ever appended to it: the number
// of its next line, under which the line's seq is indexed (see eventsIndexKey).
type windows map[string]uint64

// event is one line of an events file.
type event struct {
	At       string `json:"at"`
	Op       string `json:"op"`
	Path     string `json:"path"`
	PID      int    `json:"pid"`
	UID      uint32 `json:"uid"`
	Result   string `json:"result"`
	Code     Code   `json:"code,omitempty"`
	Errno    string `json:"errno,omitempty"`
	Message  string `json:"message,omitempty"`
	Fix      string `json:"fix,omitempty"`
	Unshown  int    `json:"unshown,omitempty"` // its uid's refusals before it with no line of their own (fs's eventBudget)
	Revision *int64 `json:"revision,omitempty"`
	Warning  string `json:"warning,omitempty"`
}

// maxEventText bounds each text of an events line. A refusal may quote what was written (64 KiB
// of junk, escaped into ≈320 KB of JSON): unclipped, one such line would push its neighbours out
// of the file's window, and a value that large goes to badger's value log, which is never
// reclaimed.
const maxEventText = 400

// clip cuts s to maxEventText bytes at a character boundary and says how much it left out.
func clip(s string) string {
	if len(s) <= maxEventText {
		return s
	}
	cut := maxEventText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…(%d bytes more)", s[:cut], len(s)-cut)
}

func okEvent(c Caller, now time.Time, revision int64) event {
	return event{At: stamp(now), Op: c.Op, Path: c.Path, PID: c.PID, UID: c.UID, Result: "ok", Revision: &revision}
}

// appendEvent adds e to the log of (cockpit, stack) inside tx, so a change and its line commit
// together; stack is cockpitLevel for the cockpit's own log.
func appendEvent(tx storage.Txn, cockpit, stack string, e event) error {
	head, err := loadEventsHead(tx, cockpit, stack)
	if err != nil {
		return err
	}
	e.Path, e.Message, e.Fix, e.Warning = clip(e.Path), clip(e.Message), clip(e.Fix), clip(e.Warning)
	// PrintableJSON: a path or message with a C1 control (a name refused for it) reaches no
	// terminal that follows the file.
	line := PrintableJSON(appendEventJSON(make([]byte, 0, 256), e))
	seq := head.Seq
	if err := tx.Set(eventKey(cockpit, stack, seq), line); err != nil {
		return err
	}
	window := windowOf(e)
	kept := keptIn(window)
	n := head.Windows[window]
	if err := setJSON(tx, eventsIndexKey(cockpit, stack, window, n), seq); err != nil {
		return err
	}
	if n >= kept {
		if err := dropIndexed(tx, cockpit, stack, window, n-kept); err != nil {
			return err
		}
	}
	head.Windows[window] = n + 1
	head.Seq = seq + 1
	head.End += int64(len(line)) + 1 // and its newline
	data, err := head.appendJSON(make([]byte, 0, 64))
	if err != nil {
		return err
	}
	if err := tx.Set(eventsHeadKey(cockpit, stack), data); err != nil {
		return err
	}
	if head.legacy {
		return deleteKeys(tx, legacyEventsKeys(cockpit, stack))
	}
	return nil
}

// eventsHead is what an events file's next append needs, in one key: the seq of its next line,
// how many bytes were ever appended to it (the offset its next line starts at), and its windows'
// counts. (Stores written before it kept the three in a key each: legacy.)
type eventsHead struct {
	Seq     uint64  `json:"seq"`
	End     int64   `json:"end"`
	Windows windows `json:"windows"`
	legacy  bool
}

// loadEventsHead reads the head of the events file of (cockpit, stack); a file written before
// heads were kept has its three keys read (and, written before windows were kept, its lines
// indexed), for appendEvent to replace with a head.
func loadEventsHead(tx storage.Txn, cockpit, stack string) (eventsHead, error) {
	h, found, err := readEventsHead(tx, cockpit, stack)
	if err != nil || found {
		return h, err
	}
	h.legacy = true
	if _, err := getJSON(tx, eventsSeqKey(cockpit, stack), &h.Seq); err != nil {
		return h, err
	}
	if h.End, err = legacyEventsEnd(tx, cockpit, stack); err != nil { // before the next line is in the window
		return h, err
	}
	if h.Windows, err = loadWindows(tx, cockpit, stack, h.Seq); err != nil {
		return h, err
	}
	if err := h.check(); err != nil {
		return h, fmt.Errorf("decode %s: %w", eventsSeqKey(cockpit, stack), err)
	}
	return h, nil
}

// readEventsHead reads the head key alone: found is false for a file written before heads were
// kept, or with no line yet.
func readEventsHead(tx storage.Txn, cockpit, stack string) (h eventsHead, found bool, err error) {
	data, err := tx.Get(eventsHeadKey(cockpit, stack))
	if errors.Is(err, storage.ErrNotFound) {
		return h, false, nil
	}
	if err != nil {
		return h, false, err
	}
	if h, err = decodeEventsHead(data); err == nil {
		err = h.check()
	}
	if err != nil {
		return eventsHead{}, false, fmt.Errorf("decode %s: %w", eventsHeadKey(cockpit, stack), err)
	}
	return h, true, nil
}

// maxEventsCount bounds an events head's numbers: far past what appends reach (2^53 bytes, at a
// line a microsecond for centuries), and far enough from the integers' own limits that an
// append, and a reader's offset into the file (its start plus a read's offset), never wraps.
// A shared store's values are anyone's input: an end at the limit made every offset wrap, and a
// reader of the file (cat, tail) was served its lines again forever.
const maxEventsCount = 1 << 53

// check refuses a head whose numbers no appends reach (see maxEventsCount) as damage.
func (h eventsHead) check() error {
	if h.End < 0 || h.End > maxEventsCount || h.Seq > maxEventsCount {
		return malformedValue{fmt.Errorf("seq %d, end %d: out of range", h.Seq, h.End)}
	}
	for w, n := range h.Windows {
		if n > maxEventsCount {
			return malformedValue{fmt.Errorf("window %q counts %d lines: out of range", w, n)}
		}
	}
	return nil
}

// dropIndexed removes the line indexed n in window, and its index entry.
func dropIndexed(tx storage.Txn, cockpit, stack, window string, n uint64) error {
	var seq uint64
	indexed, err := getJSON(tx, eventsIndexKey(cockpit, stack, window, n), &seq)
	if err != nil || !indexed {
		return err
	}
	if err := tx.Delete(eventKey(cockpit, stack, seq)); err != nil {
		return err
	}
	return tx.Delete(eventsIndexKey(cockpit, stack, window, n))
}

// loadWindows reads the window counts of an events file whose next line is seq. A file written
// before lines had windows has lines but no counts: its lines are indexed now, by what each
// records, and each window cut to its bound.
func loadWindows(tx storage.Txn, cockpit, stack string, seq uint64) (windows, error) {
	counts := windows{}
	found, err := getJSON(tx, eventsWindowsKey(cockpit, stack), &counts)
	if err != nil || found || seq == 0 {
		return counts, err
	}
	byWindow := map[string][]uint64{}
	if err := tx.Scan(eventsPrefix(cockpit, stack), func(k string, v []byte) error {
		var e event
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("decode %s: %w", k, malformedValue{err})
		}
		lineSeq, err := strconv.ParseUint(k[len(eventsPrefix(cockpit, stack)):], 16, 64)
		if err != nil {
			return fmt.Errorf("decode %s: %w", k, malformedValue{err})
		}
		window := windowOf(e)
		byWindow[window] = append(byWindow[window], lineSeq)
		return nil
	}); err != nil {
		return nil, err
	}
	for window, seqs := range byWindow {
		for len(seqs) > int(keptIn(window)) {
			if err := tx.Delete(eventKey(cockpit, stack, seqs[0])); err != nil {
				return nil, err
			}
			seqs = seqs[1:]
		}
		for i, s := range seqs {
			if err := setJSON(tx, eventsIndexKey(cockpit, stack, window, uint64(i)), s); err != nil {
				return nil, err
			}
		}
		counts[window] = uint64(len(seqs))
	}
	return counts, nil
}

func deleteEvents(tx storage.Txn, cockpit, stack string) error {
	var keys []string
	if err := tx.Scan(eventsPrefix(cockpit, stack), func(k string, _ []byte) error {
		keys = append(keys, k)
		return nil
	}); err != nil {
		return err
	}
	if err := tx.Scan(eventsIndexPrefix(cockpit, stack), func(k string, _ []byte) error {
		keys = append(keys, k)
		return nil
	}); err != nil {
		return err
	}
	keys = append(append(keys, eventsHeadKey(cockpit, stack)), legacyEventsKeys(cockpit, stack)...)
	return deleteKeys(tx, keys)
}

func deleteKeys(tx storage.Txn, keys []string) error {
	for _, k := range keys {
		if err := tx.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// legacyEventsKeys are the keys an events file's head was kept in before eventsHead.
func legacyEventsKeys(cockpit, stack string) []string {
	return []string{eventsSeqKey(cockpit, stack), eventsEndKey(cockpit, stack), eventsWindowsKey(cockpit, stack)}
}

// eventsEnd is how many bytes were ever appended to the events file: the offset its next line
// starts at.
func eventsEnd(tx storage.Txn, cockpit, stack string) (int64, error) {
	h, found, err := readEventsHead(tx, cockpit, stack)
	if err != nil || found {
		return h.End, err
	}
	return legacyEventsEnd(tx, cockpit, stack)
}

// legacyEventsEnd is eventsEnd of a file written before heads were kept; one written before the
// end was kept starts it at the window's length.
func legacyEventsEnd(tx storage.Txn, cockpit, stack string) (int64, error) {
	var end int64
	found, err := getJSON(tx, eventsEndKey(cockpit, stack), &end)
	if err == nil && found {
		if bad := (eventsHead{End: end}).check(); bad != nil {
			err = fmt.Errorf("decode %s: %w", eventsEndKey(cockpit, stack), bad)
		}
	}
	if err != nil || found {
		return end, err
	}
	window, err := readEvents(tx, cockpit, stack)
	return int64(len(window)), err
}

// readEventLines is readEvents with each line's seq.
func readEventLines(tx storage.Txn, cockpit, stack string) ([]byte, []uint64, error) {
	var out []byte
	var seqs []uint64
	prefix := eventsPrefix(cockpit, stack)
	err := tx.Scan(prefix, func(k string, v []byte) error {
		seq, err := strconv.ParseUint(k[len(prefix):], 16, 64)
		if err != nil {
			return fmt.Errorf("decode %s: %w", k, malformedValue{err})
		}
		out = append(append(out, v...), '\n')
		seqs = append(seqs, seq)
		return nil
	})
	return out, seqs, err
}

func readEvents(tx storage.Txn, cockpit, stack string) ([]byte, error) {
	var out []byte
	err := tx.Scan(eventsPrefix(cockpit, stack), func(_ string, v []byte) error {
		out = append(append(out, v...), '\n')
		return nil
	})
	return out, err
}
