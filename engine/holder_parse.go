package engine

import (
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cockpitfs/cockpitfs/engine/liveness"
)

// HolderAttrs is a holder write: `pid=<n>|none checkout=<absolute path>`, each optional.
type HolderAttrs struct {
	SetPID   bool
	PID      int    // with SetPID: 0 = none (untracked)
	Checkout string // "" = unchanged
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

// ParseHolderAttrs reads a holder write. Unknown keys, repeated keys and malformed values are
// refused; an empty write sets nothing.
func ParseHolderAttrs(text string) (HolderAttrs, error) {
	var a HolderAttrs
	seen := map[string]bool{}
	for _, token := range strings.Fields(text) {
		key, value, ok := strings.Cut(token, "=")
		if !ok || seen[key] {
			return a, refuse(StateRecordMalformed, "", "write pid=<n>|none and/or checkout=<absolute path>", "holder attribute %q is malformed or repeated", token)
		}
		seen[key] = true
		switch key {
		case "pid":
			a.SetPID = true
			if a.PID, ok = parsePID(value); !ok {
				return a, refuse(StateRecordMalformed, "", "write pid=<n> with a running process id, or pid=none", "pid %q is not a process id", value)
			}
		case "checkout":
			if !filepath.IsAbs(value) || strings.ContainsRune(value, 0) || len(value) > 4096 {
				return a, refuse(StateRecordMalformed, "", "write checkout=$PWD", "checkout %q is not an absolute path", value)
			}
			a.Checkout = filepath.Clean(value)
		default:
			return a, refuse(StateRecordMalformed, "", "write pid=<n>|none and/or checkout=<absolute path>", "unknown holder attribute %q", key)
		}
	}
	return a, nil
}
