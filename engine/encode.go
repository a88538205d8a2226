package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/cockpitfs/cockpitfs/storage"
)

// The store's JSON and the lines readers read, in one place. What every commit or read touches is
// encoded without reflection (each function says why); each encoder writes exactly what
// encoding/json writes, which encode_test.go holds it to, and each hand-written decoder leaves
// whatever its encoder would not have written to encoding/json.

// appendJSONKey appends sep (the object's '{' or a ','), then "name":.
func appendJSONKey(b []byte, sep byte, name string) []byte {
	return append(append(append(b, sep, '"'), name...), '"', ':')
}

// appendJSONField appends sep, then "name":value with value a JSON string.
func appendJSONField(b []byte, sep byte, name, value string) []byte {
	return appendJSONString(appendJSONKey(b, sep, name), value, false)
}

// appendJSONString appends s quoted as encoding/json quotes it, the one quoter of this file:
// with escapeHTML, '<', '>' and '&' escaped as json.Marshal escapes them (the store's values, so
// a record reads byte for byte as it was always written); without, kept as they are, as an
// Encoder with SetEscapeHTML(false) writes them (the lines people read: events, health). Other
// printable ASCII but `"` and `\` stands as it is; a string with anything else (control
// characters, non-ASCII, invalid UTF-8) is left to encoding/json, so the two never differ.
func appendJSONString(b []byte, s string, escapeHTML bool) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || escapeHTML && (c == '<' || c == '>' || c == '&') {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(escapeHTML)
			_ = enc.Encode(s) // a string always encodes
			return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
		}
	}
	return append(append(append(b, '"'), s...), '"')
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

// appendRecordJSON appends r as json.Marshal encodes it, without reflection unless it has a drain
// (TestRecordJSONIsEncodingJSONs): every commit writes its record's head.
func appendRecordJSON(b []byte, r Record) ([]byte, error) {
	if r.Value.Drain != nil {
		data, err := json.Marshal(r)
		return append(b, data...), err
	}
	b = appendJSONString(appendJSONKey(b, '{', "format"), r.Format, true)
	b = appendJSONString(appendJSONKey(b, ',', "kind"), r.Kind, true)
	b = appendJSONString(appendJSONKey(b, ',', "cockpitId"), r.CockpitID, true)
	b = appendJSONString(appendJSONKey(b, ',', "subjectId"), r.SubjectID, true)
	b = strconv.AppendInt(appendJSONKey(b, ',', "revision"), r.Revision, 10)
	b = appendJSONString(appendJSONKey(b, ',', "updatedAt"), r.UpdatedAt, true)
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
		b = appendJSONString(b, *r.Value.LastReleasedHolder, true)
	}
	b = append(appendJSONKey(b, ',', "drain"), "null}"...)
	b = appendJSONString(appendJSONKey(b, ',', "cockpit"), r.Cockpit, true)
	b = appendJSONString(appendJSONKey(b, ',', "stack"), r.Stack, true)
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

func encodedLen(h Holder) int { return len(appendHolderJSON(nil, h)) }

// appendHolderJSON appends h as json.Marshal encodes it, without reflection
// (TestHolderJSONIsEncodingJSONs): a claim writes its holder, a release counts the bytes of the
// one it removes.
func appendHolderJSON(b []byte, h Holder) []byte {
	b = appendJSONString(appendJSONKey(b, '{', "holderId"), h.HolderID, true)
	b = appendJSONString(appendJSONKey(b, ',', "checkoutId"), h.CheckoutID, true)
	b = appendJSONString(appendJSONKey(b, ',', "claimedAt"), h.ClaimedAt, true)
	if h.PID != 0 {
		b = strconv.AppendInt(appendJSONKey(b, ',', "pid"), int64(h.PID), 10)
	}
	if h.ProcessStart != "" {
		b = appendJSONString(appendJSONKey(b, ',', "processStart"), h.ProcessStart, true)
	}
	b = appendJSONString(appendJSONKey(b, ',', "name"), h.Name, true)
	b = appendJSONString(appendJSONKey(b, ',', "checkoutPath"), h.CheckoutPath, true)
	return append(strconv.AppendUint(appendJSONKey(b, ',', "uid"), uint64(h.UID), 10), '}')
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
		b = strconv.AppendInt(append(appendJSONString(append(b, sep), k, true), ':'), int64(m[k]), 10)
		sep = ','
	}
	if sep == '{' {
		b = append(b, sep)
	}
	return append(b, '}')
}

