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

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/storage"
)

// Keys of the store. Names never hold '/', so it separates components unambiguously.
//
//	c/<cockpit>              cockpitMeta
//	s/<cockpit>/<stack>      the stack's Record without its holders: its head (see saveRecord)
//	h/<cockpit>/<stack>/<holderId>        one Holder of the stack
//	d/<cockpit>/<stack>      DeclaredValues of the stack (declared-values)
//	p/<port, 5 digits>       PortOwner: the machine-wide index of active leases
//	n/<cockpit>              number of active leases in the cockpit
//	l/<cockpit>              the ports of the cockpit's active leases, sorted (see leasedPorts)
//	u/<uid>                  number of active leases taken by the uid's claims, every cockpit
//	e/<cockpit>/<stack|->/<seq, 16 hex>   one events line; "-" is the cockpit's own log
//	q/<cockpit>/<stack|->    the next events seq
//	o/<cockpit>/<stack|->    the events file's end: bytes ever appended to it (see EventsWindow)
//	w/<cockpit>/<stack|->    how many lines were ever appended to each window of the events file
//	x/<cockpit>/<stack|->/<window>/<n, 16 hex>   the seq of the window's line n (see appendEvent)
//	m/<boot id>/<daemon>     a daemon of that boot is alive (shared stores only; see machines)
const cockpitLevel = "-"

// Prefixes of whole key families, for scans.
const (
	cockpitsPrefix   = "c/"
	allStacksPrefix  = "s/"
	allHoldersPrefix = "h/"
	portsPrefix      = "p/"
	allEventsPrefix  = "e/"
	uidLeasesPrefix  = "u/"
	declaredPrefix   = "d/"
)

func cockpitKey(cockpit string) string      { return cockpitsPrefix + cockpit }
func stackKey(cockpit, stack string) string { return allStacksPrefix + cockpit + "/" + stack }
func stacksPrefix(cockpit string) string    { return allStacksPrefix + cockpit + "/" }
func holdersPrefix(cockpit, stack string) string {
	return allHoldersPrefix + cockpit + "/" + stack + "/"
}
func holderKey(cockpit, stack, id string) string { return holdersPrefix(cockpit, stack) + id }
func cockpitHoldersPrefix(cockpit string) string { return allHoldersPrefix + cockpit + "/" }

// holderStackKey is the key of the stack whose holder's key is key.
func holderStackKey(key string) string {
	cockpit, rest, _ := strings.Cut(strings.TrimPrefix(key, allHoldersPrefix), "/")
	stack, _, _ := strings.Cut(rest, "/")
	return stackKey(cockpit, stack)
}

// declaredValuesKey holds a stack's DeclaredValues beside its record, so recording them neither
// moves the stack's revision nor waits for its drain.
func declaredValuesKey(cockpit, stack string) string { return declaredPrefix + cockpit + "/" + stack }
func portKey(port int) string {
	b := append(make([]byte, 0, len(portsPrefix)+5), portsPrefix...)
	for div := 10000; div > 1 && port < div; div /= 10 { // zero-padded to five digits
		b = append(b, '0')
	}
	return string(strconv.AppendInt(b, int64(port), 10))
}
func leaseCountKey(cockpit string) string            { return "n/" + cockpit }
func leasedPortsKey(cockpit string) string           { return "l/" + cockpit }
func uidLeasesKey(uid uint32) string                 { return fmt.Sprintf("%s%d", uidLeasesPrefix, uid) }
func eventsPrefix(cockpit, stack string) string      { return allEventsPrefix + cockpit + "/" + stack + "/" }
func eventsHeadKey(cockpit, stack string) string     { return "f/" + cockpit + "/" + stack }
func eventsSeqKey(cockpit, stack string) string      { return "q/" + cockpit + "/" + stack }
func eventsEndKey(cockpit, stack string) string      { return "o/" + cockpit + "/" + stack }
func eventsWindowsKey(cockpit, stack string) string  { return "w/" + cockpit + "/" + stack }
func eventsIndexPrefix(cockpit, stack string) string { return "x/" + cockpit + "/" + stack + "/" }
func eventsIndexKey(cockpit, stack, window string, n uint64) string {
	return string(appendHex16(append(append([]byte(eventsIndexPrefix(cockpit, stack)), window...), '/'), n))
}
func eventKey(cockpit, stack string, seq uint64) string {
	return string(appendHex16([]byte(eventsPrefix(cockpit, stack)), seq))
}

