package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

// TestHeapLimitFollowsTheLiveHeap: the limit is the floor for a small heap, rises to 1.5× a live
// heap above it after the next collection, and comes back down once that heap is let go.
func TestHeapLimitFollowsTheLiveHeap(t *testing.T) {
	if v, set := os.LookupEnv("GOMEMLIMIT"); set {
		os.Unsetenv("GOMEMLIMIT")
		t.Cleanup(func() { os.Setenv("GOMEMLIMIT", v) })
	}
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	boundHeap()
	limit := func() int64 { return debug.SetMemoryLimit(-1) }
	settles := func(want func(int64) bool) int64 {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			runtime.GC()
			if l := limit(); want(l) {
				return l
			}
		}
		t.Fatalf("the limit stayed %d MiB", limit()>>20)
		return 0
	}
	settles(func(l int64) bool { return l == heapFloor })
	live := make([][]byte, 200)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	got := settles(func(l int64) bool { return l >= 300<<20 })
	if got > 330<<20 {
		t.Errorf("with 200 MiB live the limit is %d MiB, want about 1.5× the live heap", got>>20)
	}
	runtime.KeepAlive(live)
	live = nil
	settles(func(l int64) bool { return l == heapFloor })
}

// TestHeapLimitLeavesTheUsersLimit: a GOMEMLIMIT the daemon was started with is not replaced.
func TestHeapLimitLeavesTheUsersLimit(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "1GiB")
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(1 << 30))
	boundHeap()
	if l := debug.SetMemoryLimit(-1); l != 1<<30 {
		t.Errorf("limit %d, want the user's 1 GiB", l)
	}
}
