package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"sync"
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
	floor := settles(func(l int64) bool { return l >= heapFloor && l < heapFloor+4<<20 })
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
	settles(func(l int64) bool { return l >= heapFloor && l < heapFloor+4<<20 })

	// 1,000 goroutines blocked with 32 KiB of stack each raise it by what their stacks take.
	release := make(chan struct{})
	var blocked sync.WaitGroup
	for range 1000 {
		blocked.Add(1)
		go deepWait(64, &blocked, release)
	}
	blocked.Wait()
	settles(func(l int64) bool { return l >= floor+30<<20 })
	close(release)
}

// deepWait waits on release depth calls deep, each call's frame holding 512 bytes.
func deepWait(depth int, blocked *sync.WaitGroup, release chan struct{}) byte {
	var frame [512]byte
	if depth == 0 {
		blocked.Done()
		<-release
		return frame[0]
	}
	frame[depth%512] = byte(depth)
	return deepWait(depth-1, blocked, release) + frame[(depth*7)%512]
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
