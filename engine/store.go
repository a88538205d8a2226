package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/storage"
)

// Keys of the store. Names never hold '/', so it separates components unambiguously.
//
//	c/<cockpit>              cockpitMeta
//	s/<cockpit>/<stack>      Record
//	d/<cockpit>/<stack>      DeclaredValues of the stack (declared-values)
//	p/<port, 5 digits>       PortOwner: the machine-wide index of active leases
//	n/<cockpit>              number of active leases in the cockpit
//	u/<uid>                  number of active leases taken by the uid's claims, every cockpit
//	e/<cockpit>/<stack|->/<seq, 16 hex>   one events line; "-" is the cockpit's own log
//	q/<cockpit>/<stack|->    the next events seq
//	o/<cockpit>/<stack|->    the events file's end: bytes ever appended to it (see EventsWindow)
//	m/<boot id>/<daemon>     a daemon of that boot is alive (shared stores only; see machines)
const cockpitLevel = "-"

// Prefixes of whole key families, for scans.
const (
	cockpitsPrefix  = "c/"
	allStacksPrefix = "s/"
	portsPrefix     = "p/"
	allEventsPrefix = "e/"
	uidLeasesPrefix = "u/"
)

func cockpitKey(cockpit string) string          { return cockpitsPrefix + cockpit }
func stackKey(cockpit, stack string) string     { return allStacksPrefix + cockpit + "/" + stack }
func stacksPrefix(cockpit string) string        { return allStacksPrefix + cockpit + "/" }
func portKey(port int) string                   { return fmt.Sprintf("%s%05d", portsPrefix, port) }
func leaseCountKey(cockpit string) string       { return "n/" + cockpit }
func uidLeasesKey(uid uint32) string            { return fmt.Sprintf("%s%d", uidLeasesPrefix, uid) }
func eventsPrefix(cockpit, stack string) string { return allEventsPrefix + cockpit + "/" + stack + "/" }
func eventsSeqKey(cockpit, stack string) string { return "q/" + cockpit + "/" + stack }
func eventsEndKey(cockpit, stack string) string { return "o/" + cockpit + "/" + stack }
func eventKey(cockpit, stack string, seq uint64) string {
	return fmt.Sprintf("%s%016x", eventsPrefix(cockpit, stack), seq)
}

func machinesPrefix(boot string) string     { return "m/" + boot + "/" }
func machineKey(boot, daemon string) string { return machinesPrefix(boot) + daemon }

// cockpitMeta is what a cockpit keeps besides its stacks.
type cockpitMeta struct {
	Name      string `json:"name"`
	ID        string `json:"id"`
	UID       uint32 `json:"uid"`
	CreatedAt string `json:"createdAt"`
	UpdatedAt string `json:"updatedAt"`
	Revision  int64  `json:"revision"`
	Stacks    int    `json:"stacks"` // read with Get by mkdir/rmdir so removing a cockpit races no new stack
	Config    string `json:"config"` // the accepted document, as written
	// Declared is Config parsed when it was accepted, so a claim does not parse TOML again.
	Declared *portdecl.Config `json:"declared,omitempty"`
}

// PortOwner is one entry of the machine-wide port index.
type PortOwner struct {
	Port    int    `json:"port"`
	Cockpit string `json:"cockpit"`
	Stack   string `json:"stack"`
	Key     string `json:"key"`
	Offset  int    `json:"offset"`
}

func getJSON(tx storage.Txn, key string, v any) (bool, error) {
	data, err := tx.Get(key)
	if errors.Is(err, storage.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("decode %s: %w", key, malformedValue{err})
	}
	return true, nil
}

func setJSON(tx storage.Txn, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.Set(key, data)
}

func (e *Engine) loadCockpit(tx storage.Txn, cockpit string) (cockpitMeta, error) {
	m, _, err := e.readCockpit(tx, cockpit)
	return m, err
}