// decodeHead decodes a record's head (see saveRecord): every field but the holders stored under
// their own keys.
func decodeHead(data []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return Record{}, fmt.Errorf("decode record: %w", malformedValue{err})
	}
	if r.Value.Holders == nil {
		r.Value.Holders = []Holder{}
	}
	return r, nil
}

// appendPortOwnerJSON appends o as json.Marshal encodes it (TestPortOwnerJSON), without
// reflection: a new lease writes an entry for each of its ports, and a check compares the stored
// entries with it instead of decoding them.
func appendPortOwnerJSON(b []byte, o PortOwner) []byte {
	b = strconv.AppendInt(append(b, `{"port":`...), int64(o.Port), 10)
	b = appendJSONString(appendJSONKey(b, ',', "cockpit"), o.Cockpit, true)
	b = appendJSONString(appendJSONKey(b, ',', "stack"), o.Stack, true)
	b = appendJSONString(appendJSONKey(b, ',', "key"), o.Key, true)
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

// appendJSON appends w as json.Marshal encodes it (keys sorted), without reflection when every
// key is a window's name (TestWindowsJSONIsEncodingJSONs): every commit writes the counts.
func (w windows) appendJSON(b []byte) ([]byte, error) {
	keys := make([]string, 0, len(w))
	for k := range w {
		if !plainWindowName(k) {
			data, err := json.Marshal(w)
			return append(b, data...), err
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	sep := byte('{')
	for _, k := range keys {
		b = strconv.AppendUint(appendJSONKey(b, sep, k), w[k], 10)
		sep = ','
	}
	if sep == '{' {
		b = append(b, sep)
	}
	return append(b, '}'), nil
}

// decodeWindows is json.Unmarshal of data into a fresh windows when data is as appendJSON writes
// it (no space, keys of window names, counts as decodeInteger takes them); false leaves anything
// else to json.Unmarshal.
func decodeWindows(data []byte) (windows, bool) {
	w := windows{}
	if string(data) == "{}" {
		return w, true
	}
	if len(data) < 2 || data[0] != '{' || data[len(data)-1] != '}' {
		return nil, false
	}
	for field := range bytes.SplitSeq(data[1:len(data)-1], []byte(",")) {
		key, count, ok := bytes.Cut(field, []byte(":"))
		if !ok || len(key) < 2 || key[0] != '"' || key[len(key)-1] != '"' || !plainWindowName(string(key[1:len(key)-1])) {
			return nil, false
		}
		var n uint64
		if !decodeInteger(count, &n) {
			return nil, false
		}
		w[string(key[1:len(key)-1])] = n
	}
	return w, true
}

// plainWindowName says k is a name windowOf gives (the history's, or a uid's), which JSON
// writes as it is.
func plainWindowName(k string) bool {
	if k == historyWindow {
		return true
	}
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < '0' || k[i] > '9' {
			return false
		}
	}
	return true
}

// appendJSON appends h as json.Marshal encodes it, without reflection when its windows allow
// (TestEventsHeadJSONIsEncodingJSONs): every commit writes one.
func (h eventsHead) appendJSON(b []byte) ([]byte, error) {
	b = strconv.AppendUint(appendJSONKey(b, '{', "seq"), h.Seq, 10)
	b = strconv.AppendInt(appendJSONKey(b, ',', "end"), h.End, 10)
	b, err := h.Windows.appendJSON(appendJSONKey(b, ',', "windows"))
	return append(b, '}'), err
}

// decodeEventsHead reads what appendJSON writes without reflection, anything else with
// encoding/json.
func decodeEventsHead(data []byte) (eventsHead, error) {
	var h eventsHead
	rest, ok := bytes.CutPrefix(data, []byte(`{"seq":`))
	var seq, end, windowsJSON []byte
	if ok {
		seq, rest, ok = bytes.Cut(rest, []byte(`,"end":`))
	}
	if ok {
		end, rest, ok = bytes.Cut(rest, []byte(`,"windows":`))
	}
	if ok {
		windowsJSON, ok = bytes.CutSuffix(rest, []byte("}"))
	}
	if ok && decodeInteger(seq, &h.Seq) && decodeInteger(end, &h.End) {
		if h.Windows, ok = decodeWindows(windowsJSON); ok {
			return h, nil
		}
	}
	h = eventsHead{}
	if err := json.Unmarshal(data, &h); err != nil {
		return h, malformedValue{err}
	}
	if h.Windows == nil {
		h.Windows = windows{}
	}
	return h, nil
}

// appendEventJSON appends e as encoding/json encodes it without HTML escaping, so that a fix like
// "echo sleep > drain/request" reads as written (TestEventJSONIsEncodingJSONs), without
// reflection: every commit writes one.
func appendEventJSON(b []byte, e event) []byte {
	b = appendJSONField(b, '{', "at", e.At)
	b = appendJSONField(b, ',', "op", e.Op)
	b = appendJSONField(b, ',', "path", e.Path)
	b = strconv.AppendInt(appendJSONKey(b, ',', "pid"), int64(e.PID), 10)
	b = strconv.AppendUint(appendJSONKey(b, ',', "uid"), uint64(e.UID), 10)
	b = appendJSONField(b, ',', "result", e.Result)
	for _, f := range [...]struct{ name, value string }{{"code", string(e.Code)}, {"errno", e.Errno}, {"message", e.Message}, {"fix", e.Fix}} {
		if f.value != "" {
			b = appendJSONField(b, ',', f.name, f.value)
		}
	}
	if e.Unshown != 0 {
		b = strconv.AppendInt(appendJSONKey(b, ',', "unshown"), int64(e.Unshown), 10)
	}
	if e.Revision != nil {
		b = strconv.AppendInt(appendJSONKey(b, ',', "revision"), *e.Revision, 10)
	}
	if e.Warning != "" {
		b = appendJSONField(b, ',', "warning", e.Warning)
	}
	return append(b, '}')
}

// AppendJSON appends o as encoding/json encodes it with HTML escaping off, without a newline.
// Written out, since health is encoded at every open and reflection was a sixth of the
// observation's CPU; TestObservationJSONIsEncodingJSONs holds the two together.
func (o Observation) AppendJSON(b []byte) []byte {
	b = appendJSONField(b, '{', "code", o.Code)
	b = appendJSONField(b, ',', "result", o.Result)
	b = appendJSONField(b, ',', "owner", o.Owner)
	b = appendJSONField(b, ',', "stackId", o.StackID)
	b = appendJSONField(b, ',', "source", o.Source)
	if o.Target != "" {
		b = appendJSONField(b, ',', "target", o.Target)
	}
	b = appendJSONKey(b, ',', "observed")
	b = appendJSONField(b, '{', "state", o.Observed.State)
	if o.Observed.Value != nil {
		b = strconv.AppendBool(append(b, `,"value":`...), *o.Observed.Value)
	}
	if o.Observed.Reason != "" {
		b = appendJSONField(b, ',', "reason", o.Observed.Reason)
	}
	b = appendJSONField(b, ',', "observedAt", o.Observed.ObservedAt)
	b = appendJSONKey(append(b, '}'), ',', "expectation")
	b = appendJSONField(b, '{', "kind", o.Expectation.Kind)
	b = strconv.AppendBool(append(b, `,"value":`...), o.Expectation.Value)
	b = appendJSONKey(append(b, '}'), ',', "applicability")
	b = appendJSONField(b, '{', "state", o.Applicability.State)
	b = appendJSONField(b, ',', "posture", o.Applicability.Posture)
	b = appendJSONKey(append(b, '}'), ',', "freshness")
	b = appendJSONField(b, '{', "state", o.Freshness.State)
	b = appendJSONField(append(b, '}'), ',', "remedy", o.Remedy)
	return append(b, '}')
}
