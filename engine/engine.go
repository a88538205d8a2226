// Package engine is cockpitfs's domain: coordination records and their invariants, claims, port
// leases, holder liveness and drains, each operation one compare-and-swap transaction on the
// store. It knows nothing of FUSE or errno; refusals are values the adapter maps.
package engine

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/storage"
)

// Engine applies operations to one store. It is safe for concurrent use.
//
// # SINGLE WRITER
//
// An Engine must be the only writer of its store: one Engine per store, in one process (kv holds
// the data directory's flock for as long as it is open, so a second daemon cannot open it). The
// caches rely on it, since they learn of changes only from this Engine's own commits:
//   - records serves Stack from memory until a commit through update replaces the entry; a commit
//     by anyone else would leave it stale for good.
//   - cockpits treats an entry as current until the next commit through update.
//   - changes wakes `wait` readers at this Engine's commits only.
//   - staged hands a commit's record to the cache under the stack's keyedLocks entry, which
//     queues writers of this process only.
//
// Correctness of every decision does not rest on this: each transaction reads what it decides on
// with Get, so the store's conflict check orders it against any writer. A backend shared by
// several processes needs the caches bypassed, not only the flock removed: NewShared does that.
//
// # SHARED STORES
//
// Over a storage.Shared store (etcd) other daemons commit too, and no cache can be proved current
// without asking the store: a watch delivers another daemon's commit some time after it, and
// until it arrives a cache would serve what that commit replaced. So a shared engine reads
// through: Stack and Cockpit run a View (etcd: a linearizable read) every time, and only the
// decode is skipped when the bytes are the ones cached (the store's own cache makes a View one
// round trip, see etcdstore). Only hints skip the read: what Claim observes before its
// transaction (recentStack), which the transaction reads again. keyedLocks then merely queue this
// daemon's own writers; the store's compares order them against everyone else's. The watch
// serves only wait, which a commit anywhere wakes.
//
// # LOCK ORDERING
//
// A goroutine takes locks only in this order, outermost first, never the reverse; it holds two of
// one level only where level 2 says so. Each mutex's field says what it guards.
//
//  1. fs: a handle's mu (fs.handle, fs.waitHandle) or a scratch file's (fs.scratch), held across
//     engine calls on that handle or file.
//  2. keyedLocks: a key's lock (a stack's or a cockpit's), held by update for the transaction
//     and until its observers' commitOrdered. LogRefusal takes none.
//     Two at once, the one exception: a claim refused behind another stack's newer holds
//     (behindHolds) waits in commitPastHolds, its own stack's lock held, for the other stack's,
//     and lets that go at once. It cannot deadlock. A claim waits only for a stack that holds a
//     port of a family the claim would lease, and a waiting claim's stack holds none such: a run
//     refused for want of a family took nothing (each run first lets go of what an earlier one
//     took, releasePendingOf, and takeFamily keeps a family only whole), and the ports of the
//     stack's committed lease are in no other lease (the port index gives each port one). No
//     claim waits for a waiting one, so no cycle forms; and each wait is bounded by the
//     operation's budget (STATE_LOCKED). TestCrossStackWait* drive it.
//  3. inventory.mu: a health read's, held across its whole View of the store (observeInventory);
//     taken with no key's lock held. portKeeper.mu likewise: a read of the port index's, held across
//     its View (portIndex). statusKeeper.mu likewise: a status read's, held across its
//     View, its observations of the holders' processes and its rendering (StatusFile). leaseHolders.mu likewise: a claim's, held across
//     the read of the records it refreshes before the claim's transaction (refreshLeaseHolders),
//     and over a shared store at each run of it too, under the stack's lock: that read is of the
//     store's own copy and waits for no lock of the engine's. routeIndexes.mu likewise: the web proxy's, held across the
//     Views that rebuild its index of names (ResolveRoute), with no other lock held.
//  4. the store's transaction (kv's group-commit lock inside it). The store calls back into the
//     engine only through fn, which takes the locks below.
//  5. holds.mu, held across portlock's bind and connect (holds.take: Space.Take, Space.Ask): in a
//     claim's transaction under its stack's lock, in settle and releasePendingOf under it, and in
//     a health read's retake.
//  6. leaves held across one system call or read, taking no lock but those of level 7:
//     ephemeralRangeFile (a pread), liveness's bootID (a read) and leaders (pidfd calls),
//     listeners' diag.mu (a sock_diag round trip), portlock's answerLoop.mu (accepts and answers)
//     and owners.mu (a scan of /proc), holds.boundMu (a read of /proc/net/unix; never with
//     holds.mu).
//  7. leaves held for a map or counter access alone: keyedLocks.mu, notifier.mu,
//     cockpitNotifier.mu, recordCache.mu, leaseHolders.portsMu, cockpitCache.mu, healthCache.mu, staleKeys.mu,
//     budgetContext.mu, identities.mu, liveness's threadGroups, staged (a sync.Map), fs's own maps'
//     (snapshots.mu, replacements.mu, eventBudget.mu and those of errno.go, file.go, nested.go,
//     render.go and scratch.go),
//     the proxy's CA.mu (its certificates by name).
type Engine struct {
	db     storage.Store
	shared bool // other processes write db too: serve no read from the caches
	// machines judges the holders and executors of other machines (nil: every process is this
	// machine's).
	machines *machines
	now      func() time.Time
	budget   time.Duration // of one operation's waiting: storage.Budget
	locks    keyedLocks
	changes  notifier
	// cockpitChanges wakes a cockpit's waiters at a commit anywhere in it.
	cockpitChanges cockpitNotifier
	records        recordCache
	cockpits       cockpitCache
	// holds are the machine-wide holds of the leased ports (nil: this engine holds none).
	holds *holds
	// leaseBound bounds the active leases of one uid's claims (BoundLeases).
	leaseBound UIDBound
	// cockpitBound bounds the cockpits one uid has made (BoundCockpits).
	cockpitBound UIDBound
	// stackBound bounds the stacks one uid has made; stacksCounted: this engine keeps their
	// count (CountStacks).
	stackBound    UIDBound
	stacksCounted bool
	// inventory is what health observes of every record, kept from commits.
	inventory inventory
	// ports is the machine's port index, kept from commits.
	ports portKeeper
	// status is what the root files status and status.json show, kept from commits.
	status statusKeeper
	// leaseHolders are the ports of every active lease, kept from the records, so that a port
	// whose index entry is missing is not taken as free.
	leaseHolders leaseHolders
	// healthCache is what the last health read of each stack read of the store, while no commit
	// has begun since.
	healthCache healthCache
	// staged holds the record the transaction under way on a stack wrote (a stagedCommit), keyed
	// by the stack's lock key (held by that transaction), so the cache takes it once the commit
	// succeeds.
	staged sync.Map
	// vanished is told which holders each commit released (OnVanished; nil: nobody).
	vanished func(ctx context.Context, v Vanished)
	// routes index the stacks' names for the web proxy (ResolveRoute).
	routes routeIndexes
	// proxyBase is where the daemon's web proxy serves (ServeProxy); nil: it serves none.
	proxyBase atomic.Pointer[proxyBase]
}

