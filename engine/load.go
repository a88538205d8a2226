package engine

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/storage"
)

// Reading a cockpit and a stack's record in a transaction: a record is assembled from its head
// and its holders' keys (save.go), unless the cache holds those very head bytes.

// cockpitMeta is what a cockpit keeps besides its stacks.
type cockpitMeta struct {
	Name      string `json:"name"`
	ID        string `json:"id"`
	UID       uint32 `json:"uid"`
	CreatedAt string `json:"createdAt"`
	UpdatedAt string `json:"updatedAt"`
	Revision  int64  `json:"revision"`
	Stacks    int    `json:"stacks"` // read with Get by mkdir/rmdir so removing a cockpit races no new stack
	// Counted: the cockpit counts against its owner's bound (uidCockpitsKey). Cockpits made
	// before cockpits were counted are not, and count against no one.
	Counted bool   `json:"counted,omitempty"`
	Config  string `json:"config"` // the accepted document, as written
	// Declared is Config parsed when it was accepted, so a claim does not parse TOML again.
	Declared *portdecl.Config `json:"declared,omitempty"`
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

// loadRecord reads a stack's record in tx. The head is always read (the transaction must Get
// what it depends on); the holders' keys are read, and the whole decoded, only when the head is
// not the one the cache holds.
func (e *Engine) loadRecord(tx storage.Txn, cockpit, stack string) (Record, error) {
	r, err := e.readRecord(tx, cockpit, stack)
	return r.Record, err
}

// loadStack reads a stack's cockpit and its record, for the operations that judge both.
func (e *Engine) loadStack(tx storage.Txn, cockpit, stack string) (cockpitMeta, Record, error) {
	m, err := e.loadCockpit(tx, cockpit)
	if err != nil {
		return m, Record{}, err
	}
	r, err := e.loadRecord(tx, cockpit, stack)
	return m, r, err
}

func (e *Engine) readRecord(tx storage.Txn, cockpit, stack string) (cachedRecord, error) {
	key := stackKey(cockpit, stack)
	head, err := tx.Get(key)
	if errors.Is(err, storage.ErrNotFound) {
		return cachedRecord{}, refuse(NotFound, StackID(cockpit, stack), "", "stack %s/%s does not exist", cockpit, stack)
	}
	if err != nil {
		return cachedRecord{}, err
	}
	return e.recordOf(tx, key, head)
}

// recordOf is the record whose head, key's value in tx, is head: the cached one when it holds
// those bytes, else read with its holders.
func (e *Engine) recordOf(tx storage.Txn, key string, head []byte) (cachedRecord, error) {
	if r, ok := e.records.decoded(key, head); ok {
		return r, nil
	}
	return assembleRecord(tx, key, head)
}

// assembleRecord decodes head, key's value, and adds the holders stored under their own keys.
func assembleRecord(tx storage.Txn, key string, head []byte) (cachedRecord, error) {
	cockpit, stack := splitStackKey(key)
	var found keyedHolders
	if err := tx.Scan(holdersPrefix(cockpit, stack), func(k string, v []byte) error {
		found.add(k, v, cockpit, stack)
		return nil
	}); err != nil {
		return cachedRecord{}, err
	}
	return withHolders(key, head, found)
}

// recordsOf is recordOf for each of heads (stack key → head): the cached record of each head whose
// bytes it holds, and the others assembled with one scan of the holders under prefix (none when
// every one is cached), so a read of every stack (status) decodes only what changed since.
func (e *Engine) recordsOf(tx storage.Txn, prefix string, heads map[string][]byte) (map[string]cachedRecord, map[string]error, error) {
	records, missing := make(map[string]cachedRecord, len(heads)), map[string][]byte{}
	for key, head := range heads {
		if r, ok := e.records.decoded(key, head); ok {
			records[key] = r
		} else {
			missing[key] = head
		}
	}
	if len(missing) == 0 {
		return records, map[string]error{}, nil
	}
	assembled, failed, err := assembleRecords(tx, prefix, missing)
	if err != nil {
		return nil, nil, err
	}
	for key, r := range assembled {
		records[key] = r
	}
	return records, failed, nil
}

// assembleRecords is assembleRecord for each of heads (stack key → head), with one scan of the
// holders' keys under prefix (allHoldersPrefix, or cockpitHoldersPrefix): a shared store answers
// one range read, not one per stack. A record that does not assemble gets its error in failed.
func assembleRecords(tx storage.Txn, prefix string, heads map[string][]byte) (records map[string]cachedRecord, failed map[string]error, err error) {
	found := map[string]*keyedHolders{}
	err = tx.Scan(prefix, func(k string, v []byte) error {
		key := holderStackKey(k)
		if _, ok := heads[key]; !ok {
			return nil // a holder of no stack: verify names it
		}
		if found[key] == nil {
			found[key] = &keyedHolders{}
		}
		cockpit, stack := splitStackKey(key)
		found[key].add(k, v, cockpit, stack)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	records, failed = map[string]cachedRecord{}, map[string]error{}
	for key, head := range heads {
		var holders keyedHolders
		if f := found[key]; f != nil {
			holders = *f
		}
		if r, err := withHolders(key, head, holders); err != nil {
			failed[key] = err
		} else {
			records[key] = r
		}
	}
	return records, failed, nil
}

// keyedHolders is what the keys of one stack's holders hold, in key order.
type keyedHolders struct {
	holders []Holder
	bytes   int
	err     error // the first key that is not its holder
}

func (f *keyedHolders) add(k string, v []byte, cockpit, stack string) {
	if f.err != nil {
		return
	}
	var h Holder
	if err := json.Unmarshal(v, &h); err != nil {
		f.err = fmt.Errorf("decode %s: %w", k, malformedValue{err})
		return
	}
	if k != holderKey(cockpit, stack, h.HolderID) {
		f.err = fmt.Errorf("decode %s: %w", k, malformedValue{fmt.Errorf("it holds holder %s", h.HolderID)})
		return
	}
	f.holders = append(f.holders, h)
	f.bytes += len(v)
}

// withHolders is the record whose head, key's value, is head, with the holders of its keys.
func withHolders(key string, head []byte, keyed keyedHolders) (cachedRecord, error) {
	r, err := decodeHead(head)
	if err != nil {
		return cachedRecord{}, err
	}
	if cockpit, stack := splitStackKey(key); r.Format != recordFormat || r.Kind != recordKind || r.Cockpit != cockpit || r.Stack != stack {
		// Not this stack's record (a shared store's values are anyone's input: {} decodes):
		// served, it would show a stack of no name, or another's, with no lease.
		return cachedRecord{}, fmt.Errorf("decode %s: %w", key, malformedValue{fmt.Errorf("it holds the %q/%q record of %q/%q", r.Format, r.Kind, r.Cockpit, r.Stack)})
	}
	if keyed.err != nil {
		return cachedRecord{}, keyed.err
	}
	inline := r.Value.Holders
	stored := storedHolders{inline: inline, bytes: keyed.bytes}
	for _, h := range inline {
		stored.bytes += encodedLen(h)
	}
	if r.Value.Holders, err = mergeHolders(inline, keyed.holders); err != nil {
		return cachedRecord{}, fmt.Errorf("decode %s: %w", key, malformedValue{err})
	}
	return cachedRecord{Record: r, raw: head, stored: stored}, nil
}

// mergeHolders merges two lists sorted by id; an id in both is damage.
func mergeHolders(a, b []Holder) ([]Holder, error) {
	if len(a) == 0 && b != nil {
		return b, nil
	}
	out := make([]Holder, 0, len(a)+len(b))
	for len(a) > 0 || len(b) > 0 {
		switch {
		case len(b) == 0 || len(a) > 0 && a[0].HolderID < b[0].HolderID:
			out, a = append(out, a[0]), a[1:]
		case len(a) == 0 || b[0].HolderID < a[0].HolderID:
			out, b = append(out, b[0]), b[1:]
		default:
			return nil, fmt.Errorf("holder %s is stored both in the record and under its own key", a[0].Name)
		}
	}
	return out, nil
}
