package main

import (
	"os"
	"runtime"
	"runtime/metrics"
	"sync/atomic"

	"github.com/cockpitfs/cockpitfs/internal/memlimit"
)

// The daemon's heap is bounded by a soft memory limit that follows what is live: at least
// heapFloor, else one and a half times the live heap of the last collection. Go's default lets
// the heap grow to twice what is live (GOGC=100), and a burst — badger's compactions after
// 3,000 churned configs, 10,000 stacks made in a row — then peaks at 115 MiB and leaves the
// runtime's metadata of that peak behind (docs/integrity.md, "Staying bounded"). A fixed limit
// would do the same for a small store but make the collector run without pause, up to half the
// CPU, once a large store's live heap passed it; following the live heap, the limit always
// leaves a third of the heap's room to allocate in before the next collection. The floor decides
// how far a small store's burst peaks, and the runtime keeps its bookkeeping of that peak (the
// collector's mark bits among it): after 10,000 claims and drains the settled daemon's anonymous
// RSS was 6.97–7.16 MiB at 24 MiB against 7.25–7.97 at 32 (three runs each, the 10,000 taking
// 9.6–11.8 s against 9.7–15.0), and 64 MiB left it ≈ 0.6 MiB larger than 32 did; 16 MiB collected
// so often that a burst of claims ran at 780–1,360 a second against 1,510–2,500 at 32.
const heapFloor = 24 << 20

// heapBound counts boundHeap's calls: the cleanups a call set going stop once a later call
// replaced them.
var heapBound atomic.Uint64

// boundHeap sets the limit and keeps it following the live heap, through internal/memlimit (a
// memtable renewal holds collections off, kv/settle.go). A GOMEMLIMIT in the daemon's environment
// is the user's choice and left alone.
func boundHeap() {
	// Nothing reads the daemon's heap profile (grpc, in the build with team mode, links
	// runtime/pprof, which turns the sampling on): each sample kept a bucket and a page of the
	// runtime's bucket table.
	runtime.MemProfileRate = 0
	bound := heapBound.Add(1)
	if _, set := os.LookupEnv("GOMEMLIMIT"); set {
		return
	}
	memlimit.Set(heapFloor)
	afterNextGC(bound)
}

// gcMark is an allocation that lives until the next collection, whose cleanup then runs.
type gcMark struct{ _ *byte }

// afterNextGC sets the limit once the next collection found the live heap, and again after each
// one after it. Cleanups run one at a time on the runtime's own goroutine: this one reads the
// runtime's metrics and sets the limit.
func afterNextGC(bound uint64) {
	runtime.AddCleanup(&gcMark{}, func(struct{}) {
		if heapBound.Load() != bound {
			return
		}
		memlimit.Set(heapLimit(runtimeMemory()))
		afterNextGC(bound)
	}, struct{}{})
}

// runtimeMemory returns the heap's live bytes at the last collection, and what the runtime holds
// besides the heap's objects and free pages (heapLimit).
func runtimeMemory() (live, outside uint64) {
	m := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(m)
	return m[0].Value.Uint64(), m[1].Value.Uint64() - m[2].Value.Uint64() - m[3].Value.Uint64() - m[4].Value.Uint64()
}

// heapLimit is the soft memory limit for a live heap of live bytes beside outside bytes the runtime
// holds besides the heap's objects and free pages: goroutine stacks, the heap's unused span space,
// and the runtime's metadata, which grows with the largest heap the daemon had and is not given
// back. The limit counts them, so the heap's room under it is 1.5× what is live whatever they take,
// or more while the floor is higher. Without the stacks, a daemon of 1,000 blocked `wait` readers
// (their stacks ≈ 10 MiB) collected without pause (a claim there 2× an empty store's); without the
// metadata, a daemon after a burst (3,000 churned cockpits: a peak of 120 MiB) was left 2 MiB of
// room over an 11 MiB live heap and collected every 8 ms, its operations at half the rate.
func heapLimit(live, outside uint64) int64 {
	return max(heapFloor, int64(live/2*3)+int64(outside))
}
