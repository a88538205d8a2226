package engine

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/portlock"
	"github.com/cockpitfs/cockpitfs/storage"
)

// Holds: every port of this daemon's active leases is held machine-wide (engine/portlock), so no
// other daemon — any uid, any data directory — leases it, and a family is chosen only when this
// daemon could hold all of its ports.
//
// Ordering with the store: a claim takes the holds of the family it chooses inside its
// transaction, before the commit; a failed or aborted transaction lets them go. A lease ends in
// its commit first and lets its holds go after. So whatever the store says is active is held, except
// between a crash and the restart — and a crashed daemon holds nothing (the kernel frees the names
// with the process). On restart HoldPorts takes every active lease's holds again before the mount
// serves; a port another daemon took meanwhile is reported (health, events, verify), never shared.
//
// The holds are newer than a claim's snapshot: a claim refused for want of a family, one of them
// held for another stack's claim the snapshot does not show, runs again (commit.go, behindHolds).

// LostPort is a port of an active lease this daemon does not hold, because another process does.
type LostPort struct {
	Cockpit, Stack, Key string
	Port                int
	Holder              portlock.Holder
	Why                 string // how it was lost, and the remedy
	// claim: lost while the claim that took it was under way; the stack's lost port only if that
	// claim commits a lease of it (settle).
	claim bool
}

// lostWhileDown is how a port is lost at restart, and the remedy.
const lostWhileDown = "another daemon leased it while this one was down; " + lostFix

// lostToOlder is how a port is lost to an older daemon, and the remedy.
const lostToOlder = "an older cockpitfs daemon (holding the legacy name cockpitfs/port/<port> only) leased it while this daemon held it: that daemon started after this one, which saw no older daemon then; stop or upgrade the older daemon, and " + lostFix

func (l LostPort) String() string {
	return fmt.Sprintf("port %d (%s) of this stack's lease is held by %s", l.Port, l.Key, l.Holder)
}

// DaemonIdentity is what this daemon's holds answer about it.
type DaemonIdentity struct {
	PID   int
	UID   uint32
	Data  string
	Mount string
}

// holds is the daemon's machine-wide hold on its leased ports.
type holds struct {
	space portlock.Space
	self  DaemonIdentity

	// mu guards the fields below. It is held across a bind and a connect (take), since whether
	// this daemon holds a port and the hold itself change together (LOCK ORDERING 5).
	mu      sync.Mutex
	byPort  map[int]*portHold
	byStack map[string]map[int]bool
	lost    map[string][]LostPort // by stack key
	known   map[int]knownHolder   // other processes' holds, as they answered

	boundMu    sync.Mutex // guards bound, boundAt and boundReads only; never held with mu
	bound      map[int]string
	boundAt    time.Time
	boundReads int // reads of the kernel's table by recentBound
}

// portHold is one held port: the stack whose lease (or claim under way, pending) it belongs to.
type portHold struct {
	hold    *portlock.Hold
	stack   string
	key     string // the port's key in the lease
	pending bool
}

