package engine

import (
	"bytes"
	"strings"
	"testing"
)

// A refusal quoting 64 KiB of junk leaves a line of a few hundred bytes that says how much it
// left out, so it neither evicts its neighbours nor reaches badger's value log.
func TestEventQuotingHugeInputIsClipped(t *testing.T) {
	e := newEngine(t)
	newCockpit(t, e, "app", exampleConfig, "one")
	junk := strings.Repeat("\x01é", 32<<10)
	r := &Refusal{Code: StateRecordMalformed, Message: "cannot parse " + junk, Fix: "write pid=<n>"}
	if err := e.LogRefusal(me("write", "app/stacks/one/holders/me"), "app", "one", r, "EINVAL"); err != nil {
		t.Fatal(err)
	}
	events, err := e.events("app", "one")
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(events), []byte("\n"))
	last := string(lines[len(lines)-1])
	if len(last) > 3000 || !strings.Contains(last, "bytes more)") || !strings.Contains(last, `"fix":"write pid=<n>"`) {
		t.Fatalf("want a clipped line of at most 3000 bytes naming what it left out, got %d bytes:\n%.600s", len(last), last)
	}
	if !strings.Contains(last, `"code":"STATE_RECORD_MALFORMED"`) || !strings.Contains(last, `"errno":"EINVAL"`) {
		t.Errorf("the clipped line lost its code or errno: %.600s", last)
	}
}