// readCockpit is loadCockpit that also returns the bytes read.
func (e *Engine) readCockpit(tx storage.Txn, cockpit string) (cockpitMeta, []byte, error) {
	key := cockpitKey(cockpit)
	raw, err := tx.Get(key)
	if errors.Is(err, storage.ErrNotFound) {
		e.cockpits.forget(key)
		return cockpitMeta{}, nil, refuse(NotFound, cockpitID(cockpit), "", "cockpit %s does not exist", cockpit)
	}
	if err != nil {
		return cockpitMeta{}, nil, err
	}
	m, err := e.cockpits.decode(key, raw)
	return m, raw, err
}

func (m cockpitMeta) config() (portdecl.Config, bool) {
	if m.Declared == nil {
		return portdecl.Config{}, false
	}
	return *m.Declared, true
}

// loadRecord reads a stack's record in tx. The bytes are always read (the transaction must Get
// what it depends on); decoding them is skipped when they are the bytes the cache holds.
func (e *Engine) loadRecord(tx storage.Txn, cockpit, stack string) (Record, error) {
	r, err := e.readRecord(tx, cockpit, stack)
	return r.Record, err
}

func (e *Engine) readRecord(tx storage.Txn, cockpit, stack string) (cachedRecord, error) {
	key := stackKey(cockpit, stack)
	data, err := tx.Get(key)
	if errors.Is(err, storage.ErrNotFound) {
		return cachedRecord{}, refuse(NotFound, StackID(cockpit, stack), "", "stack %s/%s does not exist", cockpit, stack)
	}
	if err != nil {
		return cachedRecord{}, err
	}
	if r, ok := e.records.decoded(key, data); ok {
		return cachedRecord{r, data}, nil
	}
	r, err := decodeRecord(data)
	return cachedRecord{r, data}, err
}

// saveRecord writes r after checking every invariant: a transition that would break one is a bug
// and commits nothing. It returns what it wrote.
func saveRecord(tx storage.Txn, r Record) (cachedRecord, error) {
	if err := Check(r); err != nil {
		return cachedRecord{}, refuse(StateRecordMalformed, r.SubjectID, "report this as a cockpitfs bug", "transition would break the record's invariants: %v", err)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return cachedRecord{}, err
	}
	if len(data) > maxRecordBytes {
		return cachedRecord{}, refuse(StateRecordTooLarge, r.SubjectID, "release holders, or claim with shorter checkout paths",
			"the stack's record would be %d bytes, more than %d", len(data), maxRecordBytes)
	}
	return cachedRecord{r, data}, tx.Set(stackKey(r.Cockpit, r.Stack), data)
}

// reindexLease moves the port index and the cockpit's active-lease count from before's lease to
// after's. Every key is read with Get so a concurrent lease of the same port conflicts.
func reindexLease(tx storage.Txn, cockpit, stack string, before, after *Lease) error {
	if before.Active() == after.Active() && (!before.Active() || before.Offset == after.Offset) {
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
	delta := 0
	if after.Active() && !before.Active() {
		delta = 1
	} else if before.Active() && !after.Active() {
		delta = -1
	}
	if delta == 0 {
		return nil
	}
	if err := addCount(tx, leaseCountKey(cockpit), delta); err != nil {
		return err
	}
	// The uid a lease counts against is the one it was taken by, also when it is released.
	charged := after
	if delta < 0 {
		charged = before
	}
	if charged.UID == nil {
		return nil
	}
	return addCount(tx, uidLeasesKey(*charged.UID), delta)
}

// addCount adds delta to the count kept at key, read with Get so concurrent changes conflict.
// A count that reaches zero is deleted: a uid that holds nothing leaves no key behind.
func addCount(tx storage.Txn, key string, delta int) error {
	var n int
	if _, err := getJSON(tx, key, &n); err != nil {
		return err
	}
	if n+delta <= 0 && strings.HasPrefix(key, uidLeasesPrefix) {
		return tx.Delete(key)
	}
	return setJSON(tx, key, n+delta)
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

func splitStackKey(key string) (cockpit, stack string) {
	rest := strings.TrimPrefix(key, allStacksPrefix)
	cockpit, stack, _ = strings.Cut(rest, "/")
	return cockpit, stack
}