// HoldPorts makes the engine hold every port of its active leases in space (portlock.Machine for a
// daemon) and of every lease it makes from now on. Call it once, before serving. It returns the
// ports of active leases another process holds; each is also reported in its stack's events and
// health.
func (e *Engine) HoldPorts(space portlock.Space, self DaemonIdentity) ([]LostPort, error) {
	h := &holds{space: space, self: self, byPort: map[int]*portHold{}, byStack: map[string]map[int]bool{}, lost: map[string][]LostPort{}, known: map[int]knownHolder{}}
	// An older daemon on the machine holds legacy names only: holding them too from the first
	// hold on keeps it from leasing this daemon's ports (engine/portlock, Compat).
	legacy, err := space.CheckLegacy()
	if err != nil {
		return nil, err
	}
	var leases []Record
	err = e.db.View(func(tx storage.Txn) error {
		return tx.Scan(allStacksPrefix, func(_ string, v []byte) error {
			r, err := decodeHead(v) // the lease is all it needs
			if err == nil && r.Value.Lease.Active() {
				leases = append(leases, r)
			}
			return nil // an unreadable record is verify's and health's to report
		})
	})
	if err != nil {
		return nil, err
	}
	var lost []LostPort
	for _, r := range leases {
		key := stackKey(r.Cockpit, r.Stack)
		for _, k := range sortedPortKeys(r.Value.Lease.Ports) {
			port := r.Value.Lease.Ports[k]
			holder, _, err := h.take(key, r.Cockpit, r.Stack, k, port, legacy.Take)
			switch {
			case err != nil:
				h.releaseAll()
				return nil, err
			case holder != nil:
				l := LostPort{Cockpit: r.Cockpit, Stack: r.Stack, Key: k, Port: port, Holder: *holder, Why: lostWhileDown}
				h.lost[key] = append(h.lost[key], l)
				lost = append(lost, l)
			default:
				h.byPort[port].pending = false
			}
		}
	}
	e.holds = h
	for key, ports := range h.lost {
		cockpit, stack := splitStackKey(key)
		if err := e.reportLost(cockpit, stack, ports); err != nil {
			return lost, err
		}
	}
	return lost, nil
}

// reportLost appends the conflict to the stack's events.
func (e *Engine) reportLost(cockpit, stack string, lost []LostPort) error {
	msgs := make([]string, len(lost))
	for i, l := range lost {
		msgs[i] = l.String()
	}
	return e.update(context.Background(), stackKey(cockpit, stack), func(tx storage.Txn, now time.Time) error {
		return appendEvent(tx, cockpit, stack, event{
			At: stamp(now), Op: "restart", Path: cockpit + "/stacks/" + stack, PID: e.holds.self.PID, UID: e.holds.self.UID,
			Result: "conflict", Code: PortFamilyCollision,
			Message: strings.Join(msgs, "; ") + ": another daemon leased it while this one was down; this lease does not hold it and never shares it",
			Fix:     lostFix,
		})
	})
}

const lostFix = "drain the stack (echo sleep > drain/request; echo start > drain/attempt; echo success > drain/outcome) and claim again, which leases a free family"

