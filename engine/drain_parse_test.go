package engine

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func revisionOf(n int64) *int64 { return &n }

func TestParseDrainRequest(t *testing.T) {
	for _, tc := range []struct {
		text string
		want DrainRequest
	}{
		{"sleep", DrainRequest{Purpose: "sleep"}},
		{"sleep\n", DrainRequest{Purpose: "sleep"}},
		{"down volume:db volume:cache", DrainRequest{Purpose: "down", Targets: []string{"volume:db", "volume:cache"}}},
		{"reset target=volume:db holder=me revision=12 valid_for=60000",
			DrainRequest{Purpose: "reset", Targets: []string{"volume:db"}, Holder: "me", Revision: revisionOf(12), ValidFor: 60000}},
		{"down\nvalid_for=1\tdir:tmp/x\n target=a=b revision=0",
			DrainRequest{Purpose: "down", Targets: []string{"dir:tmp/x", "a=b"}, Revision: revisionOf(0), ValidFor: 1}},
		{"down volume:db/data.v2 :x café", DrainRequest{Purpose: "down", Targets: []string{"volume:db/data.v2", ":x", "café"}}},
		{"down target=" + strings.Repeat("x", 512) + " valid_for=300000",
			DrainRequest{Purpose: "down", Targets: []string{strings.Repeat("x", 512)}, ValidFor: 300000}},
	} {
		got, err := ParseDrainRequest(tc.text)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseDrainRequest(%q) = %+v, %v; want %+v", tc.text, got, err, tc.want)
		}
	}
}

func TestParseDrainRequestRefusals(t *testing.T) {
	for _, text := range []string{
		"", " \n", "stop", "SLEEP", "volume:db down",
		"down volume:db colour=red",
		"down holder=me holder=you", "down revision=1 revision=1", "down valid_for=1 valid_for=1",
		"down holder=", "down holder=-me", "down holder=a/b",
		"down volume:\x00db", "down target=",
		// Names outside what the executor reclaims, or that a terminal or a command would read.
		"down volume:../../../victimdir", "down volume:db/../../x", "down volume:..", "down volume:.",
		"down volume:", "down volume:/etc", "down /etc", "down dir:/tmp/x", "down volume:a//b", "down volume:db/",
		"down volume:-rf", "down -rf", "down volume:\x1b[31mdb", "down volume:d\x7fb", "down volume:\xffdb",
		"down volume:d\u009bb",
		"down " + strings.Repeat("x", 513),
		"down volume:db volume:db", "down volume:db target=volume:db",
		"sleep volume:db", "sleep target=volume:db",
		"sleep valid_for=0", "sleep valid_for=300001", "sleep valid_for=abc", "sleep valid_for=-1", "sleep valid_for=01",
		"sleep revision=-1", "sleep revision=x", "sleep revision=+1", "sleep revision=99999999999999999999",
		`"sleep"`, `[{"purpose":"sleep"}]`, `{"purpose":"sleep"}`, `{`, `{} {}`,
		"down " + strings.Repeat("t ", maxHolders),
	} {
		_, err := ParseDrainRequest(text)
		if r := AsRefusal(err); err == nil || r.Code != StateRecordMalformed || r.Message == "" {
			t.Errorf("ParseDrainRequest(%.60q) = %v, want STATE_RECORD_MALFORMED", text, err)
		}
	}
}

// seedRequest is a well-formed JSON request for stack app/s held by me.
func seedRequest() map[string]any {
	stack := StackID("app", "s")
	return map[string]any{
		"purpose": "down", "stackId": stack, "holderId": holderID("me"), "requesterId": holderID("me"),
		"configSha256": digest("c"), "planDigest": digest("p"), "operationBasis": digest("o"), "generation": digest("g"),
		"targetIds": []string{stack, "volume:db"},
		"actions": []drainAction{
			{Stage: stageRuntimeStop, TargetID: stack, ValidForMs: 5000},
			{Stage: stageReclaim, TargetID: "volume:db", ValidForMs: 5000, TargetCommitment: commitTo(stack, "volume:db")},
		},
		"expectedCoordinationRevision": 7,
	}
}

