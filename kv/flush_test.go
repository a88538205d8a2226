package kv

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// The candidates run from the top of the tree down to the data directory, whether the data
// directory was named absolutely or relative to the working directory.
func TestFlushCandidatesTopFirst(t *testing.T) {
	if got, want := flushCandidates("/a/b/data"), []string{"/", "/a", "/a/b", "/a/b/data"}; !slices.Equal(got, want) {
		t.Errorf("flushCandidates(/a/b/data) = %q, want %q", got, want)
	}
	t.Chdir(t.TempDir())
	abs, err := filepath.Abs("data")
	if err != nil {
		t.Fatal(err)
	}
	if got := flushCandidates("data"); got[0] != "/" || got[len(got)-1] != abs || len(got) != len(flushCandidates(abs)) {
		t.Errorf("flushCandidates(data) = %q, want / first and %s last", got, abs)
	}
}

// On a file system where a round flushes through a directory (ext4 without a journal, as on this
// project's benchmark disk and CI), that directory is the topmost ancestor of the store on the
// store's file system: a nearer one shared its block of the inode table with whatever was made
// beside it, and a write there made every round three device requests instead of two.
func TestFlushTargetIsTheTopOfTheFileSystem(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, segmentName(1))
	if err := os.WriteFile(path, make([]byte, pageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	seg, err := openSegment(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.close()
	if seg.flush == nil {
		t.Skip("this file system flushes by an fdatasync of the segment itself")
	}
	var segment unix.Stat_t
	if err := unix.Fstat(int(seg.file.Fd()), &segment); err != nil {
		t.Fatal(err)
	}
	for _, d := range flushCandidates(dir) {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			t.Fatal(err)
		}
		if st.Dev == segment.Dev {
			if seg.flush.Name() != d {
				t.Errorf("the rounds flush through %s, want %s, the top of the store's file system", seg.flush.Name(), d)
			}
			return
		}
	}
	t.Fatalf("no candidate of %s is on its file system", dir)
}
