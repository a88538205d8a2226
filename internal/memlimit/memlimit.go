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
	"runtime/debug"
	"runtime/metrics"
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

// HoldCollections keeps the collector from starting a cycle until the runtime's memory grew by
// room bytes or resume is called: GOGC's trigger is off, and the soft memory limit is raised to
// what the runtime holds now plus room, if that is more. Past room the limit collects again, so a
// hold that allocates more than it expected does not grow the heap without bound. An explicit
// runtime.GC or debug.FreeOSMemory still collects. resume may be called more than once; the
// first call counts.
func HoldCollections(room int64) (resume func()) {
	mu.Lock()
	defer mu.Unlock()
	if held == 0 {
		percent = debug.SetGCPercent(-1) // waits for a cycle under way to end its marking
		limit = debug.SetMemoryLimit(-1)
	}
	held++
	debug.SetMemoryLimit(max(debug.SetMemoryLimit(-1), int64(holding())+room))
	return sync.OnceFunc(func() {
		mu.Lock()
		defer mu.Unlock()
		if held--; held == 0 {
			debug.SetMemoryLimit(limit)
			debug.SetGCPercent(percent)
		}
	})
}

// holding is what the soft memory limit is compared with: the memory the runtime maps and has not
// returned to the kernel.
func holding() uint64 {
	m := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(m)
	return m[0].Value.Uint64() - m[1].Value.Uint64()
}