// take holds port for the stack (key) unless held already: for this stack it is a success, for
// another stack of this daemon or another process it returns who holds it, and that other stack's
// key when this daemon holds it ("" otherwise). It takes a hold with takeHold (the space's Take,
// or at restart that of what CheckLegacy saw). Callers hold no lock.
func (h *holds) take(key, cockpit, stack, portKey string, port int, takeHold func(int, portlock.Identity) (*portlock.Hold, error)) (*portlock.Holder, string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if held, ok := h.byPort[port]; ok {
		if held.stack == key {
			return nil, "", nil
		}
		c, s := splitStackKey(held.stack)
		return &portlock.Holder{PID: h.self.PID, UID: h.self.UID, Known: true, Identity: &portlock.Identity{
			Daemon: "cockpitfs", PID: h.self.PID, UID: h.self.UID, Data: h.self.Data, Mount: h.self.Mount, Cockpit: c, Stack: s, Port: port}}, held.stack, nil
	}
	hold, err := takeHold(port, portlock.Identity{
		PID: h.self.PID, UID: h.self.UID, Data: h.self.Data, Mount: h.self.Mount, Cockpit: cockpit, Stack: stack, Key: portKey})
	h.loseShared()
	if errors.Is(err, portlock.ErrHeld) {
		holder, ok, askErr := h.space.Ask(port)
		if askErr != nil || !ok {
			// Gone in between, or it would not say: still not ours this time.
			holder = portlock.Holder{}
		}
		return &holder, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	h.byPort[port] = &portHold{hold: hold, stack: key, key: portKey, pending: true}
	if h.byStack[key] == nil {
		h.byStack[key] = map[int]bool{}
	}
	h.byStack[key][port] = true
	return nil, "", nil
}

// loseShared moves the ports the space let go when it began to hold legacy names (an older daemon
// holds them too: it started after this daemon held them, and saw them free) from this daemon's
// holds to its stacks' lost ports, which health reports with the remedy and retakes; h.mu is held.
// A port of a claim under way is lost as the claim's: settle keeps it if the claim commits a
// lease of it, and forgets it otherwise.
func (h *holds) loseShared() {
	for _, let := range h.space.Shared(func(hold *portlock.Hold) bool {
		held, ok := h.byPort[hold.Port()]
		return ok && held.hold == hold // not another engine's of this process, nor a proxy's
	}) {
		port := let.Port()
		held := h.byPort[port]
		h.drop(port)
		holder, ok, err := h.space.Ask(port)
		if err != nil || !ok {
			holder = portlock.Holder{}
		}
		cockpit, stack := splitStackKey(held.stack)
		h.lost[held.stack] = append(h.lost[held.stack], LostPort{Cockpit: cockpit, Stack: stack, Key: held.key, Port: port, Holder: holder, Why: lostToOlder, claim: held.pending})
	}
}

// takeFamily holds every port of a candidate family for the stack, all or none: it returns who
// holds the first port it could not take, that port, and the key of the stack this daemon holds it
// for ("" when another process does).
func (h *holds) takeFamily(key, cockpit, stack string, ports map[string]int) (*portlock.Holder, int, string, error) {
	var taken []int
	for _, k := range sortedPortKeys(ports) {
		port := ports[k]
		h.mu.Lock()
		_, had := h.byPort[port]
		h.mu.Unlock()
		holder, here, err := h.take(key, cockpit, stack, k, port, h.space.Take)
		if err != nil || holder != nil {
			h.releasePending(key, taken)
			return holder, port, here, err
		}
		if !had {
			taken = append(taken, port)
		}
	}
	return nil, 0, "", nil
}

// releasePending lets go of ports this transaction took for the stack and has not committed.
func (h *holds) releasePending(key string, ports []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, port := range ports {
		if held, ok := h.byPort[port]; ok && held.stack == key && held.pending {
			h.drop(port)
		}
	}
}

// releasePendingOf lets go of every port a transaction on the stack (key) took and has not
// committed; the stack's lock is held.
func (h *holds) releasePendingOf(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port := range h.byStack[key] {
		if h.byPort[port].pending {
			h.drop(port)
		}
	}
}

// settle runs after every transaction on a stack, under its lock: when lease is the stack's
// committed lease, what it holds becomes the stack's and every other port the stack held goes
// (a released or moved lease); when nothing was committed, what the transaction took goes. The
// stack's lost ports follow: those of the committed lease stay lost, and a port the transaction
// lost (loseShared) is lost only if its lease was committed.
func (h *holds) settle(key string, committed bool, lease *Lease) {
	h.mu.Lock()
	defer h.mu.Unlock()
	keep := map[int]bool{}
	if committed && lease.Active() {
		for _, port := range lease.Ports {
			keep[port] = true
		}
	}
	for port := range h.byStack[key] {
		held := h.byPort[port]
		switch {
		case !committed && !held.pending:
			// the transaction changed nothing: the lease keeps what it held
		case keep[port]:
			held.pending = false
		default:
			h.drop(port)
		}
	}
	var still []LostPort
	for _, l := range h.lost[key] {
		switch {
		case committed && keep[l.Port]:
			l.claim = false // the lease's now
		case committed, l.claim:
			continue
		}
		still = append(still, l)
	}
	if len(still) == 0 {
		delete(h.lost, key)
	} else {
		h.lost[key] = still
	}
}

// drop releases a held port; h.mu is held.
func (h *holds) drop(port int) {
	held := h.byPort[port]
	held.hold.Release()
	delete(h.byPort, port)
	delete(h.byStack[held.stack], port)
	if len(h.byStack[held.stack]) == 0 {
		delete(h.byStack, held.stack)
	}
}

func (h *holds) releaseAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port := range h.byPort {
		h.drop(port)
	}
}

