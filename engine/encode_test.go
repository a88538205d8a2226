package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
)

// The events line written by hand is the line encoding/json (without HTML escaping) writes, for
// every field set or left out, and for texts that need escaping.
func TestEventJSONIsEncodingJSONs(t *testing.T) {
	rev := int64(42)
	neg := int64(-1)
	for _, e := range []event{
		{},
		{At: "2026-12-01T03:00:00.000Z", Op: "create", Path: "app/stacks/s/holders/c", PID: 4242, UID: 1000, Result: "ok", Revision: &rev},
		{Op: "write", Path: "app/stacks/s/drain/request", PID: -1, UID: math.MaxUint32, Result: "refused", Code: PortLeaseExhausted, Errno: "EBUSY",
			Message: "quote \" backslash \\ newline \n tab \t nul \x00 <html> & é 🚀 \u2028 \xff invalid", Fix: "echo sleep > drain/request", Unshown: 1234, Revision: &neg},
		{Result: "ok", Warning: "skipped candidate families: port 20000 is held by <pid 7>"},
	} {
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(e); err != nil {
			t.Fatal(err)
		}
		if got := appendEventJSON(nil, e); string(got)+"\n" != want.String() {
			t.Errorf("event %+v:\n got %s\nwant %s", e, got, want.String())
		}
	}
}

// decodeInteger decodes what json.Unmarshal decodes, to the same value, and leaves anything else
// (and the target untouched) to it.
func TestIntegersDecodeAsJSON(t *testing.T) {
	t.Parallel()
	inputs := []string{"0", "7", "-1", "-0", "007", "+5", " 5", "5 ", "1e3", "1.0", "", "-", "0x10", "null", `"5"`,
		"9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
		"18446744073709551615", "18446744073709551616"}
	for _, in := range inputs {
		for _, target := range []func() any{func() any { return new(int) }, func() any { return new(int64) }, func() any { return new(uint64) }} {
			fast, slow := target(), target()
			untouched := reflect.ValueOf(fast).Elem().Interface()
			jsonErr := json.Unmarshal([]byte(in), slow)
			if decodeInteger([]byte(in), fast) {
				if jsonErr != nil || !reflect.DeepEqual(fast, slow) {
					t.Errorf("decodeInteger(%q) into %T = %v; json.Unmarshal: %v, %v", in, fast, reflect.ValueOf(fast).Elem(), reflect.ValueOf(slow).Elem(), jsonErr)
				}
			} else if got := reflect.ValueOf(fast).Elem().Interface(); got != untouched {
				t.Errorf("decodeInteger(%q) into %T declined but wrote %v", in, fast, got)
			}
		}
	}
	// What the commits write, it takes.
	for _, v := range []any{0, 7, -1, int64(math.MinInt64), uint64(math.MaxUint64)} {
		data, _ := json.Marshal(v)
		target := reflect.New(reflect.TypeOf(v))
		if !decodeInteger(data, target.Interface()) || target.Elem().Interface() != v {
			t.Errorf("decodeInteger(%s) into %T = %v, want %v taken", data, target.Interface(), target.Elem(), v)
		}
	}
	if decodeInteger([]byte("5"), new(string)) {
		t.Error("decodeInteger took a string target")
	}
}

// The keys formatted by hand are fmt's.
func TestEventKeysAreFmts(t *testing.T) {
	for _, n := range []uint64{0, 1, 0xabc, math.MaxUint64} {
		if got, want := eventKey("app", "s", n), fmt.Sprintf("%s%016x", eventsPrefix("app", "s"), n); got != want {
			t.Errorf("eventKey(%d) = %s, want %s", n, got, want)
		}
		if got, want := eventsIndexKey("app", "-", "h", n), fmt.Sprintf("%s%s/%016x", eventsIndexPrefix("app", "-"), "h", n); got != want {
			t.Errorf("eventsIndexKey(%d) = %s, want %s", n, got, want)
		}
	}
}

