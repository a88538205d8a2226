// Command soak drives a real cockpitfs daemon through many mixed operations — cockpit and stack
// create/remove cycles, claims and releases, 64 KiB writes, reads and listings — and prints the
// daemon's RSS, open fds, goroutines and the data directory's disk use at start and end, to show
// they stay flat. Run it through scripts/soak.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	bin := flag.String("bin", "", "the cockpitfs binary")
	ops := flag.Int("ops", 100000, "how many operations")
	samples := flag.Int("samples", 10, "figures printed along the way, evenly spaced")
	churn := flag.Int("churn", 3000, "cockpits with 60 KB configs made and removed first, beside 200 leased stacks")
	flag.Parse()
	if err := soak(*bin, *ops, *churn, max(1, *samples)); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

// figures are what must stay flat. RSS is split as the kernel counts it: anonymous memory (the Go
// heap, badger's allocations) and file pages (the binary's own code, badger's memory-mapped logs
// and tables, which grow with the files and the kernel may drop); the Go heap's bytes live at its
// last collection and the size its next collection waits for (GOGC: twice the live heap, at
// least 4 MiB) tell a leak from a target.
type figures struct {
	ops                              int
	rssKiB, anonKiB, fileKiB, fds    int
	goroutines                       int
	heapAllocKiB, nextGCKiB, diskKiB int64
}

func (f figures) row(name string) string {
	return fmt.Sprintf("%-6s %8d %8d %8d %8d %9d %9d %5d %10d %8d", name, f.ops, f.rssKiB, f.anonKiB, f.fileKiB,
		f.heapAllocKiB, f.nextGCKiB, f.fds, f.goroutines, f.diskKiB)
}

const header = "        ops      RSS     anon     file heap-live   next-gc   fds goroutines     disk (KiB)"

