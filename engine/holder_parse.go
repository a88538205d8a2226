package engine

import (
	"path/filepath"
	"strconv"
	"strings"
)

// HolderAttrs is a holder write: `pid=<n>|none checkout=<absolute path>`, each optional.
type HolderAttrs struct {
	SetPID   bool
	PID      int    // with SetPID: 0 = none (untracked)
	Checkout string // "" = unchanged
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
			if value == "none" {
				continue
			}
			pid, err := strconv.Atoi(value)
			if err != nil || pid < 1 || pid > 2147483647 || strconv.Itoa(pid) != value {
				return a, refuse(StateRecordMalformed, "", "write pid=<n> with a running process id, or pid=none", "pid %q is not a process id", value)
			}
			a.PID = pid
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