// New returns an engine over db, which this process alone writes.
func New(db storage.Store) *Engine {
	return &Engine{db: db, now: time.Now, budget: storage.Budget}
}

// NewShared returns an engine over db, which other daemons write too (see SHARED STORES): it
// reads through its caches and wakes waiters at every stack's commit, whoever made it.
func NewShared(db storage.Shared) (*Engine, error) {
	e := New(db)
	e.shared = true
	e.leaseHolders.shared = true
	db.Withhold(inLayout)
	var err error
	if e.machines, err = announceMachine(db); err != nil {
		return nil, err
	}
	err = db.Watch("", e.published)
	if err != nil {
		return nil, err
	}
	return e, nil
}

// published wakes the waiters of what a commit of key, by any daemon, changed ("": anything).
func (e *Engine) published(key string) {
	switch {
	case key == "":
		e.records.dropAll()
		e.leaseHolders.reload.Store(true)
		e.changes.publishAll()
		e.cockpitChanges.publishAll()
	case strings.HasPrefix(key, allHoldersPrefix):
		// Every daemon's commit of a holder writes its stack's head too, and the cache trusts
		// head bytes it has seen to name the same holders; a holder's key changed alone (deleted
		// with etcdctl) breaks that trust until the record is read again.
		e.records.drop(holderStackKey(key))
	case strings.HasPrefix(key, allStacksPrefix):
		e.leaseHolders.stale.mark(key)
		e.changes.publish(key)
		e.cockpitChanges.publish(key)
	case strings.HasPrefix(key, cockpitsPrefix):
		e.cockpitChanges.publish(key)
	case strings.HasPrefix(key, allEventsPrefix):
		// e/<cockpit>/<stack|->/<seq>: a line in an events file.
		parts := strings.Split(key, "/")
		if len(parts) != 4 {
			return
		}
		if parts[2] == cockpitLevel {
			e.cockpitChanges.publish(cockpitKey(parts[1]))
		} else {
			e.cockpitChanges.publish(stackKey(parts[1], parts[2]))
		}
	}
}

