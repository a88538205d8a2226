package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine/portlock"
	"github.com/cockpitfs/cockpitfs/internal/netns"
)

// The machine of issue 42 item 5: one daemon's store of 10,000 stacks (ten cockpits of 1,000,
// each stack leasing a family of one port), the holds of 100 other daemons on the machine (100
// processes holding 100 ports each, as daemons do: abstract unix socket names that answer who
// holds them), and 1,000 `wait` readers blocked on the daemon at once, each reading again as soon
// as its read returns.
const (
	scaleCockpits   = 10
	scaleStacksEach = 1000
	scaleDaemons    = 100
	scaleHoldsEach  = 100
	scaleWaiters    = 1000
	// scaleHeldBase is the first port the other daemons hold, apart from every lease of the two
	// daemons measured: what they cost is the size of the machine's tables, not a family lost.
	scaleHeldBase = 50000
)

// BenchmarkScale (issue 42 item 5): the daemon of that machine beside an empty one (a fresh store
// holding only app/s and the idle app/n, in a network namespace of its own), in one run: each one's
// mount-ready time (exec to serving; the loaded one restarted on its 10,000 stacks, retaking their
// 10,000 holds among the others' 10,000), a claim through each mount (a co-tenant's, undone by its
// release; and a new lease, undone by a sleep drain), paired, and the loaded daemon's RSS with the
// readers blocked in it.
func BenchmarkScale(b *testing.B) {
	if daemonNetns == nil {
		b.Skip("needs root: the other daemons' holds go in a network namespace of their own")
	}
	ns, err := netns.New()
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	run := fmt.Sprintf("scale-%d", time.Now().UnixNano())
	loaded := newDaemon(run + "-loaded")
	loaded.ns = ns
	defer os.RemoveAll(filepath.Dir(loaded.Dir))
	defer loaded.stop()
	if _, err := loaded.start(); err != nil {
		b.Fatal(err)
	}
	if err := loaded.setupScale(); err != nil {
		b.Fatalf("%v\n%s", err, loaded.log.String())
	}
	loaded.stop()
	for i := range scaleDaemons {
		stop, err := holdPorts(ns, scaleHeldBase+i*scaleHoldsEach, scaleHoldsEach)
		if err != nil {
			b.Fatal(err)
		}
		defer stop()
	}
	readyLoaded, err := loaded.start()
	if err != nil {
		b.Fatal(err)
	}
	empty := newDaemon(run + "-empty")
	defer os.RemoveAll(filepath.Dir(empty.Dir))
	defer empty.stop()
	readyEmpty, err := empty.start()
	if err != nil {
		b.Fatal(err)
	}
	for _, d := range []*daemon{loaded, empty} {
		if d != loaded {
			if err := d.setupStack(); err != nil {
				b.Fatalf("%v\n%s", err, d.log.String())
			}
		}
		if err := os.Mkdir(d.path("app", "stacks", "n"), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	var waits []string
	for i := range scaleWaiters {
		c, s := i%scaleCockpits, i/scaleCockpits
		waits = append(waits, loaded.path(fmt.Sprintf("c%d", c), "stacks", fmt.Sprintf("s%d", s), "wait"))
	}
	// Ten of them wait on the stack the claims are made on, and wake at each.
	for i := range 10 {
		waits[i] = loaded.path("app", "stacks", "s", "wait")
	}
	stopWaiters, err := startWaiters(waits)
	if err != nil {
		b.Fatal(err)
	}
	defer stopWaiters()
	claims := func(d *daemon) (cotenant, lease op) {
		holder := d.path("app", "stacks", "s", "holders", "t")
		idle := d.path("app", "stacks", "n")
		return op{
				run:  func() error { return writeFile(holder, unix.O_CREAT, "") },
				undo: func() error { return retry(func() error { return unix.Unlink(holder) }) },
			}, op{
				run:  func() error { return writeFile(filepath.Join(idle, "holders", "h"), unix.O_CREAT, "") },
				undo: func() error { return sleepDrain(idle) },
			}
	}
	cotenantLoaded, leaseLoaded := claims(loaded)
	cotenantEmpty, leaseEmpty := claims(empty)
	paired(b, map[string]op{
		"claim-loaded": cotenantLoaded,
		"claim-empty":  cotenantEmpty,
		"lease-loaded": leaseLoaded,
		"lease-empty":  leaseEmpty,
	})
	b.ReportMetric(float64(readyLoaded.Microseconds())/1000, "ms-ready-loaded")
	b.ReportMetric(float64(readyEmpty.Microseconds())/1000, "ms-ready-empty")
	b.ReportMetric(loaded.mib(b, "VmRSS"), "MiB-loaded")
	b.ReportMetric(loaded.mib(b, "RssAnon"), "MiB-loaded-anon") // the rest: the store's files mapped
	b.ReportMetric(loaded.mib(b, "VmHWM"), "MiB-loaded-peak")
	b.ReportMetric(empty.mib(b, "VmRSS"), "MiB-empty")
}

// setupScale makes the 10,000 stacks, each claimed by an untracked holder, four writers at once,
// then app/s as setupStack makes it.
func (d *daemon) setupScale() error {
	for c := range scaleCockpits {
		cockpit := d.path(fmt.Sprintf("c%d", c))
		if err := os.Mkdir(cockpit, 0o755); err != nil {
			return err
		}
		// One port a family (a config names at most 1,024 candidate ports), the cockpits' ranges
		// above app's: from 21000+1000c.
		doc := fmt.Sprintf("[ports]\nstep = 1\ncount = %d\n[ports.bases]\nHTTP = %d\n", scaleStacksEach, 21000+1000*c)
		if err := writeFile(filepath.Join(cockpit, "config"), unix.O_TRUNC, doc); err != nil {
			return err
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < scaleCockpits*scaleStacksEach; i += 4 {
				stack := d.path(fmt.Sprintf("c%d", i%scaleCockpits), "stacks", fmt.Sprintf("s%d", i/scaleCockpits))
				err := os.Mkdir(stack, 0o755)
				if err == nil {
					err = writeFile(filepath.Join(stack, "holders", "base"), unix.O_CREAT, "pid=none checkout=/src/base")
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %w", stack, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return d.setupStack()
}

// scaleHelperEnv makes a re-exec of this binary one of the scale benchmark's other processes (see
// TestMain): "holds <first> <count>" holds those ports as a daemon does, until its stdin closes;
// "wait" reads each `wait` file named on its stdin, over and over, until it is killed.
const scaleHelperEnv = "COCKPITFS_BENCH_SCALE"

// holdPorts starts a process in ns holding count ports from first, and returns what ends it.
func holdPorts(ns *netns.NS, first, count int) (func(), error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=holds %d %d", scaleHelperEnv, first, count))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := ns.Do(cmd.Start); err != nil {
		return nil, err
	}
	stop := func() { stdin.Close(); cmd.Wait() }
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		stop()
		return nil, fmt.Errorf("the holder of ports %d-%d: %q, %v", first, first+count-1, line, err)
	}
	return stop, nil
}

// startWaiters starts a process with a reader blocked on each of paths, and returns what kills it.
func startWaiters(paths []string) (func(), error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), scaleHelperEnv+"=wait")
	cmd.Stdin = strings.NewReader(strings.Join(paths, "\n") + "\n")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	stop := func() { cmd.Process.Kill(); cmd.Wait() }
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		stop()
		return nil, fmt.Errorf("the waiters: %q, %v", line, err)
	}
	return stop, nil
}

// scaleHelper is the process spec names (see scaleHelperEnv); it returns the exit status.
func scaleHelper(spec string) int {
	fields := strings.Fields(spec)
	switch {
	case len(fields) == 3 && fields[0] == "holds":
		first, _ := strconv.Atoi(fields[1])
		count, _ := strconv.Atoi(fields[2])
		for port := first; port < first+count; port++ {
			if _, err := portlock.Machine.Take(port, portlock.Identity{PID: os.Getpid(), Data: "/other/daemon", Cockpit: "other", Stack: "s", Key: "HTTP"}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin)
		return 0
	case len(fields) == 1 && fields[0] == "wait":
		data, err := io.ReadAll(os.Stdin)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		var opened sync.WaitGroup
		for _, path := range strings.Fields(string(data)) {
			opened.Add(1)
			go func() {
				buf := make([]byte, 64)
				first := true
				for {
					f, err := os.Open(path)
					if first {
						opened.Done()
						first = false
					}
					if err != nil {
						fmt.Fprintln(os.Stderr, err)
						time.Sleep(100 * time.Millisecond)
						continue
					}
					f.Read(buf) // blocks until the stack changes
					f.Close()
				}
			}()
		}
		opened.Wait()
		fmt.Println("ready")
		select {}
	}
	fmt.Fprintf(os.Stderr, "%s: unknown %q\n", scaleHelperEnv, spec)
	return 2
}
