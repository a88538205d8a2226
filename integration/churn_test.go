package integration

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestChurnRacesCompactions is the short form of scripts/soak's churn (SOAK=churn): cockpits with
// large configs made and removed, which drives badger's compactions hard, while negative lookups,
// listings and reads race them. Each negative lookup and each scan re-reads badger's tables
// through maps of kv's own (kv/served.go): before those reads pinned the tables, a compaction
// truncating one under a read killed the daemon with SIGBUS. The daemon must be alive at the
// end, every lease as it was, verify clean (stop runs it); then, killed in the middle of
// requests, it mounts again on the same point with no umount in between. The race a faulting
// read needs is rare at the suite's size under -race: kv's TestServedCheckOutlivesCompaction
// makes it every time, and scripts/soak's churn within seconds.
func TestChurnRacesCompactions(t *testing.T) {
	t.Parallel()
	m := newMount(t)
	// 200 stacks with a lease each fill the store's tables, as a busy machine's do.
	const stacks = 200
	names := make([]string, stacks)
	for i := range names {
		names[i] = fmt.Sprintf("s%03d", i)
	}
	m.ok("mkdir $M/app && printf '[ports]\\nstep = 1\\ncount = 210\\n[ports.bases]\\nHTTP = 40500\\n' > $M/app/config")
	ports := map[string]string{}
	for _, s := range names {
		if err := os.Mkdir(m.Path("app", "stacks", s), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(m.Path("app", "stacks", s, "holders", "h"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		ports[s] = m.read("app", "stacks", s, "ports", "HTTP")
	}

	cockpits := 100
	if os.Getenv("COCKPITFS_LONG") != "" {
		cockpits = 1000
	}
	var stop atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	race := func(read func(i int) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				if err := read(i); err != nil {
					t.Errorf("while cockpits churn: %v", err)
					stop.Store(true)
					return
				}
				reads.Add(1)
				time.Sleep(time.Millisecond) // a reader's pace: racing, not starving the writer
			}
		}()
	}
	// Negative lookups at the root and in a cockpit, of names among those made (their keys inside
	// the tables' ranges, so that each lookup reads the tables).
	race(func(i int) error {
		for _, p := range []string{m.Path(fmt.Sprintf("churn%d-", i%cockpits)), m.Path("app", "stacks", names[i%stacks]+"-")} {
			if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("stat %s: %v, want ENOENT", p, err)
			}
		}
		return nil
	})
	race(func(int) error { // scans
		if _, err := os.ReadDir(m.Dir); err != nil {
			return err
		}
		_, err := os.ReadFile(m.Path("status"))
		return err
	})
	race(func(i int) error { // reads of what must not change
		s := names[i%stacks]
		got, err := os.ReadFile(m.Path("app", "stacks", s, "ports", "HTTP"))
		if err != nil || string(got) != ports[s] {
			return fmt.Errorf("%s's port: %q, %v; want %q", s, got, err, ports[s])
		}
		return nil
	})
	// The churn is python's, as a user's script's would be (the reproduction).
	churn := m.sh(`python3 - "$M" ` + strconv.Itoa(cockpits) + ` <<'EOF'
import os, sys
M, n = sys.argv[1], int(sys.argv[2])
doc = "[ports]\nstep = 10\ncount = 20\n[ports.bases]\nHTTP = 45000\n#" + "x" * 60000 + "\n"
for i in range(n):
    c = f"{M}/churn{i}"; os.mkdir(c)
    with open(f"{c}/config", "w") as f: f.write(doc)
    os.rmdir(c)
EOF`)
	if churn.Code != 0 {
		t.Errorf("the churn: exit %d\n%s", churn.Code, churn.Stderr)
	}
	stop.Store(true)
	wg.Wait()
	if !serving(m.Dir) {
		t.Fatalf("the daemon died during the churn\n%s", m.log)
	}
	t.Logf("%d cockpits made and removed while %d reads raced them", cockpits, reads.Load())
	for _, s := range names {
		if got := m.read("app", "stacks", s, "ports", "HTTP"); got != ports[s] {
			t.Errorf("%s's port after the churn: %q, want %q", s, got, ports[s])
		}
	}

	// Killed with requests in flight, as a fault would kill it: the next mount needs no umount.
	stop.Store(false)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				os.Stat(m.Path(fmt.Sprintf("nosuch%d", reads.Add(1))))
				os.ReadFile(m.Path("status"))
			}
		}()
	}
	m.Kill()
	stop.Store(true)
	wg.Wait()
	m.start(m.args...)
	for _, s := range names {
		if got := m.read("app", "stacks", s, "ports", "HTTP"); got != ports[s] {
			t.Errorf("%s's port after kill -9 and mount: %q, want %q", s, got, ports[s])
		}
	}
}
