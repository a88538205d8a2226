package engine

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/engine/portlock"
	"github.com/cockpitfs/cockpitfs/storage"
)

// Verify checks the whole store offline: every record against checkRecord, the port index against the
// active leases both ways, the per-cockpit and per-uid counts (leases, cockpits, stacks), and each cockpit's leased ports. It returns one line per violation, naming
// its key, and how many records it read.
func Verify(db storage.Store) ([]string, int, error) {
	var violations []string
	bad := func(key, format string, args ...any) {
		// One line each, nothing a terminal acts on: a shared store's keys and values are anyone's.
		violations = append(violations, Printable(key+": "+fmt.Sprintf(format, args...)))
	}
	records := map[string]Record{}
	stacks := map[string]int{}
	leases := map[string]int{}
	leasedBy := map[string][]int{} // the ports of each cockpit's active leases
	uidLeases := map[string]int{}  // by uidLeasesKey
	err := db.View(func(tx storage.Txn) error {
		var keys []string
		heads := map[string][]byte{}
		if err := tx.Scan(allStacksPrefix, func(key string, value []byte) error {
			keys, heads[key] = append(keys, key), value
			return nil
		}); err != nil {
			return err
		}
		assembled, failed, err := assembleRecords(tx, allHoldersPrefix, heads)
		if err != nil {
			return err
		}
		for _, key := range keys {
			cockpit, stack := splitStackKey(key)
			r := assembled[key].Record
			switch err := failed[key]; {
			case err != nil:
				bad(key, "%v", err)
				// A head that decodes still counts, with its lease: only its holders are unknown.
				if r, err = decodeHead(heads[key]); err != nil {
					continue
				}
			default:
				if err := checkRecord(r); err != nil {
					bad(key, "%s", strings.ReplaceAll(err.Error(), "\n", "; "))
				}
			}
			stacks[cockpit]++
			if r.Cockpit != cockpit || r.Stack != stack {
				bad(key, "record names %s/%s", r.Cockpit, r.Stack)
			}
			records[key] = r
			if r.Value.Lease.Active() {
				leases[cockpit]++
				leasedBy[cockpit] = slices.AppendSeq(leasedBy[cockpit], maps.Values(r.Value.Lease.Ports))
				if r.Value.Lease.UID != nil {
					uidLeases[uidLeasesKey(*r.Value.Lease.UID)]++
				}
				problems, err := leaseIndexProblems(tx, cockpit, stack, r.Value.Lease)
				if err != nil {
					return err
				}
				for _, p := range problems {
					bad(key, "%s", p)
				}
			}
		}
		// A holder's key outlives its stack only by damage or a bug.
		if err := tx.Scan(allHoldersPrefix, func(key string, _ []byte) error {
			if stack := holderStackKey(key); !hasKey(heads, stack) {
				cockpit, name := splitStackKey(stack)
				bad(key, "a holder of stack %s/%s, which does not exist", cockpit, name)
			}
			return nil
		}); err != nil {
			return err
		}
		// Declared values belong to a stack and hold what their text parses to.
		if err := tx.Scan(declaredPrefix, func(key string, value []byte) error {
			cockpit, stack := splitStackKey(allStacksPrefix + strings.TrimPrefix(key, declaredPrefix))
			if !hasKey(heads, stackKey(cockpit, stack)) {
				bad(key, "declared values of stack %s/%s, which does not exist", cockpit, stack)
			}
			var dv DeclaredValues
			if err := json.Unmarshal(value, &dv); err != nil {
				bad(key, "%v", err)
				return nil
			}
			if values, err := parseDeclaredValues([]byte(dv.Text)); err != nil || !maps.Equal(values, dv.Values) {
				bad(key, "the declared values do not parse from the text recorded with them")
			}
			return nil
		}); err != nil {
			return err
		}
		if err := tx.Scan(portsPrefix, func(key string, value []byte) error {
			var owner PortOwner
			if err := json.Unmarshal(value, &owner); err != nil {
				bad(key, "%v", err)
				return nil
			}
			r, ok := records[stackKey(owner.Cockpit, owner.Stack)]
			if !ok || !r.Value.Lease.Active() || r.Value.Lease.Ports[owner.Key] != owner.Port || portKey(owner.Port) != key {
				bad(key, "indexed for %s/%s key %s, which holds no such active lease", owner.Cockpit, owner.Stack, owner.Key)
			}
			return nil
		}); err != nil {
			return err
		}
		if err := verifyUIDCounts(tx, uidLeasesPrefix, uidLeases, "active leases taken by that uid", bad); err != nil {
			return err
		}
		// Stacks are counted by creator once the store says so (CountStacks); before, no count.
		uidStacks := map[string]int{}
		counted, err := found(tx, stacksCountedKey)
		if err != nil {
			return err
		}
		for _, r := range records {
			if r.Creator != nil && counted {
				uidStacks[uidStacksKey(*r.Creator)]++
			}
		}
		if err := verifyUIDCounts(tx, uidStacksPrefix, uidStacks, "stacks made by that uid", bad); err != nil {
			return err
		}
		uidCockpits := map[string]int{} // by uidCockpitsKey
		cockpits := map[string]bool{}
		if err := tx.Scan(cockpitsPrefix, func(key string, value []byte) error {
			cockpits[key[len(cockpitsPrefix):]] = true
			var m cockpitMeta
			if err := json.Unmarshal(value, &m); err != nil {
				bad(key, "%v", err)
				return nil
			}
			if name := key[len(cockpitsPrefix):]; m.Name != name {
				bad(key, "names cockpit %q", m.Name)
			}
			if m.Counted {
				uidCockpits[uidCockpitsKey(m.UID)]++
			}
			if m.Config != "" {
				cfg, err := portdecl.Parse([]byte(m.Config))
				if err != nil || m.Declared == nil || !cfg.Declaration.Equal(m.Declared.Declaration) {
					bad(key, "the accepted config does not parse to the declaration recorded with it")
				}
			}
			if m.Stacks != stacks[m.Name] {
				bad(key, "counts %d stacks, the store holds %d", m.Stacks, stacks[m.Name])
			}
			var n int
			if _, err := getJSON(tx, leaseCountKey(m.Name), &n); isMalformed(err) {
				// A violation like any other: the rest is checked and reported too.
				bad(leaseCountKey(m.Name), "%v", err)
				n = leases[m.Name]
			} else if err != nil {
				return err
			} else if n != leases[m.Name] {
				bad(leaseCountKey(m.Name), "counts %d active leases, the store holds %d", n, leases[m.Name])
			}
			ports, known, err := leasedPorts(tx, m.Name)
			if err != nil {
				bad(leasedPortsKey(m.Name), "%v", err)
				return nil
			}
			held := slices.Sorted(slices.Values(leasedBy[m.Name]))
			if known && n == leases[m.Name] && !slices.Equal(ports, held) {
				bad(leasedPortsKey(m.Name), "names ports %v, the cockpit's active leases hold %v", ports, held)
			}
			return nil
		}); err != nil {
			return err
		}
		if err := verifyUIDCounts(tx, uidCockpitsPrefix, uidCockpits, "counted cockpits made by that uid", bad); err != nil {
			return err
		}
		if err := tx.Scan("", func(key string, _ []byte) error {
			if !inLayout(key) {
				bad(key, "is not a key of cockpitfs's layout (no daemon reads it: delete it, or find what wrote it)")
			}
			return nil
		}); err != nil {
			return err
		}
		return verifyEvents(tx, func(cockpit, stack string) bool {
			return cockpits[cockpit] && (stack == cockpitLevel || hasKey(heads, stackKey(cockpit, stack)))
		}, bad)
	})
	return violations, len(records), err
}