// An events file's counts are written as json.Marshal writes them, and read as json.Unmarshal
// reads them, whatever the store holds.
func TestWindowsJSONIsEncodingJSONs(t *testing.T) {
	for _, w := range []windows{{}, {"h": 0}, {"h": 256, "0": 32, "1000": 7, "4294967295": math.MaxUint64}, {"h": 1, "<b>": 2}, {"": 3}, {"é\"": 4}} {
		want, err := json.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		got, err := w.appendJSON(nil)
		if err != nil || string(got) != string(want) {
			t.Errorf("%v.appendJSON = %s, %v; json.Marshal: %s", w, got, err, want)
		}
	}
	inputs := []string{`{}`, `{"h":3}`, `{"0":32,"h":256}`, `{"h":1,"h":2}`, `{"h":18446744073709551615}`, `{"h":18446744073709551616}`,
		`{"h":-1}`, `{"h":01}`, `{"h":1.5}`, `{"h": 1}`, ` {"h":1}`, `{"h":1,}`, `{,}`, `{"h"}`, `{"h":}`, `{h:1}`, `{"x":1}`, `{"<":1}`,
		`{"\u0068":1}`, `{"":1}`, `null`, `[]`, `{`, ``, `{"h":1}{}`, `{"h":"1"}`}
	for _, in := range inputs {
		var slow windows
		jsonErr := json.Unmarshal([]byte(in), &slow)
		if fast, ok := decodeWindows([]byte(in)); ok && (jsonErr != nil || !reflect.DeepEqual(fast, slow)) {
			t.Errorf("decodeWindows(%s) = %v; json.Unmarshal: %v, %v", in, fast, slow, jsonErr)
		}
	}
	// What the commits write, it takes.
	for _, w := range []windows{{}, {"h": 5}, {"0": 1, "h": 2}} {
		data, _ := w.appendJSON(nil)
		if got, ok := decodeWindows(data); !ok || !reflect.DeepEqual(got, w) {
			t.Errorf("decodeWindows(%s) = %v, %v; want %v taken", data, got, ok, w)
		}
	}
}

// A holder is written as json.Marshal writes it, HTML characters escaped as it escapes them.
func TestHolderJSONIsEncodingJSONs(t *testing.T) {
	for _, h := range []Holder{
		{},
		{HolderID: holderID("c"), CheckoutID: checkoutID("/src/c"), ClaimedAt: "2026-12-01T03:00:00.000Z", PID: 4242,
			ProcessStart: "proc:0b6d3c4e-2f1a-4c5b-9d8e-7f6a5b4c3d2e:123456", Name: "c", CheckoutPath: "/src/c", UID: 1000},
		{Name: "n", CheckoutPath: "/src/a <b> & \"c\" \\ é 🚀 \u2028 \x00 \n \xff", PID: -1, UID: math.MaxUint32},
		{HolderID: "x&y", ProcessStart: "<>", CheckoutPath: "/"},
	} {
		want, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendHolderJSON(nil, h); string(got) != string(want) {
			t.Errorf("holder %+v:\n got %s\nwant %s", h, got, want)
		}
	}
}

// A record's head is written as json.Marshal writes it.
func TestRecordJSONIsEncodingJSONs(t *testing.T) {
	uid, creator, last := uint32(1000), uint32(0), holderID("gone")
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	fresh := newRecord("app", "s", 1000, 1000, now)
	lease := &Lease{Offset: 20, Ports: map[string]int{"HTTP": 20020, "DB": 20520, "a<b>&": 1, "é": 2}, Declaration: portdecl.Declaration{Step: 10, Count: 20, Bases: map[string]int{"HTTP": 20000, "DB": 20500}}, UID: &uid}
	held := fresh
	held.Revision, held.Value = 7, Value{Lease: lease, LastReleasedHolder: &last}
	inline := held
	inline.Value.Holders = []Holder{{HolderID: holderID("a"), Name: "a", CheckoutPath: "/src/<a>", PID: 42}, {HolderID: holderID("b"), Name: "b"}}
	released := held
	released.Creator = &creator
	released.Value.Lease = &Lease{Released: true}
	empty := held
	empty.Creator, empty.Value.Holders, empty.Value.Lease = nil, []Holder{}, &Lease{Ports: map[string]int{}, Declaration: portdecl.Declaration{Bases: map[string]int{}}}
	drained := held
	drained.Value.Drain = &Drain{CoordinationRevision: 3, ReservedAt: "<now>"}
	for _, r := range []Record{{}, fresh, held, inline, released, empty, drained} {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := appendRecordJSON(nil, r); err != nil || string(got) != string(want) {
			t.Errorf("record %+v:\n got %s, %v\nwant %s", r, got, err, want)
		}
	}
}

