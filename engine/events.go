package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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

// appendJSON appends w as json.Marshal encodes it (keys sorted), without reflection when every
// key is a window's name (TestWindowsJSONIsEncodingJSONs): every commit writes the counts.
func (w windows) appendJSON(b []byte) ([]byte, error) {
	keys := make([]string, 0, len(w))
	for k := range w {
		if !plainWindowName(k) {
			data, err := json.Marshal(w)
			return append(b, data...), err
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	sep := byte('{')
	for _, k := range keys {
		b = strconv.AppendUint(appendJSONKey(b, sep, k), w[k], 10)
		sep = ','
	}
	if sep == '{' {
		b = append(b, sep)
	}
	return append(b, '}'), nil
}

// decodeWindows is json.Unmarshal of data into a fresh windows when data is as appendJSON writes
// it (no space, keys of window names, counts as decodeInteger takes them); false leaves anything
// else to json.Unmarshal.
func decodeWindows(data []byte) (windows, bool) {
	w := windows{}
	if string(data) == "{}" {
		return w, true
	}
	if len(data) < 2 || data[0] != '{' || data[len(data)-1] != '}' {
		return nil, false
	}
	for field := range bytes.SplitSeq(data[1:len(data)-1], []byte(",")) {
		key, count, ok := bytes.Cut(field, []byte(":"))
		if !ok || len(key) < 2 || key[0] != '"' || key[len(key)-1] != '"' || !plainWindowName(string(key[1:len(key)-1])) {
			return nil, false
		}
		var n uint64
		if !decodeInteger(count, &n) {
			return nil, false
		}
		w[string(key[1:len(key)-1])] = n
	}
	return w, true
}

// plainWindowName says k is a name windowOf gives (the history's, or a uid's), which JSON
// writes as it is.
func plainWindowName(k string) bool {
	if k == historyWindow {
		return true
	}
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < '0' || k[i] > '9' {
			return false
		}
	}
	return true
}

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

// appendJSON appends h as json.Marshal encodes it, without reflection when its windows allow
// (TestEventsHeadJSONIsEncodingJSONs): every commit writes one.
func (h eventsHead) appendJSON(b []byte) ([]byte, error) {
	b = strconv.AppendUint(appendJSONKey(b, '{', "seq"), h.Seq, 10)
	b = strconv.AppendInt(appendJSONKey(b, ',', "end"), h.End, 10)
	b, err := h.Windows.appendJSON(appendJSONKey(b, ',', "windows"))
	return append(b, '}'), err
}

// decodeEventsHead reads what appendJSON writes without reflection, anything else with
// encoding/json.
func decodeEventsHead(data []byte) (eventsHead, error) {
	var h eventsHead
	rest, ok := bytes.CutPrefix(data, []byte(`{"seq":`))
	var seq, end, windowsJSON []byte
	if ok {
		seq, rest, ok = bytes.Cut(rest, []byte(`,"end":`))
	}
	if ok {
		end, rest, ok = bytes.Cut(rest, []byte(`,"windows":`))
	}
	if ok {
		windowsJSON, ok = bytes.CutSuffix(rest, []byte("}"))
	}
	if ok && decodeInteger(seq, &h.Seq) && decodeInteger(end, &h.End) {
		if h.Windows, ok = decodeWindows(windowsJSON); ok {
			return h, nil
		}
	}
	h = eventsHead{}
	if err := json.Unmarshal(data, &h); err != nil {
		return h, malformedValue{err}
	}
	if h.Windows == nil {
		h.Windows = windows{}
	}
	return h, nil
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
	h.Windows, err = loadWindows(tx, cockpit, stack, h.Seq)
	return h, err
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
	if h, err = decodeEventsHead(data); err != nil {
		return h, false, fmt.Errorf("decode %s: %w", eventsHeadKey(cockpit, stack), err)
	}
	return h, true, nil
}

// appendEventJSON appends e as encoding/json encodes it without HTML escaping, so that a fix like
// "echo sleep > drain/request" reads as written (TestEventJSONIsEncodingJSONs), without
// reflection: every commit writes one.
func appendEventJSON(b []byte, e event) []byte {
	b = appendJSONField(b, '{', "at", e.At)
	b = appendJSONField(b, ',', "op", e.Op)
	b = appendJSONField(b, ',', "path", e.Path)
	b = strconv.AppendInt(appendJSONKey(b, ',', "pid"), int64(e.PID), 10)
	b = strconv.AppendUint(appendJSONKey(b, ',', "uid"), uint64(e.UID), 10)
	b = appendJSONField(b, ',', "result", e.Result)
	for _, f := range [...]struct{ name, value string }{{"code", string(e.Code)}, {"errno", e.Errno}, {"message", e.Message}, {"fix", e.Fix}} {
		if f.value != "" {
			b = appendJSONField(b, ',', f.name, f.value)
		}
	}
	if e.Revision != nil {
		b = strconv.AppendInt(appendJSONKey(b, ',', "revision"), *e.Revision, 10)
	}
	if e.Warning != "" {
		b = appendJSONField(b, ',', "warning", e.Warning)
	}
	return append(b, '}')
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
