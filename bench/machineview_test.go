package bench

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkMachineView (issue 42 item 1): the machine-wide views as a busy runner's daemon serves
// them. `ls -l ports` (the real ls: a listing and an lstat of every entry) with 1,024 leased ports
// and with 8,192 (eight cockpits of 128 stacks of eight ports), per entry, each a median of b.N
// runs taken at that size; and `cat status` and `cat status.json` with 10 stacks (a daemon of
// their own) and with 1,000, read in turn, unchanged since the last read and after a commit on
// one stack of each.
func BenchmarkMachineView(b *testing.B) {
	d := newDaemon(fmt.Sprintf("machine-view-%d", time.Now().UnixNano()))
	defer os.RemoveAll(filepath.Dir(d.Dir))
	defer d.stop()
	if _, err := d.start(); err != nil {
		b.Fatal(err)
	}
	const cockpits, stacks, bases = 8, 128, 8
	var config strings.Builder
	fmt.Fprintf(&config, "[ports]\nstep = %d\ncount = %d\n[ports.bases]\n", bases, stacks)
	claim := func(d *daemon, cockpit string, i int) error {
		stack := d.path(cockpit, "stacks", fmt.Sprintf("s%d", i))
		if err := os.Mkdir(stack, 0o755); err != nil {
			return err
		}
		return writeFile(filepath.Join(stack, "holders", "h"), unix.O_CREAT, "pid=none")
	}
	timed := func(name string, args ...string) time.Duration {
		var samples []time.Duration
		for range b.N {
			cmd := exec.Command(name, args...)
			start := time.Now()
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("%s %v: %v\n%s", name, args, err, out)
			}
			samples = append(samples, time.Since(start))
		}
		return median(samples)
	}
	ports := func() int {
		entries, err := os.ReadDir(d.path("ports"))
		if err != nil {
			b.Fatal(err)
		}
		return len(entries)
	}
	// cockpit makes cockpit c on d, its bases from base, and claims its first n stacks.
	cockpit := func(d *daemon, c, base, n int) {
		cockpit := fmt.Sprintf("c%d", c)
		var cfg strings.Builder
		cfg.WriteString(config.String())
		for k := range bases {
			fmt.Fprintf(&cfg, "P%d = %d\n", k, base+k)
		}
		if err := os.Mkdir(d.path(cockpit), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := writeFile(d.path(cockpit, "config"), unix.O_TRUNC, cfg.String()); err != nil {
			b.Fatalf("%v\n%s", err, d.log.String())
		}
		for i := range n {
			if err := claim(d, cockpit, i); err != nil {
				b.Fatalf("%s/s%d: %v\n%s", cockpit, i, err, d.log.String())
			}
		}
	}
	for c := range cockpits {
		cockpit(d, c, 20000+c*stacks*bases, stacks)
		if c == 0 {
			n := ports()
			b.ReportMetric(float64(timed("ls", "-l", d.path("ports")).Nanoseconds())/float64(n), "ns/ls-entry-1024")
		}
	}
	n := ports()
	b.ReportMetric(float64(n), "ports")
	b.ReportMetric(float64(timed("ls", "-l", d.path("ports")).Nanoseconds()), "ns/ls-8192")
	b.ReportMetric(float64(timed("ls", "-l", d.path("ports")).Nanoseconds())/float64(n), "ns/ls-entry-8192")
	// The 10 stacks are a daemon's of their own, so that its status is read in turn with the
	// 1,000 stacks', through the same load; its ports lie above the other's, and it starts once
	// ports is listed (it would list its holds).
	small := newDaemon(fmt.Sprintf("machine-view-small-%d", time.Now().UnixNano()))
	defer os.RemoveAll(filepath.Dir(small.Dir))
	defer small.stop()
	if _, err := small.start(); err != nil {
		b.Fatal(err)
	}
	cockpit(small, 0, 40000, 10)
	// cat file (status or status.json) of each daemon in turn, b.N times, each time after
	// change(i) on both (untimed); its output to /dev/null, so that what is timed is the file's
	// reading, not a pipe's.
	cat := func(d *daemon, file string) time.Duration {
		var stderr bytes.Buffer
		cmd := exec.Command("cat", d.path(file))
		cmd.Stderr = &stderr
		start := time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatalf("cat %s: %v\n%s", d.path(file), err, stderr.String())
		}
		return time.Since(start)
	}
	readBoth := func(file string, change func(d *daemon, i int)) (ten, thousand time.Duration) {
		var tens, thousands []time.Duration
		for i := range b.N {
			change(small, i)
			change(d, i)
			if i%2 == 0 {
				tens, thousands = append(tens, cat(small, file)), append(thousands, cat(d, file))
			} else {
				thousands, tens = append(thousands, cat(d, file)), append(tens, cat(small, file))
			}
		}
		return median(tens), median(thousands)
	}
	// A read after a commit reads that stack again and renders the file anew.
	commit := func(d *daemon, i int) {
		holder := d.path("c0", "stacks", "s0", "holders", "x")
		var err error
		if i%2 == 0 {
			err = writeFile(holder, unix.O_CREAT, "pid=none")
		} else {
			err = os.Remove(holder)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	for _, file := range []string{"status", "status.json"} {
		name := strings.ReplaceAll(file, ".", "-")
		ten, thousand := readBoth(file, func(*daemon, int) {})
		b.ReportMetric(float64(ten.Nanoseconds()), "ns/"+name+"-10")
		b.ReportMetric(float64(thousand.Nanoseconds()), "ns/"+name+"-1000")
		ten, thousand = readBoth(file, commit)
		b.ReportMetric(float64(ten.Nanoseconds()), "ns/"+name+"-10-changed")
		b.ReportMetric(float64(thousand.Nanoseconds()), "ns/"+name+"-1000-changed")
	}
}

func median(samples []time.Duration) time.Duration {
	slices.Sort(samples)
	return samples[len(samples)/2]
}
