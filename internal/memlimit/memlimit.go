// Package memlimit sets the process's soft memory limit for whoever follows the live heap (the
// daemon, cmd/cockpitfs/heap.go), and lets a moment that must not collect hold the collector
// off (kv's memtable renewal, kv/settle.go).
//
// Why one place: a collection is started by GOGC's trigger or by the soft memory limit, and
// turning GOGC off (debug.SetGCPercent(-1)) leaves the limit's trigger on. A caller that lifted
// the limit for its moment would still lose it to the follower, which sets the limit again after
// each collection from a cleanup that runs later, on a goroutine of its own — after the moment
// began. Here the follower's limit waits while collections are held, and applies when they
// resume.
package memlimit

import (
	"math"
	"runtime/debug"
	"sync"
)

var (
	mu      sync.Mutex
	held    int   // holds not yet resumed
	limit   int64 // while held: the limit to restore
	percent int   // while held: the GOGC to restore
)

// Set sets the soft memory limit (debug.SetMemoryLimit), or, while collections are held, the limit
// they resume with.
func Set(l int64) {
	mu.Lock()
	defer mu.Unlock()
	if held > 0 {
		limit = l
		return
	}
	debug.SetMemoryLimit(l)
}

// HoldCollections keeps the collector from starting a cycle until resume is called: GOGC's
// trigger is off and the soft memory limit lifted. An explicit runtime.GC or debug.FreeOSMemory
// still collects. The heap may grow past the limit meanwhile, so a hold must be short and its
// allocations bounded. resume may be called more than once; the first call counts.
func HoldCollections() (resume func()) {
	mu.Lock()
	defer mu.Unlock()
	if held == 0 {
		percent = debug.SetGCPercent(-1) // waits for a cycle under way to end its marking
		limit = debug.SetMemoryLimit(math.MaxInt64)
	}
	held++
	return sync.OnceFunc(func() {
		mu.Lock()
		defer mu.Unlock()
		if held--; held == 0 {
			debug.SetMemoryLimit(limit)
			debug.SetGCPercent(percent)
		}
	})
}
