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
	read, claim := [2]string{"Read/cockpitfs", "ns/op"}, [2]string{"Claim/peer", "ns/claim"}
	f.sum("Sum", "ns/op", read, claim)
	if got, ok := f.median("Sum", "ns/op"); !ok || got != 2023021.5 {
		t.Errorf("sum of two medians = %v, %v; want 2023021.5", got, ok)
	}
	f.sum("Partial", "ns/op", read, [2]string{"Read/floor", "ns/op"})
	if _, ok := f.median("Partial", "ns/op"); ok {
		t.Error("a sum over a benchmark that did not run has a value")
	}
}

// Paired figures compare run by run: the median of each line's own ratio, not the ratio of
// medians taken from different runs.
func TestPairedRatioIsPerRun(t *testing.T) {
	out := `BenchmarkRead-2 	 300	 1 ns/op	 100 ns/cockpitfs	 50 ns/floor
BenchmarkRead-2 	 300	 1 ns/op	 30 ns/cockpitfs	 20 ns/floor
BenchmarkRead-2 	 300	 1 ns/op	 60 ns/cockpitfs	 100 ns/floor
`
	f := read(bufio.NewScanner(strings.NewReader(out)))
	if r, ok := f.pairedRatio("Read", "ns/cockpitfs", "ns/floor"); !ok || r != 1.5 {
		t.Errorf("paired ratio = %v, %v; want 1.5 (runs 2, 1.5, 0.6)", r, ok)
	}
	tab := &table{f: f}
	if r, verdict := tab.ratio("Read", "ns/cockpitfs", "Read", "ns/floor", atMost(1.2)); r != "1.50×" || verdict != "MISSED" {
		t.Errorf("table ratio = %s %s; want 1.50× MISSED, not the ratio of medians 60/50 = 1.20×", r, verdict)
	}
	if _, ok := f.pairedRatio("Read", "ns/cockpitfs", "ns/tmpfs"); ok {
		t.Error("a paired ratio with a unit no line has")
	}
}
