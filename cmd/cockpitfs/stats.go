package main

import (
	"log"
	"os"
	"os/signal"
	"runtime"
	"runtime/metrics"
	"syscall"
)

// logStatsOnSIGUSR1 logs the daemon's goroutines and Go heap at each SIGUSR1: what scripts/soak
// reads (with RSS, fds and disk from /proc and the data directory) to show they stay flat, and
// what a test reads to see what the daemon keeps. The heap is given as the bytes live after a
// collection the signal runs, and the size the next one waits for, so a leak (live bytes
// growing) tells itself apart from the sawtooth of garbage between collections.
func logStatsOnSIGUSR1() {
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/goal:bytes"}}
		for range usr1 {
			runtime.GC()
			metrics.Read(sample)
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			log.Printf("stats: goroutines=%d heap_live=%d next_gc=%d heap_alloc=%d heap_sys=%d",
				runtime.NumGoroutine(), sample[0].Value.Uint64(), sample[1].Value.Uint64(), m.HeapAlloc, m.HeapSys)
		}
	}()
}
