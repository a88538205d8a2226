package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/cockpitfs/cockpitfs/storage"
)

// The port index: which stack's active lease holds each port, machine-wide (p/), with the counts
// and sets kept beside it (n/, l/, u/) so that a claim reads what it must without a scan.

// PortOwner is one entry of the machine-wide port index.
type PortOwner struct {
	Port    int    `json:"port"`
	Cockpit string `json:"cockpit"`
	Stack   string `json:"stack"`
	Key     string `json:"key"`
	Offset  int    `json:"offset"`
}

// reindexLease moves the port index, the cockpit's active-lease count and the count of the uid
// the lease counts against from before's lease to after's. Every key is read with Get so a concurrent lease of the same port conflicts.
// What it had to recount or rebuild (damage) it adds to repaired, for the commit's events line.
func reindexLease(tx storage.Txn, cockpit, stack string, before, after *Lease, repaired *[]string) error {
	if before.Active() && after.Active() && before.Offset == after.Offset {
		return recharge(tx, leaseUID(before), leaseUID(after), repaired)
	}
	if before.Active() == after.Active() && !before.Active() {
		return nil
	}
	if before.Active() {
		for _, port := range before.Ports {
			if err := tx.Delete(portKey(port)); err != nil {
				return err
			}
		}
	}
	if after.Active() {
		for key, port := range after.Ports {
			var owner PortOwner
			taken, err := getJSON(tx, portKey(port), &owner)
			if err != nil {
				return err
			}
			if taken && (owner.Cockpit != cockpit || owner.Stack != stack) {
				return refuse(PortLeaseExhausted, portKey(port), "", "port %d is already leased by %s/%s", port, owner.Cockpit, owner.Stack)
			}
			if err := setJSON(tx, portKey(port), PortOwner{Port: port, Cockpit: cockpit, Stack: stack, Key: key, Offset: after.Offset}); err != nil {
				return err
			}
		}
	}
	if err := reindexLeasedPorts(tx, cockpit, before, after, repaired); err != nil {
		return err
	}
	delta := 0
	if after.Active() && !before.Active() {
		delta = 1
	} else if before.Active() && !after.Active() {
		delta = -1
	}
	if delta == 0 {
		return nil
	}
	if err := addCount(tx, leaseCountKey(cockpit), delta, repaired); err != nil {
		return err
	}
	// A released lease leaves the count of the uid it counted against until then.
	charged := after
	if delta < 0 {
		charged = before
	}
	if charged.UID == nil {
		return nil
	}
	return addCount(tx, uidLeasesKey(*charged.UID), delta, repaired)
}

// recharge moves an active lease's count from the uid it counted against to the one it counts
// against now (chargeLease): a takeover's, or a release of the last holder of the first.
func recharge(tx storage.Txn, was, is *uint32, repaired *[]string) error {
	if was == nil || is == nil || *was == *is {
		return nil
	}
	if err := addCount(tx, uidLeasesKey(*was), -1, repaired); err != nil {
		return err
	}
	return addCount(tx, uidLeasesKey(*is), 1, repaired)
}

