package bench

import (
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
// and with 8,192 (eight cockpits of 128 stacks of eight ports), per entry, and `cat status` with
// 10 stacks and with 1,000 (unchanged since the last read, and after a commit on one stack):
// each a median of b.N runs taken at that size, in one run.
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
	claim := func(cockpit string, i int) error {
		stack := d.path(cockpit, "stacks", fmt.Sprintf("s%d", i))
		if err := os.Mkdir(stack, 0o755); err != nil {
			return err
		}
		return writeFile(filepath.Join(stack, "holders", "h"), unix.O_CREAT, "pid=none")
	}
	// timedAfter is the median of b.N runs of the command, each after change (untimed).
	timedAfter := func(change func(i int), name string, args ...string) time.Duration {
		var samples []time.Duration
		for i := range b.N {
			change(i)
			cmd := exec.Command(name, args...)
			start := time.Now()
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("%s %v: %v\n%s", name, args, err, out)
			}
			samples = append(samples, time.Since(start))
		}
		slices.Sort(samples)
		return samples[len(samples)/2]
	}
	timed := func(name string, args ...string) time.Duration { return timedAfter(func(int) {}, name, args...) }
	ports := func() int {
		entries, err := os.ReadDir(d.path("ports"))
		if err != nil {
			b.Fatal(err)
		}
		return len(entries)
	}
	for c := range cockpits {
		cockpit := fmt.Sprintf("c%d", c)
		var cfg strings.Builder
		cfg.WriteString(config.String())
		for k := range bases {
			fmt.Fprintf(&cfg, "P%d = %d\n", k, 20000+c*stacks*bases+k)
		}
		if err := os.Mkdir(d.path(cockpit), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := writeFile(d.path(cockpit, "config"), unix.O_TRUNC, cfg.String()); err != nil {
			b.Fatalf("%v\n%s", err, d.log.String())
		}
		for i := range stacks {
			if err := claim(cockpit, i); err != nil {
				b.Fatalf("%s/s%d: %v\n%s", cockpit, i, err, d.log.String())
			}
			if c == 0 && i == 9 {
				b.ReportMetric(float64(timed("cat", d.path("status")).Nanoseconds()), "ns/status-10")
			}
		}
		if c == 0 {
			n := ports()
			b.ReportMetric(float64(timed("ls", "-l", d.path("ports")).Nanoseconds())/float64(n), "ns/ls-entry-1024")
		}
	}
	n := ports()
	b.ReportMetric(float64(n), "ports")
	b.ReportMetric(float64(timed("ls", "-l", d.path("ports")).Nanoseconds()), "ns/ls-8192")
	b.ReportMetric(float64(timed("ls", "-l", d.path("ports")).Nanoseconds())/float64(n), "ns/ls-entry-8192")
	b.ReportMetric(float64(timed("cat", d.path("status")).Nanoseconds()), "ns/status-1000")
	// A read after a commit reads that stack again and renders the whole anew.
	holder := d.path("c7", "stacks", "s0", "holders", "x")
	b.ReportMetric(float64(timedAfter(func(i int) {
		var err error
		if i%2 == 0 {
			err = writeFile(holder, unix.O_CREAT, "pid=none")
		} else {
			err = os.Remove(holder)
		}
		if err != nil {
			b.Fatal(err)
		}
	}, "cat", d.path("status")).Nanoseconds()), "ns/status-1000-changed")
}