// appendHex16 appends n as 16 lowercase hex digits (fmt's %016x), so keys sort in number order.
func appendHex16(b []byte, n uint64) []byte {
	var digits [16]byte
	for i := len(digits) - 1; i >= 0; i-- {
		digits[i] = "0123456789abcdef"[n&0xf]
		n >>= 4
	}
	return append(b, digits[:]...)
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

// appendPortOwnerJSON appends o as json.Marshal encodes it (TestPortOwnerJSON), without
// reflection: a new lease writes an entry for each of its ports, and a check compares the stored
// entries with it instead of decoding them.
func appendPortOwnerJSON(b []byte, o PortOwner) []byte {
	b = strconv.AppendInt(append(b, `{"port":`...), int64(o.Port), 10)
	b = appendJSONStringHTML(appendJSONKey(b, ',', "cockpit"), o.Cockpit)
	b = appendJSONStringHTML(appendJSONKey(b, ',', "stack"), o.Stack)
	b = appendJSONStringHTML(appendJSONKey(b, ',', "key"), o.Key)
	return append(strconv.AppendInt(append(b, `,"offset":`...), int64(o.Offset), 10), '}')
}

// decodePortOwner is json.Unmarshal of an index entry as appendPortOwnerJSON writes it, without
// reflection: a claim reads the entry of every occupied family it passes (TestPortOwnerJSON).
// false leaves anything else, names JSON escapes among them, to json.Unmarshal.
func decodePortOwner(data []byte) (PortOwner, bool) {
	var o PortOwner
	port, cockpit, stack, key, offset, ok := portOwnerFields(data)
	if !ok || !decodeInteger(port, &o.Port) || !decodeInteger(offset, &o.Offset) {
		return PortOwner{}, false
	}
	o.Cockpit, o.Stack, o.Key = string(cockpit), string(stack), string(key)
	return o, true
}

// portOwnerFields splits an index entry as appendPortOwnerJSON writes it into its fields' JSON,
// each name a string that decodes to its bytes as they are; false for anything else.
func portOwnerFields(data []byte) (port, cockpit, stack, key, offset []byte, ok bool) {
	rest, ok := bytes.CutPrefix(data, []byte(`{"port":`))
	if ok {
		port, rest, ok = bytes.Cut(rest, []byte(`,"cockpit":"`))
	}
	if ok {
		cockpit, rest, ok = bytes.Cut(rest, []byte(`","stack":"`))
	}
	if ok {
		stack, rest, ok = bytes.Cut(rest, []byte(`","key":"`))
	}
	if ok {
		key, rest, ok = bytes.Cut(rest, []byte(`","offset":`))
	}
	if ok {
		offset, ok = bytes.CutSuffix(rest, []byte("}"))
	}
	ok = ok && plainJSONString(cockpit) && plainJSONString(stack) && plainJSONString(key)
	return port, cockpit, stack, key, offset, ok
}

// plainJSONString says the bytes between a JSON string's quotes are printable ASCII with no quote
// or backslash: what the string decodes to, as they are.
func plainJSONString(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

func getJSON(tx storage.Txn, key string, v any) (bool, error) {
	data, err := tx.Get(key)
	if errors.Is(err, storage.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, decodeJSON(key, data, v)
}

// decodeJSON is json.Unmarshal of key's value data into v, without reflection for the values
// every commit or lease reads.
func decodeJSON(key string, data []byte, v any) error {
	if decodeInteger(data, v) {
		return nil
	}
	if w, ok := v.(*windows); ok {
		if decoded, ok := decodeWindows(data); ok {
			*w = decoded
			return nil
		}
	}
	if o, ok := v.(*PortOwner); ok {
		if decoded, ok := decodePortOwner(data); ok {
			*o = decoded
			return nil
		}
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode %s: %w", key, malformedValue{err})
	}
	return nil
}

// decodeInteger is json.Unmarshal of data into v, an *int, *int64 or *uint64, when data is an
// integer as JSON writes it (no sign but '-', no leading zero): the counts and sequence numbers
// every commit reads, decoded without reflection (TestIntegersDecodeAsJSON). false leaves
// anything else, v untouched, to json.Unmarshal.
func decodeInteger(data []byte, v any) bool {
	digits := bytes.TrimPrefix(data, []byte("-"))
	if len(digits) == 0 || len(digits) > 1 && digits[0] == '0' {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	switch p := v.(type) {
	case *uint64:
		n, err := strconv.ParseUint(string(data), 10, 64)
		if err != nil {
			return false
		}
		*p = n
	case *int64:
		n, err := strconv.ParseInt(string(data), 10, 64)
		if err != nil {
			return false
		}
		*p = n
	case *int:
		n, err := strconv.Atoi(string(data))
		if err != nil {
			return false
		}
		*p = n
	default:
		return false
	}
	return true
}

func setJSON(tx storage.Txn, key string, v any) error {
	switch n := v.(type) { // the counts and sequence numbers every commit writes, without reflection
	case int:
		return tx.Set(key, strconv.AppendInt(nil, int64(n), 10))
	case int64:
		return tx.Set(key, strconv.AppendInt(nil, n, 10))
	case uint64:
		return tx.Set(key, strconv.AppendUint(nil, n, 10))
	case PortOwner: // a new lease's port index entries
		return tx.Set(key, appendPortOwnerJSON(make([]byte, 0, 96), n))
	case windows: // an events file's counts
		data, err := n.appendJSON(make([]byte, 0, 32))
		if err != nil {
			return err
		}
		return tx.Set(key, data)
	}
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

// A stack's record is stored in pieces, so that a commit costs what it changes, not what the
// stack holds: the head (the record without its holders) under the stack's key, and each holder
// under a key of its own. Every commit on a stack writes its head (the revision moves), so a
// transaction that Gets the head conflicts with any change of the stack's holders, and head bytes
// seen before name the same holders: the cache may serve them without reading the holders' keys.
//
// A record written before holders had keys keeps them in its head ("inline"); it reads the same,
// and each commit on it moves up to migrateBatch of them to their own keys (a store may limit a
// transaction's writes: etcd's --max-txn-ops defaults to 128).
const migrateBatch = 64

// storedHolders is where a record's holders lie in the store.
type storedHolders struct {
	inline []Holder // still in the head, sorted
	bytes  int      // the JSON of every holder, summed: the record's size without encoding it
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

func encodedLen(h Holder) int { return len(appendHolderJSON(nil, h)) }

// appendHolderJSON appends h as json.Marshal encodes it, without reflection
// (TestHolderJSONIsEncodingJSONs): a claim writes its holder, a release counts the bytes of the
// one it removes.
func appendHolderJSON(b []byte, h Holder) []byte {
	b = appendJSONStringHTML(appendJSONKey(b, '{', "holderId"), h.HolderID)
	b = appendJSONStringHTML(appendJSONKey(b, ',', "checkoutId"), h.CheckoutID)
	b = appendJSONStringHTML(appendJSONKey(b, ',', "claimedAt"), h.ClaimedAt)
	if h.PID != 0 {
		b = strconv.AppendInt(appendJSONKey(b, ',', "pid"), int64(h.PID), 10)
	}
	if h.ProcessStart != "" {
		b = appendJSONStringHTML(appendJSONKey(b, ',', "processStart"), h.ProcessStart)
	}
	b = appendJSONStringHTML(appendJSONKey(b, ',', "name"), h.Name)
	b = appendJSONStringHTML(appendJSONKey(b, ',', "checkoutPath"), h.CheckoutPath)
	return append(strconv.AppendUint(appendJSONKey(b, ',', "uid"), uint64(h.UID), 10), '}')
}

// appendRecordJSON appends r as json.Marshal encodes it, without reflection unless it has a drain
// (TestRecordJSONIsEncodingJSONs): every commit writes its record's head.
func appendRecordJSON(b []byte, r Record) ([]byte, error) {
	if r.Value.Drain != nil {
		data, err := json.Marshal(r)
		return append(b, data...), err
	}
	b = appendJSONStringHTML(appendJSONKey(b, '{', "format"), r.Format)
	b = appendJSONStringHTML(appendJSONKey(b, ',', "kind"), r.Kind)
	b = appendJSONStringHTML(appendJSONKey(b, ',', "cockpitId"), r.CockpitID)
	b = appendJSONStringHTML(appendJSONKey(b, ',', "subjectId"), r.SubjectID)
	b = strconv.AppendInt(appendJSONKey(b, ',', "revision"), r.Revision, 10)
	b = appendJSONStringHTML(appendJSONKey(b, ',', "updatedAt"), r.UpdatedAt)
	b = appendJSONKey(appendJSONKey(b, ',', "value"), '{', "holders")
	if r.Value.Holders == nil {
		b = append(b, "null"...)
	} else {
		sep := byte('[')
		for _, h := range r.Value.Holders {
			b = appendHolderJSON(append(b, sep), h)
			sep = ','
		}
		if sep == '[' {
			b = append(b, sep)
		}
		b = append(b, ']')
	}
	b = appendJSONKey(b, ',', "lease")
	if l := r.Value.Lease; l == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(appendJSONKey(b, '{', "offset"), int64(l.Offset), 10)
		b = appendPortsJSON(appendJSONKey(b, ',', "ports"), l.Ports)
		b = strconv.AppendBool(appendJSONKey(b, ',', "released"), l.Released)
		b = strconv.AppendInt(appendJSONKey(appendJSONKey(b, ',', "declaration"), '{', "step"), int64(l.Declaration.Step), 10)
		b = strconv.AppendInt(appendJSONKey(b, ',', "count"), int64(l.Declaration.Count), 10)
		b = append(appendPortsJSON(appendJSONKey(b, ',', "bases"), l.Declaration.Bases), '}')
		if l.UID != nil {
			b = strconv.AppendUint(appendJSONKey(b, ',', "uid"), uint64(*l.UID), 10)
		}
		b = append(b, '}')
	}
	b = appendJSONKey(b, ',', "lastReleasedHolder")
	if r.Value.LastReleasedHolder == nil {
		b = append(b, "null"...)
	} else {
		b = appendJSONStringHTML(b, *r.Value.LastReleasedHolder)
	}
	b = append(appendJSONKey(b, ',', "drain"), "null}"...)
	b = appendJSONStringHTML(appendJSONKey(b, ',', "cockpit"), r.Cockpit)
	b = appendJSONStringHTML(appendJSONKey(b, ',', "stack"), r.Stack)
	if r.Creator != nil {
		b = strconv.AppendUint(appendJSONKey(b, ',', "creator"), uint64(*r.Creator), 10)
	}
	if r.Mode != nil {
		b = strconv.AppendUint(appendJSONKey(b, ',', "mode"), uint64(*r.Mode), 10)
	}
	if r.GID != nil {
		b = strconv.AppendUint(appendJSONKey(b, ',', "gid"), uint64(*r.GID), 10)
	}
	return append(b, '}'), nil
}

// appendPortsJSON appends m as json.Marshal encodes a map: null when nil, keys sorted.
func appendPortsJSON(b []byte, m map[string]int) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	sep := byte('{')
	for _, k := range keys {
		b = strconv.AppendInt(append(appendJSONStringHTML(append(b, sep), k), ':'), int64(m[k]), 10)
		sep = ','
	}
	if sep == '{' {
		b = append(b, sep)
	}
	return append(b, '}')
}

// appendJSONStringHTML appends s quoted as json.Marshal quotes it, HTML characters escaped:
// printable ASCII other than `"`, `\`, `<`, `>` and `&` stands as it is; a string with anything
// else is left to json.Marshal.
func appendJSONStringHTML(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			data, _ := json.Marshal(s) // a string always encodes
			return append(b, data...)
		}
	}
	return append(append(append(b, '"'), s...), '"')
}

// saveRecord writes next, which follows prev (zero for a new stack), after checking every
// invariant: a transition that would break one is a bug and commits nothing. It writes next's
// head and the holders that differ from prev's, and returns what it wrote.
func saveRecord(tx storage.Txn, prev cachedRecord, next Record) (cachedRecord, error) {
	var err error
	if prev.checked {
		err = check(next, prev.Value) // prev passed when it was saved
	} else {
		err = checkRecord(next)
	}
	if err != nil {
		return cachedRecord{}, refuse(StateRecordMalformed, next.SubjectID, "report this as a cockpitfs bug", "transition would break the record's invariants: %v", err)
	}
	stored, err := saveHolders(tx, prev, next)
	if err != nil {
		return cachedRecord{}, err
	}
	head := next
	head.Value.Holders = stored.inline
	data, err := appendRecordJSON(make([]byte, 0, 1024), head)
	if err != nil {
		return cachedRecord{}, err
	}
	// The record as read: the head with every holder in place of null or the inline ones.
	size := len(data) - len(`null`) + len(`[]`) + stored.bytes + max(len(next.Value.Holders)-1, 0)
	if len(stored.inline) > 0 {
		inline, _ := json.Marshal(stored.inline)
		size = len(data) - len(inline) + len(`[]`) + stored.bytes + max(len(next.Value.Holders)-1, 0)
	}
	if size > maxRecordBytes {
		return cachedRecord{}, refuse(StateRecordTooLarge, next.SubjectID, "release holders, or claim with shorter checkout paths",
			"the stack's record would be %d bytes, more than %d", size, maxRecordBytes)
	}
	return cachedRecord{Record: next, raw: data, stored: stored, checked: true}, tx.Set(stackKey(next.Cockpit, next.Stack), data)
}

// saveHolders writes the holders of next that prev does not hold as they are, and deletes those
// next no longer holds. Both lists are sorted by id (next's was checked).
func saveHolders(tx storage.Txn, prev cachedRecord, next Record) (storedHolders, error) {
	stored := storedHolders{bytes: prev.stored.bytes}
	inline := map[string]bool{}
	for _, h := range prev.stored.inline {
		inline[h.HolderID] = true
	}
	moves := migrateBatch
	write := func(h Holder) error {
		data := appendHolderJSON(make([]byte, 0, 256), h)
		stored.bytes += len(data)
		return tx.Set(holderKey(next.Cockpit, next.Stack, h.HolderID), data)
	}
	before, after := prev.Value.Holders, next.Value.Holders
	for len(before) > 0 || len(after) > 0 {
		var err error
		switch {
		case len(after) == 0 || len(before) > 0 && before[0].HolderID < after[0].HolderID:
			gone := before[0]
			stored.bytes -= encodedLen(gone)
			if !inline[gone.HolderID] {
				err = tx.Delete(holderKey(next.Cockpit, next.Stack, gone.HolderID))
			}
			before = before[1:]
		case len(before) == 0 || after[0].HolderID < before[0].HolderID:
			err = write(after[0])
			after = after[1:]
		default:
			was, is := before[0], after[0]
			switch {
			case was != is:
				stored.bytes -= encodedLen(was)
				err = write(is)
			case !inline[is.HolderID]:
			case moves > 0:
				moves--
				stored.bytes -= encodedLen(was)
				err = write(is)
			default:
				stored.inline = append(stored.inline, is)
			}
			before, after = before[1:], after[1:]
		}
		if err != nil {
			return storedHolders{}, err
		}
	}
	return stored, nil
}

// reindexLease moves the port index, the cockpit's active-lease count and the count of the uid
// the lease counts against from before's lease to after's. Every key is read with Get so a concurrent lease of the same port conflicts.
func reindexLease(tx storage.Txn, cockpit, stack string, before, after *Lease) error {
	if before.Active() && after.Active() && before.Offset == after.Offset {
		return recharge(tx, leaseUID(before), leaseUID(after))
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
	if err := reindexLeasedPorts(tx, cockpit, before, after); err != nil {
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
	if err := addCount(tx, leaseCountKey(cockpit), delta); err != nil {
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
	return addCount(tx, uidLeasesKey(*charged.UID), delta)
}

// recharge moves an active lease's count from the uid it counted against to the one it counts
// against now (chargeLease): a takeover's, or a release of the last holder of the first.
func recharge(tx storage.Txn, was, is *uint32) error {
	if was == nil || is == nil || *was == *is {
		return nil
	}
	if err := addCount(tx, uidLeasesKey(*was), -1); err != nil {
		return err
	}
	return addCount(tx, uidLeasesKey(*is), 1)
}

// leasedPorts is the set of ports the cockpit's active leases hold, as kept at its
// leasedPortsKey, so that a new lease passes the families its cockpit leases without reading
// each one's index entry. A cockpit without active leases holds none, whatever the key says.
// known is false for a store written before the key, where a cockpit with active leases has
// none yet: its next lease change writes it (reindexLeasedPorts).
func leasedPorts(tx storage.Txn, cockpit string) (ports []int, known bool, err error) {
	var n int
	if _, err := getJSON(tx, leaseCountKey(cockpit), &n); err != nil || n == 0 {
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
// store) is read from that index instead, this change included.
func reindexLeasedPorts(tx storage.Txn, cockpit string, before, after *Lease) error {
	ports, known, err := leasedPorts(tx, cockpit)
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

// appendPorts appends ports as encoding/json encodes an []int (TestLeasedPortsJSON).
func appendPorts(b []byte, ports []int) []byte {
	b = append(b, '[')
	for i, p := range ports {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(p), 10)
	}
	return append(b, ']')
}

// decodePorts reads what appendPorts writes without reflection (each port as decodeInteger reads
// an integer), anything else with encoding/json.
func decodePorts(data []byte) ([]int, error) {
	if inner, ok := bytes.CutPrefix(data, []byte("[")); ok && len(inner) > 1 {
		if inner, ok = bytes.CutSuffix(inner, []byte("]")); ok {
			ports := make([]int, 0, bytes.Count(inner, []byte(","))+1)
			for field := range bytes.SplitSeq(inner, []byte(",")) {
				var p int
				if !decodeInteger(field, &p) {
					ok = false
					break
				}
				ports = append(ports, p)
			}
			if ok {
				return ports, nil
			}
		}
	}
	var ports []int
	err := json.Unmarshal(data, &ports)
	return ports, err
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

func splitStackKey(key string) (cockpit, stack string) {
	rest := strings.TrimPrefix(key, allStacksPrefix)
	cockpit, stack, _ = strings.Cut(rest, "/")
	return cockpit, stack
}
