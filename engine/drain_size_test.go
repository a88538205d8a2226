package engine

import (
	"fmt"
	"strings"
	"testing"
)

// The largest drain a request can carry (64 KiB of 500-byte targets) keeps every stored value
// under kv's value threshold (512 KiB), from which badger keeps a value in its value log, which is
// never reclaimed: through reservation, its runtime stop, its reclaims, a failure and its retry.
func TestLargestDrainStaysOutOfTheValueLog(t *testing.T) {
	t.Parallel()
	e, _ := newDrainEngine(t)
	var targets []string
	for i := 0; len(strings.Join(targets, " "))+len("down ")+501 < 64<<10; i++ {
		targets = append(targets, fmt.Sprintf("volume:%03d-%s", i, strings.Repeat("v", 489)))
	}
	largest := 0
	step := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		_, _, l := storedLayout(t, e.db, "app", "s")
		largest = max(largest, l)
	}
	step("reserve", reserveText(t, e, "down "+strings.Join(targets, " ")))
	step("start", startExecutor(e, 0))
	for i := 0; i < 3; i++ {
		step("outcome", publish(e, true, stackOf(t, e).Value.Drain.Attempt.AttemptID))
		step("start", startExecutor(e, 0))
	}
	step("failure", publish(e, false, stackOf(t, e).Value.Drain.Attempt.AttemptID))
	step("retry", startExecutor(e, 0))
	t.Logf("%d targets, largest value %d bytes", len(targets), largest)
	if largest >= 512<<10 {
		t.Fatalf("a value of %d bytes is stored, past 512 KiB", largest)
	}
}
