package memlimit

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
)

// cycles counts the collections done, once one under way has ended its marking (SetGCPercent
// waits for that when given a negative percent): a cycle the allocations began counts, however
// slowly a loaded machine lets it mark (a full run once read none after 64 MiB).
func cycles() uint64 {
	debug.SetGCPercent(debug.SetGCPercent(-1))
	m := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(m)
	return m[0].Value.Uint64()
}

func currentLimit() int64 { return debug.SetMemoryLimit(-1) }

// TestHoldCollectionsUnderATightLimit: with the limit far below what is allocated, a hold of
// 96 MiB of room lets 32 MiB be allocated without a collection (the collector may start its
// cycle as early as 70 % of the way to the limit), and resuming restores the limit and GOGC; past
// its room, the limit collects again.
func TestHoldCollectionsUnderATightLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	Set(8 << 20)
	runtime.GC()
	resume := HoldCollections(96 << 20)
	before := cycles()
	keep := make([][]byte, 0, 64)
	for range 32 {
		keep = append(keep, make([]byte, 1<<20))
	}
	during := cycles() - before
	resume()
	resume() // a second call changes nothing
	runtime.KeepAlive(keep)
	if during != 0 {
		t.Errorf("%d collections while held, 32 MiB allocated under a limit of 8 MiB", during)
	}
	if l := currentLimit(); l != 8<<20 {
		t.Errorf("resumed, the limit is %d, want 8 MiB", l)
	}
	if p := debug.SetGCPercent(100); p != 100 {
		t.Errorf("resumed, GOGC is %d, want 100", p)
	}

	runtime.GC()
	resume = HoldCollections(8 << 20)
	defer resume()
	before = cycles()
	keep = keep[:0]
	for range 64 {
		keep = append(keep, make([]byte, 1<<20))
	}
	runtime.KeepAlive(keep)
	if cycles() == before {
		t.Errorf("64 MiB allocated in a hold of 8 MiB of room, and no collection")
	}
}

// TestSetWhileHeldAppliesOnResume: the follower's limit set during a hold does not lift the hold,
// and is the limit once it resumes; holds nest.
func TestSetWhileHeldAppliesOnResume(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	Set(64 << 20)
	outer := HoldCollections(1 << 40)
	inner := HoldCollections(1 << 40)
	Set(48 << 20)
	if l := currentLimit(); l < 1<<40 {
		t.Fatalf("held, a Set made the limit %d", l)
	}
	inner()
	if l := currentLimit(); l < 1<<40 {
		t.Fatalf("one of two holds resumed, the limit is %d", l)
	}
	outer()
	if l := currentLimit(); l != 48<<20 {
		t.Errorf("resumed, the limit is %d, want the 48 MiB set while held", l)
	}
}
