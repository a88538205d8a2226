package kv

import (
	"os"
	"syscall"
	"testing"
)

// A checkpoint that finds the process out of descriptors (a burst of connections to the proxy)
// stops nothing: the store commits on, and the next checkpoint makes it durable. It used to stop
// the store for good ("sync badger's logs: too many open files").
func TestCheckpointOutOfDescriptorsStopsNothing(t *testing.T) {
	// Not parallel: the descriptor limit is the process's.
	db, _ := openTemp(t)
	set(t, db, "k", "1")
	applied(t, db)
	l := db.log
	for !l.checkpointing.CompareAndSwap(false, true) {
		l.background.Wait()
	}
	// An open takes the lowest free descriptor: below it, none is free.
	probe, err := os.Open("/")
	if err != nil {
		t.Fatal(err)
	}
	lowest := probe.Fd()
	probe.Close()
	var was syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &was); err != nil {
		t.Fatal(err)
	}
	low := was
	low.Cur = uint64(lowest)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Open("/"); err == nil {
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &was)
		t.Fatal("a descriptor could still be opened")
	}
	l.background.Add(1)
	l.checkpoint()
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &was); err != nil {
		t.Fatal(err)
	}
	if err := l.err(); err != nil {
		t.Fatalf("the store stopped: %v", err)
	}
	set(t, db, "k", "2")
	checkpointNow(t, db)
	if v, _ := get(t, db, "k"); v != "2" {
		t.Fatalf("k = %q after the checkpoint, want 2", v)
	}
}