// An identity is its prefix, the digest and its suffix whether it was remembered or not, for
// strings too long to be remembered too, and past the bound.
func TestIdentities(t *testing.T) {
	long := "/" + strings.Repeat("d", maxRememberedIdentity)
	for range 2 { // the second round is answered from what the first remembered
		for _, c := range []struct{ got, want string }{
			{cockpitID("app"), "cockpit:" + digest("app")},
			{StackID("app", "s"), "stack:" + digest("app/s")},
			{holderID("c"), "holder:" + digest("c") + ":session"},
			{checkoutID("/src/c"), "checkout:" + digest("/src/c")},
			{checkoutID(long), "checkout:" + digest(long)},
			{cockpitID("c"), "cockpit:" + digest("c")}, // the same string under another prefix
		} {
			if c.got != c.want {
				t.Errorf("identity %s, want %s", c.got, c.want)
			}
		}
	}
	for i := range maxIdentities + 10 {
		name := strconv.Itoa(i)
		if got, want := holderID(name), "holder:"+digest(name)+":session"; got != want {
			t.Fatalf("holderID(%s) = %s, want %s", name, got, want)
		}
	}
	identities.mu.Lock()
	defer identities.mu.Unlock()
	if n := len(identities.m); n > maxIdentities {
		t.Errorf("%d identities remembered, more than %d", n, maxIdentities)
	}
}

// ParseStamp takes exactly what time.Parse takes and formats back to the same text, and reads
// the same time from it.
func TestParseStampIsTimeParses(t *testing.T) {
	reference := func(s string) (time.Time, bool) {
		parsed, err := time.Parse(stampLayout, s)
		if err != nil || stamp(parsed) != s {
			return time.Time{}, false
		}
		return parsed, true
	}
	inputs := []string{"2026-12-01T03:00:00.000Z", "0000-01-01T00:00:00.000Z", "9999-12-31T23:59:59.999Z",
		"2024-02-29T12:00:00.000Z", "2023-02-29T12:00:00.000Z", "2026-04-31T00:00:00.000Z", "2026-00-10T00:00:00.000Z",
		"2026-13-10T00:00:00.000Z", "2026-12-00T00:00:00.000Z", "2026-12-01T24:00:00.000Z", "2026-12-01T23:60:00.000Z",
		"2026-12-01T23:59:60.000Z", "2026-12-01t03:00:00.000Z", "2026-12-01T03:00:00.000z", "2026-12-01T03:00:00.00Z",
		"2026-12-01T03:00:00.0000Z", "2026-12-01T3:00:00.000Z", "+026-12-01T03:00:00.000Z", "-026-12-01T03:00:00.000Z",
		"2026-12-01 03:00:00.000Z", "2026-12-01T03:00:00,000Z", "2026-12-01T03:00:00.000+00:00", "", "2026-1a-01T03:00:00.000Z"}
	for at := time.Date(1999, 12, 31, 23, 59, 58, 0, time.UTC); at.Year() < 2001; at = at.Add(97*time.Hour + 13*time.Minute + 7*time.Second + 3*time.Millisecond) {
		inputs = append(inputs, stamp(at))
	}
	valid := "2026-12-01T03:00:00.000Z"
	for i := range valid { // every one-byte change of a valid stamp
		for _, c := range []byte("09-:.TZ +x\x00") {
			inputs = append(inputs, valid[:i]+string(c)+valid[i+1:])
		}
	}
	for _, s := range inputs {
		got, ok := ParseStamp(s)
		want, wantOK := reference(s)
		if ok != wantOK || !got.Equal(want) || got.Location() != want.Location() {
			t.Errorf("ParseStamp(%q) = %v, %v; time.Parse: %v, %v", s, got, ok, want, wantOK)
		}
	}
}

