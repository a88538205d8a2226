package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"sync"
	"unicode/utf8"
)

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// cockpitID is the identity a record keeps of a cockpit (SPEC §2).
func cockpitID(cockpit string) string { return identity("cockpit:", cockpit, "") }

// StackID is the identity of a stack; it is also the runtime-stop target of its drains.
func StackID(cockpit, stack string) string { return identity("stack:", cockpit+"/"+stack, "") }

// holderID is the identity of a holder name; the same name is the same holder in every stack.
func holderID(holder string) string { return identity("holder:", holder, ":session") }

// checkoutID is the identity of an absolute checkout path.
func checkoutID(path string) string { return identity("checkout:", path, "") }

// identity is prefix, the digest of s, then suffix. The identities of the few names and paths a
// daemon serves are remembered (a claim derives eight to eleven, of four strings; TestIdentities):
// a lookup where a digest was a hash and three allocations. Bounded in entries and in the length
// of what is remembered; any one entry goes when it is full.
func identity(prefix, s, suffix string) string {
	key := identityKey{prefix, s}
	identities.mu.Lock()
	id, ok := identities.m[key]
	identities.mu.Unlock()
	if ok {
		return id
	}
	id = prefix + digest(s) + suffix
	if len(s) <= maxRememberedIdentity {
		identities.mu.Lock()
		defer identities.mu.Unlock()
		if len(identities.m) >= maxIdentities {
			for other := range identities.m {
				delete(identities.m, other)
				break
			}
		}
		identities.m[key] = id
	}
	return id
}

type identityKey struct{ prefix, s string } // each prefix has one suffix

var identities = struct {
	mu sync.Mutex // guards m; a leaf
	m  map[identityKey]string
}{m: map[identityKey]string{}}

const (
	maxIdentities         = 1024
	maxRememberedIdentity = 256
)

const maxNameBytes = 128

// NameRule says what ValidName takes, for a refusal's words.
const NameRule = "1-128 bytes of [A-Za-z0-9._-], not starting with '.' or '-'"

// CockpitNameRule says what ValidCockpitName takes.
const CockpitNameRule = NameRule + ", and none of README, ports, status, status.json, gc"

// ValidName reports whether s may name a cockpit, stack or holder: 1–128 bytes of
// [A-Za-z0-9._-], not starting with '.' or '-'.
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > maxNameBytes || s[0] == '.' || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// NameFor maps any text — a checkout folder's name, a user's name — to a valid name, the one
// mapping exec, the README's Makefile (through `cockpitfs name`) and every other door share:
// each character outside [A-Za-z0-9._-] becomes '_', a leading '.' or '-' becomes '_', empty
// text is "_", and the result is cut to 128 bytes. A valid name maps to itself.
func NameFor(s string) string {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if r < utf8.RuneSelf && ValidName("a"+string(r)) {
			b = append(b, byte(r))
		} else {
			b = append(b, '_')
		}
		if len(b) == maxNameBytes {
			break
		}
	}
	if len(b) == 0 {
		return "_"
	}
	if b[0] == '.' || b[0] == '-' {
		b[0] = '_'
	}
	return string(b)
}

// StackNameFor is the stack of the checkout at dir (an absolute path): NameFor its folder's
// name, cut to leave room, then '-' and the first 8 hex digits of the SHA-256 of dir, so that
// two checkouts whose folders share a name never share a stack.
func StackNameFor(dir string) string {
	folder := NameFor(filepath.Base(dir))
	suffix := "-" + digest(dir)[:8]
	return folder[:min(len(folder), maxNameBytes-len(suffix))] + suffix
}

// ValidCockpitName is ValidName less the names the root directory already uses.
func ValidCockpitName(s string) bool {
	return ValidName(s) && s != "README" && s != "ports" && s != "status" && s != "status.json" && s != "gc"
}

func checkName(kind, name string) error {
	if !ValidName(name) {
		return refuse(StateRecordMalformed, name, "use "+NameRule,
			"%s name %q is invalid", kind, name)
	}
	return nil
}
