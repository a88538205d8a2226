package engine

import (
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cockpitfs/cockpitfs/engine/liveness"
)

// holderWrite is a write to a holder file, `pid=<n>|none checkout=<absolute path>`, each optional:
// the Holder fields it names. Its pid's process start is observed before the transaction.
type holderWrite struct {
	Holder       // Name; PID (0 = none) and ProcessStart when setsPID; CheckoutPath unless ""
	setsPID bool // pid= was written
	// createdHere: the write comes through the open that created the holder, the only one that
	// may still choose its checkout.
	createdHere bool
}

// parsePID reads the value of a pid=<n>|none attribute: "none" is 0, anything else a process id
// written in canonical decimal.
func parsePID(value string) (int, bool) {
	if value == "none" {
		return 0, true
	}
	pid, err := strconv.Atoi(value)
	return pid, err == nil && liveness.ValidPID(pid) && strconv.Itoa(pid) == value
}

// parseHolderWrite reads a write to holder name's file. Unknown keys, repeated keys and malformed
// values are refused; an empty write sets nothing.
func parseHolderWrite(name, text string) (holderWrite, error) {
	w := holderWrite{Holder: Holder{Name: name}}
	seen := map[string]bool{}
	for _, token := range strings.Fields(text) {
		key, value, ok := strings.Cut(token, "=")
		if !ok || seen[key] {
			return w, refuse(StateRecordMalformed, "", "write pid=<n>|none and/or checkout=<absolute path>", "holder attribute %q is malformed or repeated", token)
		}
		seen[key] = true
		switch key {
		case "pid":
			w.setsPID = true
			if w.PID, ok = parsePID(value); !ok {
				return w, refuse(StateRecordMalformed, "", "write pid=<n> with a running process id, or pid=none", "pid %q is not a process id", value)
			}
		case "checkout":
			if !filepath.IsAbs(value) || strings.ContainsRune(value, 0) || len(value) > 4096 {
				return w, refuse(StateRecordMalformed, "", "write checkout=$PWD", "checkout %q is not an absolute path", value)
			}
			w.CheckoutPath = filepath.Clean(value)
		default:
			return w, refuse(StateRecordMalformed, "", "write pid=<n>|none and/or checkout=<absolute path>", "unknown holder attribute %q", key)
		}
	}
	return w, nil
}