// A stamp is the time's UTC formatted, whether it was stamped just before or not.
func TestStampIsFormats(t *testing.T) {
	now := time.Now()
	tokyo := time.FixedZone("JST", 9*3600)
	for _, at := range []time.Time{now, now, now.In(tokyo), now.Round(0), now.Add(time.Millisecond), now.Add(time.Nanosecond),
		now, time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999999, tokyo), now} {
		if got, want := stamp(at), at.UTC().Format(stampLayout); got != want {
			t.Errorf("stamp(%v) = %s, want %s", at, got, want)
		}
	}
	// formatStamp by hand, against Format: across leap days, month ends and centuries, and the
	// years Format writes with more or fewer than four digits.
	ats := []time.Time{time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 12, 31, 23, 59, 59, 0, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2000, 2, 29, 23, 59, 59, 999999999, time.UTC)}
	for at := time.Date(1899, 12, 31, 23, 0, 0, 0, time.UTC); at.Year() < 2102; at = at.Add(97*time.Hour + 13*time.Minute + 7*time.Second + 3*time.Millisecond) {
		ats = append(ats, at)
	}
	for _, at := range ats {
		if got, want := formatStamp(at), at.Format(stampLayout); got != want {
			t.Errorf("formatStamp(%v) = %s, want %s", at, got, want)
		}
	}
	for year := 1596; year <= 2404; year++ {
		for month := time.January; month <= time.December; month++ {
			if got, want := daysIn(month, year), time.Date(year, month+1, 0, 0, 0, 0, 0, time.UTC).Day(); got != want {
				t.Errorf("daysIn(%v, %d) = %d, want %d", month, year, got, want)
			}
		}
	}
}

// An events head is written as json.Marshal writes it, and read back by the same decoder
// whichever wrote it.
func TestEventsHeadJSONIsEncodingJSONs(t *testing.T) {
	heads := []eventsHead{
		{Windows: windows{}},
		{Seq: 1, End: 120, Windows: windows{"h": 1}},
		{Seq: math.MaxUint64, End: math.MaxInt64, Windows: windows{"h": 256, "0": 32, "1000": 7}},
		{Seq: 3, End: 9, Windows: windows{"<b>": 2}},
	}
	for _, h := range heads {
		want, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		got, err := h.appendJSON(nil)
		if err != nil || string(got) != string(want) {
			t.Errorf("%+v.appendJSON = %s, %v; json.Marshal: %s", h, got, err, want)
		}
		if back, err := decodeEventsHead(got); err != nil || !reflect.DeepEqual(back, h) {
			t.Errorf("decodeEventsHead(%s) = %+v, %v; want %+v", got, back, err, h)
		}
	}
	// What encoding/json would also take: another order, spaces, no windows yet.
	for in, want := range map[string]eventsHead{
		`{"end":5,"seq":2,"windows":{"h":2}}`:       {Seq: 2, End: 5, Windows: windows{"h": 2}},
		`{"seq": 2, "end": 5, "windows": {"h": 2}}`: {Seq: 2, End: 5, Windows: windows{"h": 2}},
		`{"seq":2,"end":5}`:                         {Seq: 2, End: 5, Windows: windows{}},
	} {
		if got, err := decodeEventsHead([]byte(in)); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("decodeEventsHead(%s) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{``, `{`, `{"seq":"2"}`, `[]`, `{"seq":1,"end":2,"windows":{"h":-1}}`} {
		if h, err := decodeEventsHead([]byte(in)); err == nil {
			t.Errorf("decodeEventsHead(%s) = %+v, want an error", in, h)
		}
	}
}