// verifyUIDCounts checks each per-uid count under prefix against want, what the store holds of
// what (by the count's key).
func verifyUIDCounts(tx storage.Txn, prefix string, want map[string]int, what string, bad func(key, format string, args ...any)) error {
	if err := tx.Scan(prefix, func(key string, value []byte) error {
		var n int
		if err := json.Unmarshal(value, &n); err != nil {
			bad(key, "%v", err)
		} else if n != want[key] {
			bad(key, "counts %d, the store holds %d %s", n, want[key], what)
		}
		delete(want, key)
		return nil
	}); err != nil {
		return err
	}
	for key, n := range want {
		bad(key, "is missing: the store holds %d %s", n, what)
	}
	return nil
}

// VerifyHolds checks, with the store's daemon stopped, that no other process holds a port of an
// active lease in space (portlock.Machine): another daemon leased it while this store's daemon was
// down, or a squatter took it. It sees the holds of its own network namespace only.
func VerifyHolds(db storage.Store, space portlock.Space) ([]string, error) {
	var violations []string
	err := db.View(func(tx storage.Txn) error {
		return tx.Scan(allStacksPrefix, func(key string, value []byte) error {
			r, err := decodeHead(value) // the lease is all it needs
			if err != nil || !r.Value.Lease.Active() {
				return nil // Verify reports an unreadable record
			}
			for _, k := range sortedPortKeys(r.Value.Lease.Ports) {
				port := r.Value.Lease.Ports[k]
				holder, held, err := space.Ask(port)
				if err != nil {
					return err
				}
				if held {
					violations = append(violations, fmt.Sprintf("%s: active lease port %s=%d is held by %s (fix: %s)", key, k, port, holder, lostFix))
				}
			}
			return nil
		})
	})
	return violations, err
}