// Shared says whether other daemons write the store too (NewShared).
func (e *Engine) Shared() bool { return e.shared }

// changed returns a channel closed at the next committed change of the stack.
func (e *Engine) changed(cockpit, stack string) <-chan struct{} {
	return e.changes.next(stackKey(cockpit, stack))
}

// Wait blocks until the stack's revision differs from seen and returns it, or until ctx ends.
func (e *Engine) Wait(ctx context.Context, cockpit, stack string, seen int64) (int64, error) {
	for {
		changed := e.changed(cockpit, stack)
		r, err := e.Stack(cockpit, stack)
		if err != nil {
			return 0, err
		}
		if r.Revision != seen {
			return r.Revision, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// CockpitInfo is a cockpit as the tree shows it.
type CockpitInfo struct {
	Name      string
	UID       uint32
	CreatedAt string
	UpdatedAt string
	Config    string
	// Entrypoints are those the accepted config declares, from which every stack's are derived.
	Entrypoints []portdecl.Entrypoint
	// EnvPrefix starts every name the stacks' env files export (see portdecl.Config).
	EnvPrefix string
	// BaseOrder is the config's port keys in the order it declares them (portdecl.Config).
	BaseOrder []string
	// Derived are the [env] derived values every stack's env file renders.
	Derived []portdecl.Derived
	// proxy is where the daemon's web proxy serves, nil when it serves none (ProxiedURL).
	proxy *proxyBase
	// Damaged: the cockpit's value does not decode, or names another cockpit (Cockpits lists it
	// by its key; every other field is empty). Reading it refuses STATE_RECORD_MALFORMED.
	Damaged bool
}

func (m cockpitMeta) info() CockpitInfo {
	info := CockpitInfo{Name: m.Name, UID: m.UID, CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt, Config: m.Config}
	if m.Declared != nil {
		info.Entrypoints = m.Declared.Entrypoints
		info.EnvPrefix = m.Declared.EnvPrefix
		info.BaseOrder = m.Declared.BaseOrder
		info.Derived = m.Declared.Derived
	}
	return info
}

// Cockpits lists every cockpit, by name. A cockpit whose value is damaged is listed by its key's
// name alone (Damaged), so one damaged cockpit hides no other from the listing, the proxy or gc,
// and its own lookup says what is wrong; a key whose name no cockpit may have is left out (verify
// names it).
func (e *Engine) Cockpits() ([]CockpitInfo, error) {
	var out []CockpitInfo
	err := e.db.View(func(tx storage.Txn) error {
		return tx.Scan(cockpitsPrefix, func(key string, v []byte) error {
			m, damage, ok := e.cockpits.listed(key, v)
			if !ok {
				return nil
			}
			if damage != nil {
				out = append(out, CockpitInfo{Name: m.Name, Damaged: true})
				return nil
			}
			info := m.info()
			info.proxy = e.proxyBase.Load()
			out = append(out, info)
			return nil
		})
	})
	return out, err
}

// Cockpit returns one cockpit.
func (e *Engine) Cockpit(name string) (CockpitInfo, error) {
	m, err := e.cockpitMeta(name)
	info := m.info()
	info.proxy = e.proxyBase.Load()
	return info, err
}

// cockpitMeta reads one cockpit, from the cache when it is current.
func (e *Engine) cockpitMeta(name string) (cockpitMeta, error) {
	key := cockpitKey(name)
	if m, ok := e.cockpits.current(key); ok && !e.shared {
		return m, nil
	}
	at := e.cockpits.since()
	var m cockpitMeta
	var raw []byte
	err := e.db.View(func(tx storage.Txn) (err error) {
		m, raw, err = e.readCockpit(tx, name)
		return err
	})
	if err == nil {
		e.cockpits.read(key, raw, at)
	}
	return m, err
}

// Stacks lists a cockpit's stack names in order.
func (e *Engine) Stacks(cockpit string) ([]string, error) {
	var out []string
	err := e.db.View(func(tx storage.Txn) error {
		if _, err := e.loadCockpit(tx, cockpit); err != nil {
			return err
		}
		return tx.Scan(stacksPrefix(cockpit), func(k string, _ []byte) error {
			// A key no stack may have (a shared store's keys are anyone's input) is not listed:
			// a '/' in one name fails the kernel's whole listing. verify names it.
			if _, stack := splitStackKey(k); ValidName(stack) {
				out = append(out, stack)
			}
			return nil
		})
	})
	return out, err
}

// Stack returns the stack's record.
// The record is shared with other readers: treat it as read-only.
func (e *Engine) Stack(cockpit, stack string) (Record, error) {
	key := stackKey(cockpit, stack)
	r, gen, ok := e.records.get(key)
	if ok && !e.shared {
		return r, nil
	}
	var read cachedRecord
	err := e.db.View(func(tx storage.Txn) (err error) {
		read, err = e.readRecord(tx, cockpit, stack)
		return err
	})
	if err == nil {
		e.records.put(key, read, gen)
	}
	return read.Record, err
}

// recentStack is the stack's record as a hint of what to observe before an operation's
// transaction, which reads the record again and decides on that: over a shared store it is what
// this daemon already holds, with no round trip, and may miss another daemon's latest commit (a
// holder it adds is then merely not probed by this operation). Over this daemon's own store it is
// the last record committed, durable or not: reading it from the store would wait for the sync
// of a commit under way on the stack, and writers queued on one stack would no longer share
// syncs. A failed read is not trusted: the current record, or the refusal, comes from Stack.
func (e *Engine) recentStack(cockpit, stack string) (Record, error) {
	if !e.shared {
		if r, ok := e.records.committed(stackKey(cockpit, stack)); ok {
			return r, nil
		}
	}
	if shared, ok := e.db.(storage.Shared); ok && e.shared {
		var read cachedRecord
		err := shared.Recent(func(tx storage.Txn) (err error) {
			read, err = e.readRecord(tx, cockpit, stack)
			return err
		})
		if err == nil {
			return read.Record, nil
		}
	}
	return e.Stack(cockpit, stack)
}

// EventsWindow returns the lines an events file keeps, as Events does, the offset of their first
// byte in everything ever appended to the file, and each line's seq in order: lines are numbered
// as they are appended, so a follower tells the lines it has not read by their seq, wherever a
// window dropped lines (see appendEvent).
func (e *Engine) EventsWindow(cockpit, stack string) (window []byte, start int64, seqs []uint64, err error) {
	if stack == "" {
		stack = cockpitLevel
	}
	err = e.db.View(func(tx storage.Txn) error {
		if window, seqs, err = readEventLines(tx, cockpit, stack); err != nil {
			return err
		}
		end, err := eventsEnd(tx, cockpit, stack)
		start = end - int64(len(window))
		return err
	})
	return window, start, seqs, err
}

// CockpitChange is where a cockpit's latest commit happened: the events file, relative to the
// cockpit's directory, that records it ("events" or "stacks/<stack>/events").
type CockpitChange struct {
	Seq    uint64 // commits in the cockpit since the daemon started
	Events string
}

// CockpitSeen is the count of the cockpit's changes so far, for WaitCockpit.
func (e *Engine) CockpitSeen(cockpit string) uint64 {
	return e.cockpitChanges.latest(cockpit).Seq
}

// WaitCockpit blocks until something commits in the cockpit (its config, a stack, a refusal in
// any of its events files) after seen, and says where; or until ctx ends.
func (e *Engine) WaitCockpit(ctx context.Context, cockpit string, seen uint64) (CockpitChange, error) {
	for {
		changed := e.cockpitChanges.next(cockpit)
		if c := e.cockpitChanges.latest(cockpit); c.Seq != seen {
			return c, nil
		}
		if _, err := e.Cockpit(cockpit); err != nil {
			return CockpitChange{}, err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return CockpitChange{}, ctx.Err()
		}
	}
}

// cockpitNotifier counts commits per cockpit and wakes the cockpit's waiters at each.
type cockpitNotifier struct {
	notifier
	mu       sync.Mutex // guards latestOf; a leaf, let go before the notifier's is taken
	latestOf map[string]CockpitChange
}

func (n *cockpitNotifier) latest(cockpit string) CockpitChange {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.latestOf[cockpit]
}

// commitEnds counts a durable commit and wakes its cockpit's waiters (notifier's, promoted,
// would wake the key's).
func (n *cockpitNotifier) commitEnds(key string, c *commitOutcome) {
	if c.durable {
		n.publish(key)
	}
}

// publish records a commit under a store lock key (a cockpit's or a stack's).
func (n *cockpitNotifier) publish(key string) {
	cockpit, events := "", ""
	switch {
	case strings.HasPrefix(key, cockpitsPrefix):
		cockpit, events = key[len(cockpitsPrefix):], "events"
	case strings.HasPrefix(key, allStacksPrefix):
		var stack string
		cockpit, stack = splitStackKey(key)
		events = "stacks/" + stack + "/events"
	default:
		return
	}
	n.mu.Lock()
	if n.latestOf == nil {
		n.latestOf = map[string]CockpitChange{}
	}
	n.latestOf[cockpit] = CockpitChange{Seq: n.latestOf[cockpit].Seq + 1, Events: events}
	n.mu.Unlock()
	n.notifier.publish(cockpit)
}

// LogRefusal records a refused operation in the events file of the stack, or of the cockpit when
// stack is "" or no longer exists (the nearest one), errno named by the adapter that chose it
// (see logLine: it takes no lock). unshown is how many of c's uid's refusals before it the
// adapter left without a line since that uid's previous one (0: none).
func (e *Engine) LogRefusal(c Caller, cockpit, stack string, r *Refusal, errno string, unshown int) error {
	return e.logLine(c, cockpit, stack, event{Result: "refused", Code: r.Code, Errno: errno, Message: r.Message, Fix: r.Fix, Unshown: unshown})
}

// exists reads key with Get, so the transaction conflicts with its creation or removal.
func exists(tx storage.Txn, key string) bool {
	_, err := tx.Get(key)
	return err == nil
}