func soak(bin string, ops, churn, samples int) error {
	base, err := os.MkdirTemp("", "cockpitfs-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(base)
	mnt, data := filepath.Join(base, "mnt"), filepath.Join(base, "data")
	logPath := filepath.Join(base, "daemon.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	daemon := exec.Command(bin, "mount", "--data", data, mnt)
	daemon.Stdout, daemon.Stderr = logFile, logFile
	if err := daemon.Start(); err != nil {
		return err
	}
	defer func() {
		if daemon.ProcessState == nil {
			daemon.Process.Signal(syscall.SIGTERM)
			daemon.Wait()
		}
	}()
	for !serving(mnt) {
		if daemon.ProcessState != nil {
			return errors.New("the daemon exited")
		}
		time.Sleep(20 * time.Millisecond)
	}
	w := &worker{mnt: mnt}
	if err := churnCockpits(w, daemon.Process.Pid, data, logPath, churn); err != nil {
		return err
	}
	w.mkdir("app")
	w.write("app/config", "[ports]\nstep = 10\ncount = 50\n[ports.bases]\nHTTP = 26000\n")
	const stacks = 8
	for s := range stacks {
		w.mkdir(fmt.Sprintf("app/stacks/s%d", s))
		w.create(fmt.Sprintf("app/stacks/s%d/holders/base", s))
	}
	if w.err != nil {
		return w.err
	}
	// Warm up, so start figures are of a daemon that has done each kind of work.
	cycle := func(i int) {
		s := fmt.Sprintf("app/stacks/s%d", i%stacks)
		tmp := fmt.Sprintf("app/stacks/tmp%d", i)
		w.mkdir(tmp)
		w.read(tmp + "/record")
		w.rmdir(tmp)
		w.create(s + "/holders/h")
		w.read(s + "/env")
		w.remove(s + "/holders/h")
		w.refusedWrite(s+"/holders/base", strings.Repeat("junk ", 64<<10/5), syscall.EINVAL)
		w.read(s + "/events")
		w.list("ports")
		w.stat(s + "/lease")
		if i%50 == 0 {
			c := fmt.Sprintf("tmpapp%d", i)
			w.mkdir(c)
			w.write(c+"/config", "[ports]\nstep = 10\ncount = 2\n[ports.bases]\nHTTP = 27000\n"+strings.Repeat("# padding\n", 6000))
			w.rmdir(c)
		}
	}
	for i := range 200 {
		cycle(i)
	}
	if w.err != nil {
		return w.err
	}
	time.Sleep(settled) // the start, settled, is what the settled end is held to
	start, err := measure(daemon.Process.Pid, data, logPath)
	if err != nil {
		return err
	}
	began, startOps := time.Now(), w.ops
	fmt.Println(header)
	fmt.Println(start.row("start"))
	next := ops / samples
	for i := 200; w.ops-startOps < ops && w.err == nil; i++ {
		cycle(i)
		if done := w.ops - startOps; done >= next && done < ops {
			f, err := measure(daemon.Process.Pid, data, logPath)
			if err != nil {
				return err
			}
			f.ops = done
			fmt.Println(f.row(""))
			next += ops / samples
		}
	}
	if w.err != nil {
		return w.err
	}
	end, err := measure(daemon.Process.Pid, data, logPath)
	if err != nil {
		return err
	}
	end.ops = w.ops - startOps
	fmt.Println(end.row("end"))
	fmt.Printf("%d operations in %s\n", w.ops-startOps, time.Since(began).Round(time.Second))
	if err := settledRow(daemon.Process.Pid, data, logPath, end.ops, start); err != nil {
		return err
	}
	daemon.Process.Signal(syscall.SIGTERM)
	if err := daemon.Wait(); err != nil {
		return fmt.Errorf("the daemon's exit: %w (its log: %s)", err, logPath)
	}
	out, err := exec.Command(bin, "verify", "--data", data).CombinedOutput()
	fmt.Print(string(out))
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	return nil
}

// churnCockpits makes and removes n cockpits with 60 KB configs beside 200 stacks leased in one
// cockpit, each preceded by the negative lookup of its name, while a second worker lists the
// root and reads status: the churn that drives badger's compactions hardest, and the reads that
// re-read its tables (kv/served.go). Before those reads pinned the tables, this killed the daemon
// with SIGBUS within a few hundred cockpits. Every lease must read as it did before.
func churnCockpits(w *worker, pid int, data, logPath string, n int) error {
	if n == 0 {
		return nil
	}
	w.mkdir("busy")
	w.write("busy/config", "[ports]\nstep = 1\ncount = 210\n[ports.bases]\nHTTP = 41000\n")
	leases := map[string]string{}
	for i := range 200 {
		s := fmt.Sprintf("busy/stacks/s%03d", i)
		w.mkdir(s)
		w.create(s + "/holders/h")
		if got, err := os.ReadFile(filepath.Join(w.mnt, s, "ports/HTTP")); err == nil {
			leases[s] = string(got)
		}
	}
	if w.err != nil {
		return w.err
	}
	time.Sleep(settled) // the start, settled, is what the settled end is held to
	before, err := measure(pid, data, logPath)
	if err != nil {
		return err
	}
	fmt.Println("churn: " + strconv.Itoa(n) + " cockpits of 60 KB configs beside 200 leased stacks")
	fmt.Println(header)
	fmt.Println(before.row("start"))
	reader := &worker{mnt: w.mnt}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			reader.list(".")
			reader.read("status")
		}
	}()
	doc := "[ports]\nstep = 10\ncount = 20\n[ports.bases]\nHTTP = 40500\n#" + strings.Repeat("x", 60000) + "\n"
	began := time.Now()
	for i := 0; i < n && w.err == nil && reader.err == nil; i++ {
		c := fmt.Sprintf("churn%d", i)
		w.absent(c)
		w.mkdir(c)
		w.write(c+"/config", doc)
		w.rmdir(c)
	}
	close(stop)
	<-done
	if err := errors.Join(w.err, reader.err); err != nil {
		return fmt.Errorf("churn: %w", err)
	}
	for s, want := range leases {
		if got, err := os.ReadFile(filepath.Join(w.mnt, s, "ports/HTTP")); err != nil || string(got) != want {
			return fmt.Errorf("churn: %s's lease reads %q, %v after the churn; it was %q", s, got, err, want)
		}
	}
	after, err := measure(pid, data, logPath)
	if err != nil {
		return err
	}
	fmt.Println(after.row("end"))
	fmt.Printf("churn: %d cockpits in %s, every lease as it was\n", n, time.Since(began).Round(time.Second))
	if err := settledRow(pid, data, logPath, 0, before); err != nil {
		return err
	}
	fmt.Println()
	return nil
}

// settled is how long an idle store takes to settle after writes (kv/settle.go: up to two polls
// of 5 s, then 20 s before its freed memory goes back to the kernel), with a margin.
const settled = 35 * time.Second

