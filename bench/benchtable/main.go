// Command benchtable reads `go test -bench` output for package bench on stdin and prints the
// issue 7 table: the median of every figure over the -count runs, the ratios between figures of
// that same input, and each target as met or missed.
package main

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// figures holds every value read: benchmark name (without the -GOMAXPROCS suffix) → unit → values.
type figures map[string]map[string][]float64

var procSuffix = regexp.MustCompile(`-\d+$`)

func read(in *bufio.Scanner) figures {
	f := figures{}
	for in.Scan() {
		fields := strings.Fields(in.Text())
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		name := procSuffix.ReplaceAllString(strings.TrimPrefix(fields[0], "Benchmark"), "")
		if f[name] == nil {
			f[name] = map[string][]float64{}
		}
		// fields[1] is the iteration count; then value-unit pairs.
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err == nil {
				f[name][fields[i+1]] = append(f[name][fields[i+1]], v)
			}
		}
	}
	return f
}

// median returns the median of name's unit, and whether there was any.
func (f figures) median(name, unit string) (float64, bool) {
	return medianOf(f[name][unit])
}

func medianOf(values []float64) (float64, bool) {
	vs := append([]float64(nil), values...)
	if len(vs) == 0 {
		return 0, false
	}
	sort.Float64s(vs)
	if len(vs)%2 == 1 {
		return vs[len(vs)/2], true
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2, true
}

// pairedRatio is the median over name's lines of aUnit/bUnit, each line's own ratio, when every
// line has both.
func (f figures) pairedRatio(name, aUnit, bUnit string) (float64, bool) {
	as, bs := f[name][aUnit], f[name][bUnit]
	if len(as) == 0 || len(as) != len(bs) {
		return 0, false
	}
	ratios := make([]float64, len(as))
	for i := range as {
		if bs[i] == 0 {
			return 0, false
		}
		ratios[i] = as[i] / bs[i]
	}
	return medianOf(ratios)
}

// sum records under name and unit the sum of the medians of terms ({name, unit} each), when all
// of them ran.
func (f figures) sum(name, unit string, terms ...[2]string) {
	var total float64
	for _, term := range terms {
		v, ok := f.median(term[0], term[1])
		if !ok {
			return
		}
		total += v
	}
	f[name] = map[string][]float64{unit: {total}}
}

// scaledSum is sum with factor times the median of scaled as its first term.
func (f figures) scaledSum(name, unit string, factor float64, scaled [2]string, terms ...[2]string) {
	first, ok := f.median(scaled[0], scaled[1])
	if !ok {
		return
	}
	f.sum(name, unit, terms...)
	if rest, ok := f.median(name, unit); ok {
		f[name] = map[string][]float64{unit: {factor*first + rest}}
	}
}

type table struct {
	f    figures
	rows [][5]string
}

// row prints one figure; ratio and target cells are filled by the caller ("" when none).
func (t *table) row(label, name, unit string, scale float64, shown string, ratio, target, verdict string) {
	value := "n/a"
	if v, ok := t.f.median(name, unit); ok {
		value = fmt.Sprintf("%.3g %s", v/scale, shown)
		if v/scale >= 1000 {
			value = fmt.Sprintf("%.0f %s", v/scale, shown)
		}
	}
	t.rows = append(t.rows, [5]string{label, value, ratio, target, verdict})
}

// ratio is a/b, formatted, with whether it satisfies ok: the median of each run's own ratio when
// both figures come from the same (paired) benchmark lines, else the ratio of the two medians.
func (t *table) ratio(aName, aUnit, bName, bUnit string, ok func(float64) bool) (string, string) {
	var r float64
	found := false
	if aName == bName {
		r, found = t.f.pairedRatio(aName, aUnit, bUnit)
	}
	if !found {
		a, okA := t.f.median(aName, aUnit)
		b, okB := t.f.median(bName, bUnit)
		if !okA || !okB || b == 0 {
			return "n/a", "n/a"
		}
		r = a / b
	}
	if ok(r) {
		return fmt.Sprintf("%.2f×", r), "met"
	}
	return fmt.Sprintf("%.2f×", r), "MISSED"
}

func (t *table) limit(name, unit string, ok func(float64) bool) string {
	v, found := t.f.median(name, unit)
	switch {
	case !found:
		return "n/a"
	case ok(v):
		return "met"
	default:
		return "MISSED"
	}
}

func atMost(x float64) func(float64) bool  { return func(v float64) bool { return v <= x } }
func atLeast(x float64) func(float64) bool { return func(v float64) bool { return v >= x } }

func main() {
	t := &table{f: read(bufio.NewScanner(os.Stdin))}
	const us, ms = 1e3, 1e6

	r, v := t.ratio("Read", "ns/cockpitfs", "Read", "ns/floor", atMost(1.2))
	t.row("read: cockpitfs open+read+close stacks/s/ports/HTTP (one CPU)", "Read", "ns/cockpitfs", us, "µs", r+" of floor", "≤ 1.2× floor", v)
	t.row("read: FUSE floor (go-fuse, same cache mode)", "Read", "ns/floor", us, "µs", "", "", "")
	t.row("read: tmpfs", "Read", "ns/tmpfs", us, "µs", "", "", "")
	r, _ = t.ratio("Stat", "ns/cockpitfs", "Stat", "ns/floor", atMost(1.2))
	t.row("  part: stat (path walk), cockpitfs (one CPU)", "Stat", "ns/cockpitfs", us, "µs", r+" of floor", "", "")
	t.row("  part: stat, FUSE floor", "Stat", "ns/floor", us, "µs", "", "", "")

	t.f.sum("Health/floor", "ns/op", [2]string{"Health", "ns/ports"}, [2]string{"Health", "ns/listener-check"})
	r, v = t.ratio("Health", "ns/health-crowded", "Health/floor", "ns/op", atMost(2))
	t.row("health: cat stacks/s/health beside 1,000 other stacks (one CPU)", "Health", "ns/health-crowded", us, "µs", r+" of ports/HTTP + listener check", "≤ 2×", v)
	r, _ = t.ratio("Health", "ns/health-crowded", "Health", "ns/health-alone", atLeast(0))
	t.row("health: the same on a daemon with 3 stacks", "Health", "ns/health-alone", us, "µs", "crowded is "+r, "", "")
	t.row("  part: cat ports/HTTP beside 1,000 stacks", "Health", "ns/ports", us, "µs", "", "", "")
	t.row("  part: the listener check of its 2 ports", "Health", "ns/listener-check", us, "µs", "", "", "")
	t.row("  part: the same cat of a direct-I/O file on the FUSE floor (open, fstat, 2 reads, close)", "Health", "ns/floor-direct", us, "µs", "", "", "")
	t.row("  part: the observation in-process (engine Health, its listener check and JSON)", "Health", "ns/observation", us, "µs", "", "", "")
	t.row("  part: the same cat of the FUSE floor's kept file (as ports/HTTP is served)", "Health", "ns/floor-cached", us, "µs", "", "", "")
	r, _ = t.ratio("Health", "ns/floor-direct", "Health", "ns/floor-cached", atLeast(0))
	t.row("  a file rendered at each open vs one the kernel keeps, both on the floor (no daemon work)", "Health", "ns/floor-direct", us, "µs", r+" of the kept file", "", "")
	t.f.sum("Health/least", "ns/op", [2]string{"Health", "ns/floor-direct"}, [2]string{"Health", "ns/listener-check"})
	r, _ = t.ratio("Health/least", "ns/op", "Health/floor", "ns/op", atLeast(0))
	t.row("  least health can cost: that floor cat + the listener check", "Health/least", "ns/op", us, "µs", r+" of ports/HTTP + listener check", "", "")

	t.row("list: a stack's directory, as ls lists it", "List", "ns/stack", us, "µs", "", "", "")
	r, _ = t.ratio("List", "ns/stack", "List", "ns/base-stack", atLeast(0))
	t.row("  the same by the base build, same run", "List", "ns/base-stack", us, "µs", "this build takes "+r+" its time", "", "")
	t.row("list: holders/ and an lstat of each, as ls -l", "List", "ns/holders", us, "µs", "", "", "")
	r, _ = t.ratio("List", "ns/holders", "List", "ns/base-holders", atLeast(0))
	t.row("  the same by the base build, same run", "List", "ns/base-holders", us, "µs", "this build takes "+r+" its time", "", "")

	r, v = t.ratio("Write/paired", "ns/cockpitfs", "Write/paired", "ns/floor", atMost(1.5))
	t.row("write: cockpitfs claim+release cycle (create, unlink)", "Write/paired", "ns/cockpitfs", us, "µs", r+" of floor", "≤ 1.5× floor", v)
	t.row("write: floor (2 FUSE writes + 2 write+fdatasync)", "Write/paired", "ns/floor", us, "µs", "", "", "")
	t.row("  part: create+unlink on the FUSE floor (no store)", "Write/paired", "ns/floor-create-unlink", us, "µs", "", "", "")
	t.row("  part: engine claim+release in-process (no FUSE)", "Write/engine", "ns/op", us, "µs", "", "", "")
	t.row("  part: one write+fdatasync on the data disk", "Write/paired", "ns/fdatasync", us, "µs", "", "", "")
	r, v = t.ratio("Write/paired", "ns/store-commit", "Write/paired", "ns/fdatasync", atMost(1.3))
	t.row("  part: one store commit (kv.Update, 1 record-sized key, durable)", "Write/paired", "ns/store-commit", us, "µs", r+" of write+fdatasync", "≤ 1.3×", v)
	t.row("  part: fdatasync with nothing to write (the disk's cache flush)", "Write/paired", "ns/flush", us, "µs", "", "", "")
	commit := [2]string{"Write/paired", "ns/store-commit"}
	t.f.sum("Write/least", "ns/op", commit, commit, [2]string{"Write/paired", "ns/floor-create-unlink"})
	r, _ = t.ratio("Write/least", "ns/op", "Write/paired", "ns/floor", atLeast(0))
	t.row("  least a cycle can cost on this store: 2 store commits + create/unlink floor", "Write/least", "ns/op", us, "µs", r+" of floor", "", "")
	t.row("  part: caller resolution (/proc: tid→pid, cwd, session leader, identity)", "Write/caller-resolution", "ns/op", us, "µs", "", "", "")
	t.row("  part: listener check (sock_diag, one family's 2 ports)", "Write/listener-check", "ns/op", us, "µs", "", "", "")

	r, v = t.ratio("Claim", "ns/peer", "Claim", "ns/cockpitfs", atLeast(2))
	t.row("claim: cockpitfs through the mount", "Claim", "ns/cockpitfs", us, "µs", "peer is "+r, "peer ≥ 2×", v)
	r, _ = t.ratio("Claim", "ns/peer", "Claim", "ns/engine", atLeast(2.5))
	t.row("claim: cockpitfs engine in-process", "Claim", "ns/engine", us, "µs", "peer is "+r, "", "")
	t.row("claim: peer (O_EXCL lock, temp, fsync, rename, fsync dir)", "Claim", "ns/peer", us, "µs", "", "", "")
	r, _ = t.ratio("Claim", "ns/cockpitfs", "Claim", "ns/base", atLeast(0))
	t.row("  the same claim by the base build (scripts/bench BASE=<rev>), same run", "Claim", "ns/base", us, "µs", "this build takes "+r+" its time", "", "")
	t.row("  part: the same create on the FUSE floor (no store)", "Claim", "ns/floor", us, "µs", "", "", "")
	r, _ = t.ratio("Claim", "ns/peer", "Claim", "ns/synced", atLeast(0))
	t.row("  part: the same create on the FUSE floor returning once one store commit is durable (no engine)", "Claim", "ns/synced", us, "µs", "peer is "+r, "", "")
	r, _ = t.ratio("Claim", "ns/cockpitfs", "Claim", "ns/synced", atLeast(0))
	t.row("  the claim through the mount vs that synced floor create", "Claim", "ns/cockpitfs", us, "µs", r, "", "")
	t.row("  part: one store commit (kv.Update, 1 record-sized key), same run", "Claim", "ns/commit", us, "µs", "", "", "")
	t.row("  part: one write+fdatasync, same run", "Claim", "ns/fdatasync", us, "µs", "", "", "")
	t.row("  part: the engine claim's own work (in-process, minus its store commit)", "Claim", "ns/engine-work", us, "µs", "", "", "")
	t.row("  part: caller resolution (tid→pid, cwd, session holder and its start), same run", "Claim", "ns/caller", us, "µs", "", "", "")
	claimFloor, claimCaller := [2]string{"Claim", "ns/floor"}, [2]string{"Claim", "ns/caller"}
	t.f.sum("Claim/least", "ns/claim", [2]string{"Claim", "ns/commit"}, claimFloor, claimCaller)
	r, _ = t.ratio("Claim", "ns/peer", "Claim/least", "ns/claim", atLeast(0))
	t.row("  least a claim through the mount can cost: create floor + 1 store commit + caller resolution", "Claim/least", "ns/claim", us, "µs", "peer is "+r, "", "")
	t.f.scaledSum("Claim/least-wal", "ns/claim", 1.15, [2]string{"Claim", "ns/fdatasync"}, claimFloor, claimCaller)
	r, _ = t.ratio("Claim", "ns/peer", "Claim/least-wal", "ns/claim", atLeast(0))
	t.row("  the same with the commit at 1.15× write+fdatasync (a write-ahead log)", "Claim/least-wal", "ns/claim", us, "µs", "peer is "+r, "", "")

	r, _ = t.ratio("ClaimAfterIdle", "ns/peer", "ClaimAfterIdle", "ns/cockpitfs", atLeast(0))
	t.row("claim after 30 ms idle: cockpitfs through the mount", "ClaimAfterIdle", "ns/cockpitfs", us, "µs", "peer is "+r, "", "")
	t.row("  the peer's claim after 30 ms idle", "ClaimAfterIdle", "ns/peer", us, "µs", "", "", "")
	r, _ = t.ratio("ClaimAfterIdle", "ns/peer", "ClaimAfterIdle", "ns/synced", atLeast(0))
	t.row("  the synced floor's create after 30 ms idle (FUSE create + one durable store commit, no engine)", "ClaimAfterIdle", "ns/synced", us, "µs", "peer is "+r, "", "")
	r, _ = t.ratio("ClaimAfterIdle", "ns/cockpitfs", "ClaimAfterIdle", "ns/synced", atLeast(0))
	t.row("  the claim after idle vs that synced floor create", "ClaimAfterIdle", "ns/cockpitfs", us, "µs", r, "", "")
	t.row("  one write+fdatasync after 30 ms idle", "ClaimAfterIdle", "ns/fdatasync", us, "µs", "", "", "")
	r, _ = t.ratio("ClaimAfterIdle", "ns/cockpitfs", "ClaimAfterIdle", "ns/base", atLeast(0))
	t.row("  the same claim by the base build after idle, same run", "ClaimAfterIdle", "ns/base", us, "µs", "this build takes "+r+" its time", "", "")

	r, _ = t.ratio("Touch", "ns/peer", "Touch", "ns/cockpitfs", atLeast(0))
	t.row("touch: a claim as touch(1) makes it (open O_CREAT, futimens, close)", "Touch", "ns/cockpitfs", us, "µs", "peer is "+r, "", "")
	r, _ = t.ratio("Touch", "ns/cockpitfs", "Touch", "ns/base", atLeast(0))
	t.row("  the same touch by the base build, same run", "Touch", "ns/base", us, "µs", "this build takes "+r+" its time", "", "")
	t.row("  part: the same touch on the FUSE floor (no store)", "Touch", "ns/floor", us, "µs", "", "", "")
	r, _ = t.ratio("Touch", "ns/again", "Touch", "ns/floor-again", atLeast(0))
	t.row("touch of a holder the session holds already (a Makefile's claim run again)", "Touch", "ns/again", us, "µs", r+" of the floor's", "", "")
	r, _ = t.ratio("Touch", "ns/again", "Touch", "ns/base-again", atLeast(0))
	t.row("  the same by the base build, same run", "Touch", "ns/base-again", us, "µs", "this build takes "+r+" its time", "", "")

	r, _ = t.ratio("MCP", "ns/stdio", "MCP", "ns/mount", atLeast(0))
	t.row("agent's claim: one MCP claim call to cockpitfs mcp over stdio (round trip, lease read back)", "MCP", "ns/stdio", us, "µs", r+" of a claim through the mount", "", "")
	t.row("  a claim through the mount (open O_CREAT, close), same run", "MCP", "ns/mount", us, "µs", "", "", "")
	r, _ = t.ratio("MCP", "ns/inmemory", "MCP", "ns/files", atLeast(0))
	t.row("  the same MCP claim in-process (the Go SDK's in-memory transports)", "MCP", "ns/inmemory", us, "µs", r+" of its file operations", "", "")
	t.row("  part: the claim tool's file operations alone (create, pid, holders, lease, env, entrypoints)", "MCP", "ns/files", us, "µs", "", "", "")

	r, _ = t.ratio("Proxy", "ns/proxied", "Proxy", "ns/direct", atLeast(0))
	t.row("proxy: a GET through http://http.<stack>.<cockpit>.localhost (kept-alive)", "Proxy", "ns/proxied", us, "µs", r+" of the same GET to the port", "", "")
	t.row("  the same GET straight to the stack's port, same run", "Proxy", "ns/direct", us, "µs", "", "", "")
	r, _ = t.ratio("Proxy", "ns/proxied-1000", "Proxy", "ns/proxied", atLeast(0))
	t.row("  the proxied GET with 1,000 stacks leased", "Proxy", "ns/proxied-1000", us, "µs", r+" of it with one", "", "")
	t.row("proxy: daemon RSS with 1,000 stacks leased", "Proxy", "MiB-stacks-1000", 1, "MiB", "", "", "")
	r, _ = t.ratio("Proxy", "MiB-routes-1000", "Proxy", "MiB-stacks-1000", atLeast(0))
	t.row("  after each of their 1,000 routes is asked once", "Proxy", "MiB-routes-1000", 1, "MiB", r+" of before", "", "")

	r, v = t.ratio("EtcdClaim", "ns/claim", "EtcdClaim", "ns/bare", atMost(1.5))
	t.row("etcd: claim in an engine over 3 members on loopback", "EtcdClaim", "ns/claim", us, "µs", r+" of bare Get+Txn", "≤ 1.5× bare", v)
	t.row("etcd: bare linearizable Get + Txn compare-and-swap, same cluster", "EtcdClaim", "ns/bare", us, "µs", "", "", "")
	t.row("  the same claim in an engine over badger, same run", "EtcdClaim", "ns/badger-claim", us, "µs", "", "", "")
	t.row("  etcd round trips per claim", "EtcdClaim", "roundtrips/claim", 1, "", "", "", "")
	r, v = t.ratio("EtcdMountClaim", "ns/mount-claim", "EtcdMountClaim", "ns/bare", atMost(1.5))
	t.row("etcd: claim through a daemon's mount (touch of a holder)", "EtcdMountClaim", "ns/mount-claim", us, "µs", r+" of bare Get+Txn", "≤ 1.5× bare", v)
	t.row("  bare linearizable Get + Txn compare-and-swap, same run", "EtcdMountClaim", "ns/bare", us, "µs", "", "", "")
	r, _ = t.ratio("EtcdClaim", "ns/read", "EtcdClaim", "ns/bare-read", atLeast(0))
	t.row("etcd: read of a stack's record in the engine (each open, stat)", "EtcdClaim", "ns/read", us, "µs", r+" of bare Get", "", "")
	t.row("etcd: bare linearizable Get of the same key", "EtcdClaim", "ns/bare-read", us, "µs", "", "", "")

	r, v = t.ratio("NewLease", "ns/new-lease", "NewLease", "ns/co-tenant", atMost(1.3))
	t.row("new lease: claim on an idle stack through the mount, 10,000 sockets open", "NewLease", "ns/new-lease", us, "µs", r+" of co-tenant", "≤ 1.3× co-tenant", v)
	t.row("new lease: a co-tenant's claim (lease kept), same run", "NewLease", "ns/co-tenant", us, "µs", "", "", "")
	t.row("  part: the listener check (sock_diag, 2 ports)", "NewLease", "ns/listener-check", us, "µs", "", "", "")
	t.row("  part: the 2 machine-wide holds (portlock)", "NewLease", "ns/holds", us, "µs", "", "", "")
	t.f.sum("NewLease/parts", "ns/op", [2]string{"NewLease", "ns/co-tenant"}, [2]string{"NewLease", "ns/listener-check"},
		[2]string{"NewLease", "ns/holds"})
	r, _ = t.ratio("NewLease/parts", "ns/op", "NewLease", "ns/co-tenant", atLeast(0))
	t.row("  the co-tenant's claim + the 2 parts above", "NewLease/parts", "ns/op", us, "µs", r+" of co-tenant", "", "")
	r, _ = t.ratio("NewLease", "ns/co-tenant-plus", "NewLease", "ns/co-tenant", atLeast(0))
	t.row("  the same 2 parts and the co-tenant's claim timed together", "NewLease", "ns/co-tenant-plus", us, "µs", r+" of co-tenant", "", "")
	r, _ = t.ratio("NewLease", "ns/new-lease", "NewLease", "ns/co-tenant-plus", atLeast(0))
	t.row("  the new lease vs them timed together (it sends no LOOKUP, the co-tenant's claim one)", "NewLease", "ns/new-lease", us, "µs", r, "", "")
	t.row("  part: one LOOKUP of a missing holder through the mount (what the new lease does not send)", "NewLease", "ns/lookup", us, "µs", "", "", "")
	t.row("  part: reading /proc/net/tcp and tcp6 (the check before sock_diag)", "NewLease", "ns/socket-tables", us, "µs", "", "", "")
	t.row("  TCP sockets on the machine during the run", "NewLease", "sockets", 1, "", "", "", "")
	r, v = t.ratio("NewLease", "ns/peer", "NewLease", "ns/new-lease", atLeast(2))
	t.row("new lease: the peer's (its commit + a loopback connect probe of each port, as ports.js), same run", "NewLease", "ns/peer", us, "µs", "peer is "+r, "peer ≥ 2×", v)
	r, _ = t.ratio("NewLease", "ns/peer", "NewLease", "ns/synced", atLeast(0))
	t.row("  the synced floor's create (FUSE create + one durable store commit, no engine), same run", "NewLease", "ns/synced", us, "µs", "peer is "+r, "", "")
	r, v = t.ratio("NewLeaseAfterIdle", "ns/peer", "NewLeaseAfterIdle", "ns/new-lease", atLeast(2))
	t.row("new lease after 30 ms idle: through the mount", "NewLeaseAfterIdle", "ns/new-lease", us, "µs", "peer is "+r, "peer ≥ 2×", v)
	t.row("  the peer's new lease after 30 ms idle", "NewLeaseAfterIdle", "ns/peer", us, "µs", "", "", "")
	r, _ = t.ratio("NewLeaseAfterIdle", "ns/peer", "NewLeaseAfterIdle", "ns/synced", atLeast(0))
	t.row("  the synced floor's create after 30 ms idle (the least a new lease through the mount can cost)", "NewLeaseAfterIdle", "ns/synced", us, "µs", "peer is "+r, "", "")
	r, _ = t.ratio("NewLeaseAfterIdle", "ns/new-lease", "NewLeaseAfterIdle", "ns/co-tenant", atLeast(0))
	t.row("  a co-tenant's claim after 30 ms idle", "NewLeaseAfterIdle", "ns/co-tenant", us, "µs", "new lease is "+r, "", "")
	t.row("  part: its listener check and 2 holds alone, in-process, after 30 ms idle", "NewLeaseAfterIdle", "ns/checks", us, "µs", "", "", "")
	t.f.sum("NewLeaseAfterIdle/bound", "ns/op", [2]string{"NewLeaseAfterIdle", "ns/synced"}, [2]string{"NewLeaseAfterIdle", "ns/checks"})
	r, _ = t.ratio("NewLeaseAfterIdle", "ns/peer", "NewLeaseAfterIdle/bound", "ns/op", atLeast(0))
	t.row("  the synced floor's create + that part (a new lease checking before its commit, nothing else of its own)", "NewLeaseAfterIdle/bound", "ns/op", us, "µs", "peer is "+r, "", "")

	r, _ = t.ratio("Hold", "ns/hold", "Hold", "ns/syscall-floor", atMost(2))
	t.row("holds: a new lease's 2 machine-wide holds (abstract unix sockets)", "Hold", "ns/hold", us, "µs", r+" of floor", "≤ 50 µs", t.limit("Hold", "ns/hold", atMost(50_000)))
	t.row("  part: their socket, bind and listen calls alone (floor)", "Hold", "ns/syscall-floor", us, "µs", "", "", "")
	r, _ = t.ratio("Hold", "ns/lease-held", "Hold", "ns/lease-unheld", atMost(2))
	t.row("  new lease in the engine, holding its ports", "Hold", "ns/lease-held", us, "µs", r+" of unheld", "", "")
	t.row("  new lease in the engine, not holding them, same run", "Hold", "ns/lease-unheld", us, "µs", "", "", "")

	r, v = t.ratio("Crowd", "ns/holders-1000", "Crowd", "ns/holders-1", atMost(2))
	t.row("crowded stack: a claim (touch) on a stack with 1,000 holders, through the mount", "Crowd", "ns/holders-1000", us, "µs", r+" of 1 holder", "≤ 2× 1 holder", v)
	t.row("crowded stack: the same claim on a stack with 1 holder", "Crowd", "ns/holders-1", us, "µs", "", "", "")
	r, _ = t.ratio("Crowd", "ns/engine-holders-1000", "Crowd", "ns/engine-holders-1", atMost(2))
	t.row("  engine claim in-process, 1,000 holders", "Crowd", "ns/engine-holders-1000", us, "µs", r+" of 1 holder", "", "")
	t.row("  engine claim in-process, 1 holder", "Crowd", "ns/engine-holders-1", us, "µs", "", "", "")
	r, _ = t.ratio("Crowd", "ns/engine-session-1000", "Crowd", "ns/engine-holders-1", atMost(2))
	t.row("  engine claim in-process, 1,000 holders held by one live process", "Crowd", "ns/engine-session-1000", us, "µs", r+" of 1 holder", "", "")
	t.row("crowded stack: data directory before claim/release cycles on 1,024 holders (du)", "CrowdDisk", "MiB-before", 1, "MiB", "", "", "")
	r, _ = t.ratio("CrowdDisk", "MiB-after", "CrowdDisk", "MiB-before", atLeast(0))
	t.row("  after 600 cycles", "CrowdDisk", "MiB-after", 1, "MiB", r+" of before", "", "")
	t.row("  of it badger's value log, never reclaimed", "CrowdDisk", "MiB-vlog", 1, "MiB", "", "≤ 1 MiB", t.limit("CrowdDisk", "MiB-vlog", atMost(1)))

	for _, shape := range []string{"distinct", "one"} {
		for _, w := range []int{1, 4, 16} {
			name := fmt.Sprintf("Concurrency/%s-%d", shape, w)
			r, v := t.ratio(name, "commits/s", "Concurrency/distinct-1", "commits/s", atLeast(1.5))
			target := ""
			if shape == "distinct" && w == 16 {
				target = "≥ 1.5× 1 writer"
			} else {
				v = ""
			}
			t.row(fmt.Sprintf("concurrency: %d writers, %s stack(s), commits/s", w, shape), name, "commits/s", 1, "/s", r+" of 1 writer", target, v)
			target, v = "", ""
			if shape == "one" {
				target, v = "≤ 0.1 (no retry storm)", t.limit(name, "conflicts/commit", atMost(0.1))
			}
			t.row("  conflict retries per commit", name, "conflicts/commit", 1, "", "", target, v)
		}
	}

	for _, n := range []int{1, 100, 1000} {
		unit := fmt.Sprintf("ns/stacks-%d", n)
		r, v := t.ratio("Allocation", unit, "Allocation", "ns/stacks-1", atMost(1.5))
		target := ""
		if n == 1000 {
			target = "≤ 1.5× at 1"
		} else {
			v = ""
		}
		t.row(fmt.Sprintf("allocation: lease with %d active stacks (side by side)", n), "Allocation", unit, us, "µs", r+" of 1 stack", target, v)
	}

	t.row("machine view: ls -l ports with 8,192 leased ports", "MachineView", "ns/ls-8192", us, "µs", "", "≤ 1 s", t.limit("MachineView", "ns/ls-8192", atMost(1e9)))
	r, v = t.ratio("MachineView", "ns/ls-entry-8192", "MachineView", "ns/ls-entry-1024", atMost(1.2))
	t.row("  per entry, 8,192 leased ports", "MachineView", "ns/ls-entry-8192", us, "µs", r+" of per entry at 1,024", "≤ 1.2× (independent)", v)
	t.row("  per entry, 1,024 leased ports", "MachineView", "ns/ls-entry-1024", us, "µs", "", "", "")
	r, v = t.ratio("MachineView", "ns/status-1000", "MachineView", "ns/status-10", atMost(2))
	t.row("machine view: cat status with 1,000 stacks (read in turn with 10 stacks')", "MachineView", "ns/status-1000", us, "µs", r+" of 10 stacks", "≤ 2×", v)
	t.row("  cat status with 10 stacks", "MachineView", "ns/status-10", us, "µs", "", "", "")
	r, _ = t.ratio("MachineView", "ns/status-1000-changed", "MachineView", "ns/status-10-changed", atLeast(0))
	t.row("  cat status with 1,000 stacks, after a commit on one of them", "MachineView", "ns/status-1000-changed", us, "µs", r+" of 10 stacks after one", "", "")
	t.row("  cat status with 10 stacks, after a commit on one of them", "MachineView", "ns/status-10-changed", us, "µs", "", "", "")
	r, v = t.ratio("MachineView", "ns/status-json-1000", "MachineView", "ns/status-json-10", atMost(2))
	t.row("machine view: cat status.json with 1,000 stacks", "MachineView", "ns/status-json-1000", us, "µs", r+" of 10 stacks", "≤ 2×", v)
	t.row("  cat status.json with 10 stacks", "MachineView", "ns/status-json-10", us, "µs", "", "", "")
	r, _ = t.ratio("MachineView", "ns/status-json-1000-changed", "MachineView", "ns/status-json-10-changed", atLeast(0))
	t.row("  cat status.json with 1,000 stacks, after a commit on one of them", "MachineView", "ns/status-json-1000-changed", us, "µs", r+" of 10 stacks after one", "", "")
	t.row("  cat status.json with 10 stacks, after a commit on one of them", "MachineView", "ns/status-json-10-changed", us, "µs", "", "", "")

	t.row("scale: mount ready, 10,000 leased stacks, 100 daemons' holds (exec to serving)", "Scale", "ms-ready-loaded", 1, "ms", "", "≤ 1 s", t.limit("Scale", "ms-ready-loaded", atMost(1000)))
	t.row("  an empty store's, same run", "Scale", "ms-ready-empty", 1, "ms", "", "", "")
	r, v = t.ratio("Scale", "ns/claim-loaded", "Scale", "ns/claim-empty", atMost(1.5))
	t.row("scale: a co-tenant's claim through the mount there, 1,000 wait readers blocked", "Scale", "ns/claim-loaded", us, "µs", r+" of an empty store's", "≤ 1.5×", v)
	t.row("  the same claim on an empty store, same run", "Scale", "ns/claim-empty", us, "µs", "", "", "")
	r, v = t.ratio("Scale", "ns/lease-loaded", "Scale", "ns/lease-empty", atMost(1.5))
	t.row("scale: a new lease through the mount there", "Scale", "ns/lease-loaded", us, "µs", r+" of an empty store's", "≤ 1.5×", v)
	t.row("  the same new lease on an empty store, same run", "Scale", "ns/lease-empty", us, "µs", "", "", "")
	t.row("scale: RSS there, the readers blocked", "Scale", "MiB-loaded", 1, "MiB", "", "≤ 100 MiB", t.limit("Scale", "MiB-loaded", atMost(100)))
	t.row("  of it anonymous (RssAnon: the rest is the store's files mapped)", "Scale", "MiB-loaded-anon", 1, "MiB", "", "", "")
	t.row("  its peak (VmHWM)", "Scale", "MiB-loaded-peak", 1, "MiB", "", "", "")
	t.row("  the empty store's RSS, same run", "Scale", "MiB-empty", 1, "MiB", "", "", "")

	t.row("footprint: mount ready (exec to serving)", "Footprint", "ms-ready", 1, "ms", "", "≤ 300 ms", t.limit("Footprint", "ms-ready", atMost(300)))
	t.row("footprint: idle RSS", "Footprint", "MiB-idle", 1, "MiB", "", "≤ 40 MiB", t.limit("Footprint", "MiB-idle", atMost(40)))
	r, _ = t.ratio("Footprint", "MiB-idle-team", "Footprint", "MiB-idle", atLeast(0))
	t.row("  the same of the build with team mode (-tags team)", "Footprint", "MiB-idle-team", 1, "MiB", r+" of the default build's", "", "")
	t.row("footprint: peak RSS over 10k ops (VmHWM)", "Footprint", "MiB-peak", 1, "MiB", "", "≤ 100 MiB", t.limit("Footprint", "MiB-peak", atMost(100)))
	t.row("footprint: idle RSS 1 s after the 10k ops", "Footprint", "MiB-idle-after", 1, "MiB", "", "", "")
	t.row("footprint: idle RSS after the 10k ops, the store settled (40 s)", "Footprint", "MiB-idle-settled", 1, "MiB", "", "≤ 25 MiB", t.limit("Footprint", "MiB-idle-settled", atMost(25)))
	t.row("footprint: allocated disk after 10k ops (du)", "Footprint", "MiB-disk", 1, "MiB", "", "≤ 20 MiB", t.limit("Footprint", "MiB-disk", atMost(20)))
	t.row("  the same of the fresh daemon", "Footprint", "MiB-disk-fresh", 1, "MiB", "", "", "")
	t.row("churn: peak RSS over 3,000 cockpits of 60 KB configs made and removed (VmHWM)", "Footprint", "MiB-churn-peak", 1, "MiB", "", "", "")
	r, v = t.ratio("Footprint", "MiB-churn-idle", "Footprint", "MiB-idle", atMost(1.5))
	t.row("churn: idle RSS after them, the store settled (40 s)", "Footprint", "MiB-churn-idle", 1, "MiB", r+" of fresh idle", "≤ 1.5× fresh", v)
	r, v = t.ratio("Footprint", "MiB-churn-disk", "Footprint", "MiB-disk-fresh", atMost(2))
	t.row("churn: allocated disk after them, settled (du)", "Footprint", "MiB-churn-disk", 1, "MiB", r+" of fresh", "≤ 2× fresh", v)
	t.row("10,000 stacks: peak RSS as they are made (VmHWM from the first)", "Footprint", "MiB-stacks-peak", 1, "MiB", "", "≤ 100 MiB", t.limit("Footprint", "MiB-stacks-peak", atMost(100)))
	t.row("10,000 stacks: idle RSS with them, settled (40 s)", "Footprint", "MiB-stacks-idle", 1, "MiB", "", "", "")
	t.row("footprint: restart after kill -9, 10,000 stacks in the store (to serving)", "Footprint", "ms-restart", 1, "ms", "", "", "")
	t.row("  restart refused on the dead mount (1 = yes; then timed after umount -l)", "Footprint", "stale-mount-refused", 1, "", "", "0 (SPEC §1)", t.limit("Footprint", "stale-mount-refused", atMost(0)))
	t.row("footprint: ops/s during the 10k ops", "Footprint", "ops/s", 1, "/s", "", "", "")

	fmt.Println("| measurement | median | ratio | target | |")
	fmt.Println("|---|---:|---:|---|---|")
	for _, row := range t.rows {
		fmt.Printf("| %s |\n", strings.Join(row[:], " | "))
	}
}