// leasedPorts is the set of ports the cockpit's active leases hold, as kept at its
// leasedPortsKey, so that a new lease passes the families its cockpit leases without reading
// each one's index entry. A cockpit without active leases holds none, whatever the key says.
// known is false for a store written before the key, where a cockpit with active leases has
// none yet: its next lease change writes it (reindexLeasedPorts).
func leasedPorts(tx storage.Txn, cockpit string) (ports []int, known bool, err error) {
	n, _, err := readCount(tx, leaseCountKey(cockpit))
	if err != nil || n == 0 {
		return nil, err == nil, err
	}
	data, err := tx.Get(leasedPortsKey(cockpit))
	if errors.Is(err, storage.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	ports, err = decodePorts(data)
	if err != nil {
		return nil, false, fmt.Errorf("decode %s: %w", leasedPortsKey(cockpit), malformedValue{err})
	}
	return ports, true, nil
}

// reindexLeasedPorts keeps the cockpit's leasedPortsKey in step with a lease that goes from
// before to after, once the port index has been changed: a set it does not know yet (an older
// store), or one that does not decode (damage, added to repaired), is read from that index
// instead, this change included.
func reindexLeasedPorts(tx storage.Txn, cockpit string, before, after *Lease, repaired *[]string) error {
	ports, known, err := leasedPorts(tx, cockpit)
	if isMalformed(err) {
		*repaired = append(*repaired, fmt.Sprintf("%v: rebuilt from the port index", err))
		ports, known, err = nil, false, nil
	}
	if err != nil {
		return err
	}
	if !known {
		err := tx.Scan(portsPrefix, func(key string, value []byte) error {
			// An entry that does not decode is verify's to report; a family it would have
			// passed unread is then read as before.
			var owner PortOwner
			if decodeJSON(key, value, &owner) == nil && owner.Cockpit == cockpit {
				ports = append(ports, owner.Port)
			}
			return nil
		})
		if err != nil {
			return err
		}
	} else {
		if before.Active() {
			gone := slices.Collect(maps.Values(before.Ports))
			ports = slices.DeleteFunc(ports, func(p int) bool { return slices.Contains(gone, p) })
		}
		if after.Active() {
			ports = slices.AppendSeq(ports, maps.Values(after.Ports))
		}
	}
	slices.Sort(ports)
	ports = slices.Compact(ports)
	if len(ports) == 0 {
		return tx.Delete(leasedPortsKey(cockpit))
	}
	return tx.Set(leasedPortsKey(cockpit), appendPorts(nil, ports))
}

// addCount adds delta to the count kept at key, read with Get so concurrent changes conflict.
// A per-uid count that reaches zero is deleted: a uid that holds nothing leaves no key behind.
// A count that does not decode is recounted (readCount) from the records as this transaction
// leaves them, its own change included, and written whole; repaired names it for the events line.
func addCount(tx storage.Txn, key string, delta int, repaired *[]string) error {
	n, recounted, err := readCount(tx, key)
	if err != nil {
		return err
	}
	if recounted {
		*repaired = append(*repaired, fmt.Sprintf("%s did not decode: recounted %d from the records", key, n))
	} else {
		n += delta
	}
	if n <= 0 && perUID(key) {
		return tx.Delete(key)
	}
	return setJSON(tx, key, n)
}

// readCount reads the count kept at key (n/, u/, k/ or t/). One that does not decode (written by
// hand, by another version) is damage, but a count says no more than the records it counts: it
// is recounted from them in tx, a scan paid only while it is damaged, so the operation goes on
// instead of refusing every new lease, cockpit or stack it bounds, and verify names it until a
// commit writes it whole. A count only bounds: it never chooses a port (the port index and the
// records do), so a recount hands out nothing a lease holds.
func readCount(tx storage.Txn, key string) (n int, recounted bool, err error) {
	if _, err = getJSON(tx, key, &n); !isMalformed(err) {
		return n, false, err
	}
	n, err = recount(tx, key)
	return n, true, err
}

// recount counts in tx what the count at key counts: the cockpit's active leases (n/), or the
// uid's active leases (u/), counted cockpits (k/) or stacks made (t/). A value that does not
// decode counts for nothing: verify names it.
func recount(tx storage.Txn, key string) (int, error) {
	family, name := key[:2], key[2:]
	n := 0
	count := func(prefix string, counts func(Record) bool) error {
		return tx.Scan(prefix, func(_ string, head []byte) error {
			if r, err := decodeHead(head); err == nil && counts(r) {
				n++
			}
			return nil
		})
	}
	if family == "n/" {
		err := count(stacksPrefix(name), func(r Record) bool { return r.Value.Lease.Active() })
		return n, err
	}
	parsed, err := strconv.ParseUint(name, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("recount %s: %w", key, err)
	}
	uid := uint32(parsed)
	switch family {
	case uidCockpitsPrefix:
		err = tx.Scan(cockpitsPrefix, func(_ string, value []byte) error {
			var m cockpitMeta
			if json.Unmarshal(value, &m) == nil && m.Counted && m.UID == uid {
				n++
			}
			return nil
		})
	case uidStacksPrefix:
		err = count(allStacksPrefix, func(r Record) bool { return r.Creator != nil && *r.Creator == uid })
	default:
		err = count(allStacksPrefix, func(r Record) bool {
			return r.Value.Lease.Active() && r.Value.Lease.UID != nil && *r.Value.Lease.UID == uid
		})
	}
	return n, err
}

// perUID says whether key is one of a uid's counts (leases, cockpits, stacks).
func perUID(key string) bool {
	for _, prefix := range []string{uidLeasesPrefix, uidCockpitsPrefix, uidStacksPrefix} {
		if strings.HasPrefix(key, prefix) {
			return true
		}
	}
	return false
}

// leaseIndexProblems says where the port index does not give a port of lease, an active lease of
// (cockpit, stack), to that stack under its key and offset: one line per port, in key order; none
// when the index agrees. Each entry is read with Get. Health and verify both check with it.
func leaseIndexProblems(tx storage.Txn, cockpit, stack string, lease *Lease) ([]string, error) {
	var problems []string
	for _, key := range sortedPortKeys(lease.Ports) {
		port := lease.Ports[key]
		data, err := tx.Get(portKey(port))
		if errors.Is(err, storage.ErrNotFound) {
			problems = append(problems, fmt.Sprintf("port %d (%s) is missing from the machine's port index", port, key))
			continue
		}
		if err != nil {
			return nil, err
		}
		if bytes.Equal(data, appendPortOwnerJSON(nil, PortOwner{Port: port, Cockpit: cockpit, Stack: stack, Key: key, Offset: lease.Offset})) {
			continue // exactly what the lease's commit wrote: no need to decode it
		}
		var owner PortOwner
		switch err := json.Unmarshal(data, &owner); {
		case err != nil:
			problems = append(problems, fmt.Sprintf("port %d (%s) has an unreadable index entry: %v", port, key, err))
		case owner.Cockpit != cockpit || owner.Stack != stack || owner.Key != key || owner.Offset != lease.Offset:
			problems = append(problems, fmt.Sprintf("port %d (%s) is indexed to %s/%s %s at offset %d", port, key, owner.Cockpit, owner.Stack, owner.Key, owner.Offset))
		}
	}
	return problems, nil
}
