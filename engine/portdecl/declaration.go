// Package portdecl is a cockpit's port declaration (SPEC §3): the TOML `config` document that
// declares port keys, their bases and the candidate port families a lease chooses from, plus the
// entrypoints (URLs) derived from a leased family. It parses and validates the document, lists the
// candidate families, renders entrypoints and fingerprints the declaration a lease records; it
// knows nothing of the store, the filesystem or errno.
package portdecl

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

const (
	minPort = 1
	maxPort = 65535
	// maxCandidatePorts bounds count × number of bases (SPEC §3), the seeds' structured input budget.
	maxCandidatePorts = 1024
	// maxSafeInteger is the largest integer a JSON reader that uses doubles (the seeds) reads
	// exactly; the seeds' lease schema requires step and count to be safe integers.
	maxSafeInteger = 1<<53 - 1
)

// Declaration is what a lease records of the config it was taken under (JSON as in the seeds'
// lease.declaration).
type Declaration struct {
	Step  int            `json:"step"`
	Count int            `json:"count"`
	Bases map[string]int `json:"bases"`
}

// Family is one candidate port family: every base key moved by the same offset.
type Family struct {
	Offset int
	Ports  map[string]int // key -> base+offset
}

// Validate applies SPEC §3's rules to a declaration. The message names the offending field the
// way the config document spells it (ports.step, ports.bases.HTTP, ...).
func (d Declaration) Validate() error {
	if d.plainlyValid() {
		return nil
	}
	return d.validate(known{step: true, count: true, bases: true})
}

// maxPairedBases is the most bases plainlyValid compares pair by pair; more go to validate.
const maxPairedBases = 16

// plainlyValid is true for a declaration Validate accepts, found without building the map of
// every candidate port validate builds to name a conflict: a new lease checks its declaration
// four times (choosing the family, taking it, and the commit's invariants twice), cold each time.
// false says nothing; validate then decides, and says why.
func (d Declaration) plainlyValid() bool {
	step, count := int64(d.Step), int64(d.Count)
	if step < 1 || step > maxSafeInteger || count < 1 || len(d.Bases) == 0 || len(d.Bases) > maxPairedBases ||
		count > maxCandidatePorts/int64(len(d.Bases)) || count > 1 && step > maxPort {
		return false
	}
	highest := 0
	for key, base := range d.Bases {
		if !ValidKey(key) || base < minPort || base > maxPort {
			return false
		}
		highest = max(highest, base)
		for otherKey, other := range d.Bases {
			// Two keys share a port when their bases lie a whole number of steps apart, fewer
			// than count (equal bases are none apart).
			if apart := int64(other - base); otherKey != key && apart >= 0 && apart%step == 0 && apart/step < count {
				return false
			}
		}
	}
	return int64(highest)+(count-1)*step <= maxPort
}

// known says which parts of a declaration are given: a document still being written (see
// ParsePrefix) may not have reached step or count yet, and more bases may follow.
type known struct{ step, count, bases bool }