func requestJSONText(t *testing.T, change func(map[string]any)) string {
	t.Helper()
	m := seedRequest()
	change(m)
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestParseDrainRequestJSON(t *testing.T) {
	got, err := ParseDrainRequest("\n" + requestJSONText(t, func(map[string]any) {}) + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if got.Purpose != "down" || !equalStrings(got.Targets, []string{"volume:db"}) || *got.Revision != 7 || got.ValidFor != 5000 ||
		got.Holder != "" || got.requesterID() != holderID("me") || got.PlanDigest != digest("p") || got.given.StackID != StackID("app", "s") {
		t.Fatalf("JSON request: %+v", got)
	}
	for name, change := range map[string]func(map[string]any){
		"missing key":       func(m map[string]any) { delete(m, "generation") },
		"extra key":         func(m map[string]any) { m["holder"] = "me" },
		"bad purpose":       func(m map[string]any) { m["purpose"] = "stop" },
		"bad stackId":       func(m map[string]any) { m["stackId"] = "app/s" },
		"bad requesterId":   func(m map[string]any) { m["requesterId"] = "you" },
		"bad holderId":      func(m map[string]any) { m["holderId"], m["requesterId"] = "me", "me" },
		"bad digest":        func(m map[string]any) { m["planDigest"] = "ABC" },
		"negative revision": func(m map[string]any) { m["expectedCoordinationRevision"] = -1 },
		"fractional":        func(m map[string]any) { m["expectedCoordinationRevision"] = 1.5 },
		"no actions":        func(m map[string]any) { m["actions"] = []drainAction{} },
		"zero validForMs":   func(m map[string]any) { m["actions"] = []drainAction{{Stage: stageRuntimeStop, ValidForMs: 0}} },
		"sleep with target": func(m map[string]any) { m["purpose"] = "sleep" },
		"duplicate target":  func(m map[string]any) { m["targetIds"] = []string{"volume:db", "volume:db"} },
		"wrong type":        func(m map[string]any) { m["targetIds"] = "volume:db" },
		"unknown action key": func(m map[string]any) {
			m["actions"] = []map[string]any{{"stage": stageRuntimeStop, "validForMs": 1, "x": 1}}
		},
	} {
		text := requestJSONText(t, change)
		if _, err := ParseDrainRequest(text); AsRefusal(err).Code != StateRecordMalformed || err == nil {
			t.Errorf("%s: ParseDrainRequest(%s) = %v, want STATE_RECORD_MALFORMED", name, text, err)
		}
	}
}

func TestParseAttemptCommand(t *testing.T) {
	for text, want := range map[string]int{"start": -1, "start\n": -1, "start pid=42": 42, " start\npid=none ": 0} {
		if got, err := ParseAttemptCommand(text); err != nil || got != want {
			t.Errorf("ParseAttemptCommand(%q) = %d, %v; want %d", text, got, err, want)
		}
	}
	for _, text := range []string{"", "begin", "start pid=0", "start pid=-1", "start pid=x", "start pid=042", "start pid=2147483648",
		"start pid=1 pid=2", "start executor=1", "start 42", "pid=1 start"} {
		if _, err := ParseAttemptCommand(text); AsRefusal(err).Code != StateRecordMalformed || err == nil {
			t.Errorf("ParseAttemptCommand(%q) = %v, want STATE_RECORD_MALFORMED", text, err)
		}
	}
}

func TestParseOutcomeCommand(t *testing.T) {
	id := digest("attempt")
	for _, tc := range []struct {
		text    string
		success bool
		id      string
		planned int64 // -1: none
	}{{"success", true, "", -1}, {"failure\n", false, "", -1}, {"success attempt=" + id, true, id, -1}, {"failure\nattempt=" + id + "\n", false, id, -1},
		{"success planned=7 attempt=" + id, true, id, 7}, {"failure planned=0", false, "", 0}} {
		o, err := ParseOutcomeCommand(tc.text)
		planned := int64(-1)
		if o.Planned != nil {
			planned = *o.Planned
		}
		if err != nil || o.Success != tc.success || o.AttemptID != tc.id || planned != tc.planned {
			t.Errorf("ParseOutcomeCommand(%q) = %+v, %v", tc.text, o, err)
		}
	}
	for _, text := range []string{"", "ok", "Success", "success attempt=", "success attempt=" + strings.ToUpper(id), "success attempt=" + id[1:],
		"success id=" + id, "success failure", "success attempt=" + id + " attempt=" + id,
		"success planned=", "success planned=-1", "success planned=07", "success planned=x", "success planned=1 planned=1",
		"success planned=1 attempt=" + id + " x=1"} {
		if _, err := ParseOutcomeCommand(text); AsRefusal(err).Code != StateRecordMalformed || err == nil {
			t.Errorf("ParseOutcomeCommand(%q) = %v, want STATE_RECORD_MALFORMED", text, err)
		}
	}
}

func TestParseRepairCommand(t *testing.T) {
	for _, text := range []string{"terminated", "terminated\n", "\tterminated "} {
		if err := ParseRepairCommand(text); err != nil {
			t.Errorf("ParseRepairCommand(%q) = %v", text, err)
		}
	}
	for _, text := range []string{"", "terminate", "terminated now", "TERMINATED"} {
		if err := ParseRepairCommand(text); AsRefusal(err).Code != StateRecordMalformed || err == nil {
			t.Errorf("ParseRepairCommand(%q) = %v, want STATE_RECORD_MALFORMED", text, err)
		}
	}
}

// FuzzParseDrainRequest: any text parses or is refused as malformed, and what parses satisfies
// the request's own limits.
func FuzzParseDrainRequest(f *testing.F) {
	f.Add("sleep")
	f.Add("reset target=volume:db holder=me revision=12 valid_for=60000")
	f.Fuzz(func(t *testing.T, text string) {
		q, err := ParseDrainRequest(text)
		if err != nil {
			if AsRefusal(err).Code != StateRecordMalformed {
				t.Fatalf("refusal %v is not STATE_RECORD_MALFORMED", err)
			}
			return
		}
		if !validPurpose(q.Purpose) || q.ValidFor < 0 || q.ValidFor > maxValidForMs || q.Revision != nil && *q.Revision < 0 ||
			q.Holder != "" && !ValidName(q.Holder) || checkReclaimTargets(q.Purpose, q.Targets) != nil {
			t.Fatalf("ParseDrainRequest(%q) accepted %+v", text, q)
		}
	})
}

// Canonical is what JSON.stringify writes back, byte for byte.
func TestIsCanonicalJSON(t *testing.T) {
	for body, want := range map[string]bool{
		`{"a":1,"b":[true,null,"x"]}`:     true,
		`{"b":1,"a":2}`:                   false, // keys unsorted
		`{"a": 1}`:                        false, // white space
		`{"a":"<&>"}`:                     true,  // JSON.stringify escapes no HTML
		`{"a":"\u003c"}`:                  false, // an escape it would not write
		"{\"a\":\"\u2028\"}":              true,
		`{"a":"\u0001\n"}`:                true,
		`{"a":"\u0001\u000a"}`:            false, // \n has a short escape
		`{"a":1.0}`:                       false, // written 1
		`{"a":1e21}`:                      false, // written 1e+21
		`{"a":1e+21}`:                     true,
		`{"a":100000000000000000000}`:     true,
		`{"a":-0}`:                        false, // written 0
		"{\"\uffff\":1,\"\U0001F600\":2}": false, // UTF-16: the surrogate pair sorts first
		"{\"\U0001F600\":2,\"\uffff\":1}": true,
		`{"a":1`:                          false,
	} {
		if got := isCanonicalJSON(body); got != want {
			t.Errorf("isCanonicalJSON(%s) = %t, want %t", body, got, want)
		}
	}
}