// settledRow prints the figures once the store has settled, and their RSS and disk against
// start's: the same daemon, with the same cockpits and stacks, settled before the phase (issue
// 42: RSS ≤ 1.5×, disk ≤ 2×).
func settledRow(pid int, data, logPath string, ops int, start figures) error {
	time.Sleep(settled)
	f, err := measure(pid, data, logPath)
	if err != nil {
		return err
	}
	f.ops = ops
	fmt.Println(f.row("settld"))
	fmt.Printf("settled: RSS %.2f× the start's, disk %.2f×\n", float64(f.rssKiB)/float64(start.rssKiB), float64(f.diskKiB)/float64(start.diskKiB))
	return nil
}

func serving(mnt string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil || !strings.Contains(string(data), " "+mnt+" ") {
		return false
	}
	_, err = os.Stat(filepath.Join(mnt, "README"))
	return err == nil
}

var statsLine = regexp.MustCompile(`stats: goroutines=(\d+) heap_live=(\d+) next_gc=(\d+)`)

// measure reads RSS and fds from /proc, disk use from the data directory's allocated blocks, and
// goroutines from the line the daemon logs on SIGUSR1.
func measure(pid int, data, logPath string) (figures, error) {
	var f figures
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return f, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		for prefix, into := range map[string]*int{"VmRSS:": &f.rssKiB, "RssAnon:": &f.anonKiB, "RssFile:": &f.fileKiB} {
			if strings.HasPrefix(line, prefix) {
				fmt.Sscanf(strings.TrimPrefix(line, prefix), "%d", into)
			}
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return f, err
	}
	f.fds = len(fds)
	err = filepath.Walk(data, func(_ string, info os.FileInfo, err error) error {
		if err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				f.diskKiB += st.Blocks / 2
			}
		}
		return nil
	})
	if err != nil {
		return f, err
	}
	before := countLines(logPath)
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		return f, err
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		lines := readLines(logPath)
		for _, l := range lines[min(before, len(lines)):] {
			if m := statsLine.FindStringSubmatch(l); m != nil {
				fmt.Sscanf(m[1], "%d", &f.goroutines)
				fmt.Sscanf(m[2], "%d", &f.heapAllocKiB)
				fmt.Sscanf(m[3], "%d", &f.nextGCKiB)
				f.heapAllocKiB, f.nextGCKiB = f.heapAllocKiB/1024, f.nextGCKiB/1024
				return f, nil
			}
		}
	}
	return f, errors.New("the daemon logged no stats line on SIGUSR1")
}

func readLines(path string) []string {
	file, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer file.Close()
	var lines []string
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

func countLines(path string) int { return len(readLines(path)) }

// worker runs operations through the mount, counting them; the first unexpected outcome stops it.
type worker struct {
	mnt string
	ops int
	err error
}

func (w *worker) do(what string, fn func(path string) error, rel string) {
	if w.err != nil {
		return
	}
	w.ops++
	if err := fn(filepath.Join(w.mnt, rel)); err != nil {
		w.err = fmt.Errorf("%s %s: %w", what, rel, err)
	}
}

func (w *worker) mkdir(rel string) {
	w.do("mkdir", func(p string) error { return os.Mkdir(p, 0o755) }, rel)
}
func (w *worker) rmdir(rel string) { w.do("rmdir", os.Remove, rel) }

// absent wants rel not to exist: a negative lookup.
func (w *worker) absent(rel string) {
	w.do("stat", func(p string) error {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("want ENOENT, got %v", err)
		}
		return nil
	}, rel)
}
func (w *worker) remove(rel string) {
	w.do("rm", os.Remove, rel)
}
func (w *worker) stat(rel string) {
	w.do("stat", func(p string) error { _, err := os.Stat(p); return err }, rel)
}
func (w *worker) read(rel string) {
	w.do("read", func(p string) error { _, err := os.ReadFile(p); return err }, rel)
}
func (w *worker) list(rel string) {
	w.do("ls", func(p string) error { _, err := os.ReadDir(p); return err }, rel)
}
func (w *worker) create(rel string) {
	w.do("create", func(p string) error {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	}, rel)
}
func (w *worker) write(rel, content string) {
	w.do("write", func(p string) error { return os.WriteFile(p, []byte(content), 0o644) }, rel)
}

// refusedWrite writes content in one write(2) and wants errno, from the write or, for a file the
// daemon checks whole, from the close.
func (w *worker) refusedWrite(rel, content string, errno syscall.Errno) {
	w.do("write", func(p string) error {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			return err
		}
		_, werr := f.Write([]byte(content))
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if !errors.Is(werr, errno) {
			return fmt.Errorf("want %v, got %v", errno, werr)
		}
		return nil
	}, rel)
}
