package fs

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"github.com/cockpitfs/cockpitfs/engine"
)

// A holder file reads as it did when fmt rendered it.
func TestRenderHolderIsFmts(t *testing.T) {
	fmtHolder := func(h engine.Holder, state string) []byte {
		var b bytes.Buffer
		fmt.Fprintf(&b, "name=%s\nid=%s\ncheckout=%s\ncheckout_path=%s\nclaimed_at=%s\n", h.Name, h.HolderID, h.CheckoutID, engine.Printable(h.CheckoutPath), h.ClaimedAt)
		if h.PID == 0 {
			b.WriteString("pid=none\n")
		} else {
			fmt.Fprintf(&b, "pid=%d\n", h.PID)
		}
		if h.ProcessStart != "" {
			fmt.Fprintf(&b, "process_start=%s\n", h.ProcessStart)
		}
		fmt.Fprintf(&b, "state=%s\nuid=%d\n", state, h.UID)
		return b.Bytes()
	}
	for _, c := range []struct {
		h     engine.Holder
		state string
	}{
		{engine.Holder{}, ""},
		{engine.Holder{Name: "c", HolderID: "h-1", CheckoutID: "k-2", CheckoutPath: "/src/c", ClaimedAt: "2026-12-01T03:00:00.000Z",
			PID: 4242, ProcessStart: "proc:0b6d3c4e-2f1a-4c5b-9d8e-7f6a5b4c3d2e:123456", UID: 1000}, "live"},
		{engine.Holder{Name: "n", CheckoutPath: "/a b/é\n%d\x1b[2J", PID: -7, UID: math.MaxUint32}, "unknown"},
	} {
		if got, want := renderHolder(c.h, c.state), fmtHolder(c.h, c.state); !bytes.Equal(got, want) {
			t.Errorf("renderHolder(%+v, %q):\n got %q\nwant %q", c.h, c.state, got, want)
		}
	}
}
