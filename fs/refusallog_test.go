package fs

import (
	"testing"
	"time"
)

// A uid's refusal lines: refusalLogLines a window, the rest counted; the count is said with the
// uid's first line of a later window, and another uid has lines of its own.
func TestRefusalLimiterCountsWhatItDrops(t *testing.T) {
	var l refusalLimiter
	start := time.Unix(1000, 0)
	for i := range refusalLogLines {
		if dropped, ok := l.allow(7, start.Add(time.Duration(i)*time.Second)); !ok || dropped != 0 {
			t.Fatalf("line %d: %d, %v", i, dropped, ok)
		}
	}
	for i := range 5 {
		if _, ok := l.allow(7, start.Add(20*time.Second)); ok {
			t.Fatalf("line %d past the bound was allowed", refusalLogLines+i)
		}
	}
	if dropped, ok := l.allow(8, start.Add(30*time.Second)); !ok || dropped != 0 {
		t.Fatalf("another uid: %d, %v", dropped, ok)
	}
	if dropped, ok := l.allow(7, start.Add(refusalLogWindow)); !ok || dropped != 5 {
		t.Fatalf("the next window's first line: %d dropped, %v; want 5, true", dropped, ok)
	}
	if dropped, ok := l.allow(7, start.Add(refusalLogWindow+time.Second)); !ok || dropped != 0 {
		t.Fatalf("the count is said once: %d, %v", dropped, ok)
	}
}
