package main

import (
	"bufio"
	"strings"
	"testing"
)

func TestMediansOverCounts(t *testing.T) {
	out := `goos: linux
BenchmarkRead/cockpitfs-2   	 300	 307121 ns/op	 0 eintr/op
BenchmarkRead/cockpitfs-2   	 300	 100000 ns/op	 0 eintr/op
BenchmarkRead/cockpitfs-2   	 300	 200000 ns/op	 1 eintr/op
BenchmarkClaim/peer-2       	 300	 4728532 ns/op	 2646043 ns/claim
BenchmarkClaim/peer-2       	 300	 4728532 ns/op	 1000000 ns/claim
PASS
`
	f := read(bufio.NewScanner(strings.NewReader(out)))
	for _, c := range []struct {
		name, unit string
		want       float64
	}{
		{"Read/cockpitfs", "ns/op", 200000},
		{"Read/cockpitfs", "eintr/op", 0},
		{"Claim/peer", "ns/claim", 1823021.5},
	} {
		if got, ok := f.median(c.name, c.unit); !ok || got != c.want {
			t.Errorf("median(%s, %s) = %v, %v; want %v", c.name, c.unit, got, ok, c.want)
		}
	}
	if _, ok := f.median("Read/floor", "ns/op"); ok {
		t.Error("a benchmark that did not run has a median")
	}
	f.sum("Sum", "ns/op", "Read/cockpitfs", "Read/cockpitfs")
	if got, ok := f.median("Sum", "ns/op"); !ok || got != 400000 {
		t.Errorf("sum of two medians = %v, %v; want 400000", got, ok)
	}
	f.sum("Partial", "ns/op", "Read/cockpitfs", "Read/floor")
	if _, ok := f.median("Partial", "ns/op"); ok {
		t.Error("a sum over a benchmark that did not run has a value")
	}
}
