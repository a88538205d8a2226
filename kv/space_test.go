package kv

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// An ample answer stands for spaceRecheck, and only then: the gauge asks again once it is older,
// and at every commit while the disk is within spaceMargin of the reserve. A file closed behind
// the gauge's back shows when it asks (fstatfs of a closed descriptor fails).
func TestSpaceGaugeAsksAgainWhenNotAmple(t *testing.T) {
	dir := t.TempDir()
	gauge := func(dir string) (*spaceGauge, *os.File) {
		f, err := os.Create(filepath.Join(dir, "probe"))
		if err != nil {
			t.Fatal(err)
		}
		return &spaceGauge{}, f
	}

	g, f := gauge(dir)
	free, err := freeSpace(f, dir)
	if err != nil || free < freeReserve+2*spaceMargin {
		t.Skipf("%s has %d bytes free (%v): not enough to be ample", dir, free, err)
	}
	if err := g.check(f, dir); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := g.check(f, dir); err != nil {
		t.Fatalf("an ample answer did not stand: %v", err)
	}
	g.ample = g.ample.Add(-spaceRecheck)
	if err := g.check(f, dir); err == nil {
		t.Fatal("an ample answer older than spaceRecheck stood")
	}

	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	small := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(small, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount a tmpfs: %v", err)
	}
	defer unix.Unmount(small, unix.MNT_DETACH)
	g, f = gauge(small)
	if err := g.check(f, small); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := g.check(f, small); err == nil {
		t.Fatal("an answer within spaceMargin of the reserve stood")
	}
}
