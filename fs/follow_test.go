package fs

import "testing"

// An open following an events file keeps what it saw at the offsets it saw it when the file
// drops a line from its middle, takes only the lines numbered after its last, and ignores a
// rendering older than its view.
func TestFollowKeepsOffsets(t *testing.T) {
	h := &handle{view: view{data: []byte("a\nb\nc\n"), seqs: []uint64{1, 2, 3}, start: 100}, base: 100}
	// b was dropped (a uid's oldest refusal) and d appended: a fresh open sees a, c, d.
	h.follow(view{data: []byte("a\nc\nd\n"), seqs: []uint64{1, 3, 4}, start: 102})
	if got := string(h.view.data); got != "a\nb\nc\nd\n" || h.view.start != 100 {
		t.Fatalf("after a middle line dropped and one appended: %q at %d", got, h.view.start)
	}
	h.follow(view{data: []byte("a\nb\n"), seqs: []uint64{1, 2}, start: 100}) // older
	if got := string(h.view.data); got != "a\nb\nc\nd\n" {
		t.Fatalf("an older rendering changed the view: %q", got)
	}
	// a left the file (and b before it): they leave the view from its front, the others keep
	// their offsets.
	h.follow(view{data: []byte("c\nd\ne\n"), seqs: []uint64{3, 4, 5}, start: 104})
	if got := string(h.view.data); got != "c\nd\ne\n" || h.view.start != 104 {
		t.Fatalf("after the first line left: %q at %d", got, h.view.start)
	}
}
