package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"
)

// TestHeapLimitFollowsTheLiveHeap: the limit is the floor for a small heap; after the next
// collection it leaves a live heap above it 1.5× its size, beside what the runtime holds outside the
// heap (goroutine stacks among it), and it comes back down once that heap is let go.
func TestHeapLimitFollowsTheLiveHeap(t *testing.T) {
	if v, set := os.LookupEnv("GOMEMLIMIT"); set {
		os.Unsetenv("GOMEMLIMIT")
		t.Cleanup(func() { os.Setenv("GOMEMLIMIT", v) })
	}
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	boundHeap()
	limit := func() int64 { return debug.SetMemoryLimit(-1) }
	room := func() int64 {
		_, outside := runtimeMemory()
		return limit() - int64(outside)
	}
	settles := func(what func() int64, want func(int64) bool) int64 {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			runtime.GC()
			if l := what(); want(l) {
				return l
			}
		}
		t.Fatalf("it stayed %d MiB (the limit %d MiB)", what()>>20, limit()>>20)
		return 0
	}
	atFloor := func(l int64) bool { return l == heapFloor }
	settles(limit, atFloor)
	live := make([][]byte, 200)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	got := settles(room, func(r int64) bool { return r >= 300<<20 })
	if got > 330<<20 {
		t.Errorf("with 200 MiB live the heap's room is %d MiB, want about 1.5× the live heap", got>>20)
	}
	runtime.KeepAlive(live)
	live = nil
	settles(limit, atFloor)

	// 1,000 goroutines blocked with 32 KiB of stack each, beside 16 MiB live: their stacks take
	// none of the heap's room.
	release := make(chan struct{})
	var blocked sync.WaitGroup
	for range 1000 {
		blocked.Add(1)
		go deepWait(64, &blocked, release)
	}
	live = make([][]byte, 16)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	blocked.Wait()
	settles(room, func(r int64) bool {
		held, outside := runtimeMemory()
		return outside > 32<<20 && r >= int64(held/2*3) && held >= 16<<20
	})
	runtime.KeepAlive(live)
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