// validate applies Validate's rules to what is known, in Validate's order: an error it returns
// stays an error whatever is added later.
func (d Declaration) validate(k known) error {
	// Arithmetic is in int64 with bounds checked before each product, so a huge step or count
	// cannot overflow or make us generate more than maxCandidatePorts candidates.
	step, count := int64(d.Step), int64(d.Count)
	if k.step && step < 1 {
		return fmt.Errorf("ports.step: %d is less than 1", step)
	}
	if k.count && count < 1 {
		return fmt.Errorf("ports.count: %d is less than 1", count)
	}
	if len(d.Bases) == 0 {
		if !k.bases {
			return nil
		}
		return missing("ports.bases: at least one base is required")
	}
	keys := slices.Sorted(maps.Keys(d.Bases))
	owner := make(map[int]string, len(keys))
	for _, key := range keys {
		if !ValidKey(key) {
			return fmt.Errorf("ports.bases.%s: key does not match ^[A-Z][A-Z0-9_]*$", quoteKey(key))
		}
		base := d.Bases[key]
		if base < minPort || base > maxPort {
			return fmt.Errorf("ports.bases.%s: %d is outside 1-65535", key, base)
		}
		if other, taken := owner[base]; taken {
			return fmt.Errorf("ports.bases: %s and %s are both %d; bases must be distinct", other, key, base)
		}
		owner[base] = key
	}
	if k.count && count > maxCandidatePorts/int64(len(keys)) {
		return fmt.Errorf("ports.count: %d families × %d bases is more than %d candidate ports",
			count, len(keys), maxCandidatePorts)
	}
	if !k.step || !k.count {
		return nil // the families are judged once both are given
	}
	if count > 1 && step > maxPort {
		return fmt.Errorf("ports.step: %d puts the family at offset %d above port 65535", step, step)
	}
	// Every candidate port must be in range and belong to one family only.
	type candidate struct {
		key    string
		offset int64
	}
	seen := make(map[int64]candidate, int(count)*len(keys))
	for index := range count {
		offset := index * step
		for _, key := range keys {
			port := int64(d.Bases[key]) + offset
			if port > maxPort {
				return fmt.Errorf("ports: %s at offset %d would be %d, outside 1-65535", key, offset, port)
			}
			if first, taken := seen[port]; taken {
				return fmt.Errorf("ports: port %d is in two candidate families (%s at offset %d and %s at offset %d)",
					port, first.key, first.offset, key, offset)
			}
			seen[port] = candidate{key, offset}
		}
	}
	if step > maxSafeInteger {
		return fmt.Errorf("ports.step: %d is more than %d", step, int64(maxSafeInteger))
	}
	return nil
}

// Equal reports whether two declarations are the same step, count and bases.
func (d Declaration) Equal(o Declaration) bool {
	return d.Step == o.Step && d.Count == o.Count && maps.Equal(d.Bases, o.Bases)
}

// SHA256 is the hex sha256 of the declaration's canonical JSON (keys sorted, no spaces), used as
// a drain's configSha256.
func (d Declaration) SHA256() string {
	// encoding/json writes map keys sorted; the struct's field order (step, count, bases) is not,
	// so the top level is a map too.
	canonical, err := json.Marshal(map[string]any{"bases": d.Bases, "count": d.Count, "step": d.Step})
	if err != nil {
		panic(fmt.Sprintf("portdecl: marshal declaration: %v", err)) // ints and a string-keyed map always marshal
	}
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:])
}

// Candidates lists the families in offset order: offsets 0, step, 2*step, ... (Count of them).
// It returns nil for a declaration Validate refuses, so a corrupt record cannot make it allocate
// without bound.
func (d Declaration) Candidates() []Family {
	if d.Validate() != nil {
		return nil
	}
	families := make([]Family, d.Count)
	for index := range families {
		families[index] = d.familyAt(index * d.Step)
	}
	return families
}

// FamilyAt returns the family at offset; ok is false when offset is not a candidate offset or the
// declaration is invalid.
func (d Declaration) FamilyAt(offset int) (Family, bool) {
	if offset < 0 || d.Validate() != nil || offset%d.Step != 0 || offset/d.Step >= d.Count {
		return Family{}, false
	}
	return d.familyAt(offset), true
}

func (d Declaration) familyAt(offset int) Family {
	ports := make(map[string]int, len(d.Bases))
	for key, base := range d.Bases {
		ports[key] = base + offset
	}
	return Family{Offset: offset, Ports: ports}
}

// ValidKey reports whether s is a port key (^[A-Z][A-Z0-9_]*$).
func ValidKey(s string) bool {
	if s == "" || s[0] < 'A' || s[0] > 'Z' {
		return false
	}
	for _, c := range []byte(s[1:]) {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// quoteKey renders a key for a message: as is when it is a bare TOML key, quoted otherwise, so a
// key holding a newline or control character cannot forge a message line.
func quoteKey(key string) string {
	for _, c := range []byte(key) {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Sprintf("%q", key)
		}
	}
	if key == "" {
		return `""`
	}
	return key
}

// defaultEntrypointName is the entrypoint every port key gets: HTTP_ADMIN -> http-admin.
func defaultEntrypointName(key string) string {
	return strings.ReplaceAll(strings.ToLower(key), "_", "-")
}