// retake tries again to hold the lost ports of a stack (their holder may have let them go) and
// returns those still held elsewhere. A port taken back is the lease's again.
func (h *holds) retake(key string) []LostPort {
	h.mu.Lock()
	lost := h.lost[key]
	h.mu.Unlock()
	var still []LostPort
	for _, l := range lost {
		holder, _, err := h.take(key, l.Cockpit, l.Stack, l.Key, l.Port, h.space.Take)
		if err != nil || holder != nil {
			if holder != nil {
				l.Holder = *holder
			}
			still = append(still, l)
			continue
		}
		h.mu.Lock()
		h.byPort[l.Port].pending = false
		h.mu.Unlock()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(still) == 0 {
		delete(h.lost, key)
	} else {
		h.lost[key] = still
	}
	return still
}

// ForeignHold is a port held on this machine by another process than this daemon.
type ForeignHold struct {
	Port   int
	Holder portlock.Holder
}

// knownHolder is who held a port when asked, while the same socket (inode) holds it.
type knownHolder struct {
	inode  string
	holder portlock.Holder
}

// ForeignHolds lists, in port order, the ports other processes hold in this daemon's space: other
// daemons' leases and squatters. A holder is asked once per socket: the kernel's table says when a
// port's socket is another one. Without holds (an engine that holds no ports) it is empty.
func (e *Engine) ForeignHolds() ([]ForeignHold, error) {
	h := e.holds
	if h == nil {
		return nil, nil
	}
	bound, err := h.space.Bound()
	if err != nil {
		return nil, err
	}
	var out []ForeignHold
	for port, inode := range bound {
		if holder, ok := h.foreign(port, inode); ok {
			out = append(out, ForeignHold{Port: port, Holder: holder})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out, nil
}

// ForeignHold returns who else holds port, if anyone does.
func (e *Engine) ForeignHold(port int) (portlock.Holder, bool) {
	h := e.holds
	if h == nil {
		return portlock.Holder{}, false
	}
	h.mu.Lock()
	_, mine := h.byPort[port]
	h.mu.Unlock()
	if mine { // a port of this daemon's leases: no need to read the kernel's table
		return portlock.Holder{}, false
	}
	bound, err := h.recentBound()
	if err != nil {
		return portlock.Holder{}, false
	}
	inode, ok := bound[port]
	if !ok {
		return portlock.Holder{}, false
	}
	return h.foreign(port, inode)
}

// boundFor is how long ForeignHold trusts one read of the kernel's table of bound names: `ls -l
// ports` asks it once per entry, and each read walks every unix socket on the machine, so a
// listing of n held ports read it n times (quadratic: 7 s for 1,000). A hold taken or let go
// shows in ports/<n> within it; the listing itself (ForeignHolds) always reads afresh.
var boundFor = 100 * time.Millisecond

// recentBound is space.Bound(), read at most once per boundFor.
func (h *holds) recentBound() (map[int]string, error) {
	h.boundMu.Lock()
	defer h.boundMu.Unlock()
	if h.bound != nil && time.Since(h.boundAt) < boundFor {
		return h.bound, nil
	}
	bound, err := h.space.Bound()
	if err != nil {
		return nil, err
	}
	h.bound, h.boundAt = bound, time.Now()
	h.boundReads++
	return bound, nil
}

// foreign says who holds port with the socket inode, unless this daemon does.
func (h *holds) foreign(port int, inode string) (portlock.Holder, bool) {
	h.mu.Lock()
	_, mine := h.byPort[port]
	known, asked := h.known[port]
	h.mu.Unlock()
	if mine {
		return portlock.Holder{}, false
	}
	if asked && known.inode == inode {
		return known.holder, true
	}
	holder, ok, err := h.space.Ask(port)
	if err != nil || !ok {
		return portlock.Holder{}, false
	}
	// A hold let go while it was asked answers nothing and would read as a squatter: the answer
	// counts only if the same socket still holds the port, and it is not this daemon's by now.
	if now, err := h.space.Bound(); err != nil || now[port] != inode {
		return portlock.Holder{}, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, mine := h.byPort[port]; mine {
		return portlock.Holder{}, false
	}
	h.known[port] = knownHolder{inode: inode, holder: holder}
	return holder, true
}
