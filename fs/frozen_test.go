package fs

import (
	"bytes"
	"testing"
	"time"
)

// frozenNode is a frozen node of path holding data, as a lookup makes one.
func frozenNode(fsys *FS, path string, data []byte) (*file, view) {
	v := view{data: data}
	return fsys.frozenFile(&file{path: path}, v), v
}

func holds(f *file) bool {
	_, ok := f.fixed.content()
	return ok
}

// A node keeps its content while it is its path's latest and for retireAfter once a newer one
// was looked up; one looked up again is the latest again, content and all; past maxRetiredBytes
// the oldest retired content goes at once.
func TestFrozenNodesLetOldContentsGo(t *testing.T) {
	fsys := &FS{}
	a1, v1 := frozenNode(fsys, "s/record", []byte("one"))
	a2, v2 := frozenNode(fsys, "s/record", []byte("two"))
	other, vo := frozenNode(fsys, "t/record", []byte("other"))
	fsys.frozen.keep(a1, v1)
	fsys.frozen.keep(other, vo)
	fsys.frozen.keep(a2, v2)
	if !holds(a1) || !holds(a2) || !holds(other) {
		t.Fatal("a node retired just now let its content go")
	}
	for deadline := time.Now().Add(10 * retireAfter); holds(a1); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a node retired %v ago keeps its content", 10*retireAfter)
		}
	}
	if !holds(a2) || !holds(other) {
		t.Fatal("a path's latest node let its content go")
	}
	// The content came back: its node is looked up again and keeps it.
	fsys.frozen.keep(a1, v1)
	if v, ok := a1.fixed.content(); !ok || !bytes.Equal(v.data, v1.data) {
		t.Fatalf("a node looked up again holds %q, want %q", v.data, v1.data)
	}

	big := make([]byte, maxRetiredBytes/2+1)
	b1, w1 := frozenNode(fsys, "u/record", big)
	b2, w2 := frozenNode(fsys, "u/record", big)
	b3, w3 := frozenNode(fsys, "u/record", big)
	fsys.frozen.keep(b1, w1)
	fsys.frozen.keep(b2, w2)
	fsys.frozen.keep(b3, w3)
	if holds(b1) || !holds(b2) || !holds(b3) {
		t.Fatalf("past %d retired bytes: the oldest holds its content: %v, the next %v, the latest %v", maxRetiredBytes, holds(b1), holds(b2), holds(b3))
	}
}
