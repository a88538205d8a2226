package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/cockpitfs/cockpitfs/storage"
)

// eventsKept is how many lines each events file keeps.
const eventsKept = 256

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
	var seq uint64
	if _, err := getJSON(tx, eventsSeqKey(cockpit, stack), &seq); err != nil {
		return err
	}
	e.Path, e.Message, e.Fix, e.Warning = clip(e.Path), clip(e.Message), clip(e.Fix), clip(e.Warning)
	var line bytes.Buffer
	enc := json.NewEncoder(&line)
	enc.SetEscapeHTML(false) // a fix like "echo sleep > drain/request" reads as written
	if err := enc.Encode(e); err != nil {
		return err
	}
	end, err := eventsEnd(tx, cockpit, stack) // before this line is in the window
	if err != nil {
		return err
	}
	if err := tx.Set(eventKey(cockpit, stack, seq), bytes.TrimSuffix(line.Bytes(), []byte("\n"))); err != nil {
		return err
	}
	if err := setJSON(tx, eventsEndKey(cockpit, stack), end+int64(line.Len())); err != nil {
		return err
	}
	if seq >= eventsKept {
		if err := tx.Delete(eventKey(cockpit, stack, seq-eventsKept)); err != nil {
			return err
		}
	}
	return setJSON(tx, eventsSeqKey(cockpit, stack), seq+1)
}

func deleteEvents(tx storage.Txn, cockpit, stack string) error {
	var keys []string
	if err := tx.Scan(eventsPrefix(cockpit, stack), func(k string, _ []byte) error {
		keys = append(keys, k)
		return nil
	}); err != nil {
		return err
	}
	keys = append(keys, eventsSeqKey(cockpit, stack), eventsEndKey(cockpit, stack))
	for _, k := range keys {
		if err := tx.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// eventsEnd is how many bytes were ever appended to the events file: the offset its next line
// starts at. A store written before the end was kept starts it at the window's length.
func eventsEnd(tx storage.Txn, cockpit, stack string) (int64, error) {
	var end int64
	found, err := getJSON(tx, eventsEndKey(cockpit, stack), &end)
	if err != nil || found {
		return end, err
	}
	window, err := readEvents(tx, cockpit, stack)
	return int64(len(window)), err
}

func readEvents(tx storage.Txn, cockpit, stack string) ([]byte, error) {
	var out []byte
	err := tx.Scan(eventsPrefix(cockpit, stack), func(_ string, v []byte) error {
		out = append(append(out, v...), '\n')
		return nil
	})
	return out, err
}