func hasKey(m map[string][]byte, key string) bool {
	_, ok := m[key]
	return ok
}

// verifyEvents checks the events files' keys: each head (and the legacy keys before heads)
// decodes within range and belongs to a file that exists (a cockpit's, or a stack's); each line
// is under a key appendEvent makes, decodes, and comes before its head's next seq; each window's
// index entry decodes, counts below its window's lines, and names a line that is there.
func verifyEvents(tx storage.Txn, exists func(cockpit, stack string) bool, bad func(key, format string, args ...any)) error {
	// file splits key, under prefix, into its events file's names and what follows them.
	file := func(prefix, key string, parts int) (cockpit, stack string, rest []string, ok bool) {
		fields := strings.SplitN(strings.TrimPrefix(key, prefix), "/", parts)
		if len(fields) != parts {
			bad(key, "is not a key of an events file")
			return "", "", nil, false
		}
		if !exists(fields[0], fields[1]) {
			bad(key, "belongs to the events file of %s/%s, which does not exist", fields[0], fields[1])
			return "", "", nil, false
		}
		return fields[0], fields[1], fields[2:], true
	}
	heads := map[string]eventsHead{} // by events file, "cockpit/stack"
	if err := tx.Scan("f/", func(key string, value []byte) error {
		cockpit, stack, _, ok := file("f/", key, 2)
		if !ok {
			return nil
		}
		h, err := decodeEventsHead(value)
		if err == nil {
			err = h.check()
		}
		if err != nil {
			bad(key, "%v", err)
			return nil
		}
		heads[cockpit+"/"+stack] = h
		return nil
	}); err != nil {
		return err
	}
	// The keys an events head replaced, in files no append has touched since.
	for _, prefix := range []string{"q/", "o/", "w/"} {
		if err := tx.Scan(prefix, func(key string, value []byte) error {
			if _, _, _, ok := file(prefix, key, 2); !ok {
				return nil
			}
			var err error
			switch prefix {
			case "q/":
				var seq uint64
				err = decodeJSON(key, value, &seq)
			case "o/":
				var end int64
				if err = decodeJSON(key, value, &end); err == nil && (end < 0 || end > maxEventsCount) {
					err = fmt.Errorf("end %d: out of range", end)
				}
			default:
				var w windows
				err = decodeJSON(key, value, &w)
			}
			if err != nil {
				bad(key, "%v", err)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	lines := map[string]bool{}
	if err := tx.Scan(allEventsPrefix, func(key string, value []byte) error {
		cockpit, stack, rest, ok := file(allEventsPrefix, key, 3)
		if !ok {
			return nil
		}
		seq, err := strconv.ParseUint(rest[0], 16, 64)
		if err != nil || eventKey(cockpit, stack, seq) != key {
			bad(key, "is not the key of an events line (16 hex digits of its seq)")
			return nil
		}
		lines[key] = true
		var e event
		if err := json.Unmarshal(value, &e); err != nil {
			bad(key, "%v", err)
		} else if h, ok := heads[cockpit+"/"+stack]; ok && seq >= h.Seq {
			bad(key, "line %d is at or past its file's next seq %d (%s)", seq, h.Seq, eventsHeadKey(cockpit, stack))
		}
		return nil
	}); err != nil {
		return err
	}
	return tx.Scan("x/", func(key string, value []byte) error {
		cockpit, stack, rest, ok := file("x/", key, 4)
		if !ok {
			return nil
		}
		n, err := strconv.ParseUint(rest[1], 16, 64)
		if err != nil || eventsIndexKey(cockpit, stack, rest[0], n) != key {
			bad(key, "is not the key of an events window's entry")
			return nil
		}
		var seq uint64
		if err := decodeJSON(key, value, &seq); err != nil {
			bad(key, "%v", err)
			return nil
		}
		if h, ok := heads[cockpit+"/"+stack]; ok && n >= h.Windows[rest[0]] {
			bad(key, "entry %d of window %q, which has had %d lines (%s)", n, rest[0], h.Windows[rest[0]], eventsHeadKey(cockpit, stack))
		}
		if !lines[eventKey(cockpit, stack, seq)] {
			bad(key, "names line %d, which is not there", seq)
		}
		return nil
	})
}
