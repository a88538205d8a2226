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

// A node keeps its content for retireAfter after a lookup last gave it, whether a newer node of
// its path came or not (a watch kept the files of a removed stack); looked up again, it has its
// content again; past maxKeptBytes the oldest content goes at once.
func TestFrozenNodesLetOldContentsGo(t *testing.T) {
	fsys := &FS{}
	a1, v1 := frozenNode(fsys, "s/record", []byte("one"))
	a2, v2 := frozenNode(fsys, "s/record", []byte("two"))
	fsys.frozen.keep(a1, v1)
	fsys.frozen.keep(a2, v2)
	if !holds(a1) || !holds(a2) {
		t.Fatal("a node looked up just now let its content go")
	}
	for deadline := time.Now().Add(10 * retireAfter); holds(a1) || holds(a2); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("nodes no lookup gave for %v keep their content: %v, %v", 10*retireAfter, holds(a1), holds(a2))
		}
	}
	fsys.frozen.keep(a1, v1)
	if v, ok := a1.fixed.content(); !ok || !bytes.Equal(v.data, v1.data) {
		t.Fatalf("a node looked up again holds %q, want %q", v.data, v1.data)
	}

	big := make([]byte, maxKeptBytes/2)
	b1, w1 := frozenNode(fsys, "u/record", big)
	b2, w2 := frozenNode(fsys, "u/record", big)
	b3, w3 := frozenNode(fsys, "u/record", big)
	fsys.frozen.keep(b1, w1)
	fsys.frozen.keep(b2, w2)
	fsys.frozen.keep(b3, w3)
	if holds(a1) || holds(b1) || !holds(b2) || !holds(b3) {
		t.Fatalf("past %d bytes kept: the oldest hold their content: %v %v, the latest %v %v", maxKeptBytes, holds(a1), holds(b1), holds(b2), holds(b3))
	}
}
