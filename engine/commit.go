package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/listeners"
	"github.com/cockpitfs/cockpitfs/engine/portlock"
	"github.com/cockpitfs/cockpitfs/storage"
)

// Commit plumbing. Every operation that writes has one shape: its use case observes what lies
// outside the store (processes, the caller), then, in one transaction, reads what it decides on
// with Get and runs its pure step, which returns a change; commitChange writes the change and the
// operation's events line together (the one place such a line is made), then update keeps the
// caches and the waiters fresh. applyStep is that shape for a step over a stack's record; the
// cockpit's operations (cockpits.go) and declared values (entrypoints.go) return their change
// through apply.

// errUnchanged aborts a transaction that would change nothing: the operation still succeeds.
var errUnchanged = errors.New("unchanged")

// behindHolds aborts a claim's run that found no free family while this daemon holds one of them
// for another stack (key) whose claim the run's snapshot does not show: one made since, or under
// way. That stack may have let go, since the snapshot, the family the run counted as its lease:
// a refusal on both would count it twice and say PORT_LEASE_EXHAUSTED with a family free all
// along. update waits for that stack's transaction and runs the claim again on a fresh snapshot,
// so that a refusal rests on one snapshot. refusal is the run's own.
type behindHolds struct {
	stack   string
	refusal error
}

func (b behindHolds) Error() string { return b.refusal.Error() }
func (b behindHolds) Unwrap() error { return b.refusal }

// noFreeFamily reports whether err is leaseFamily's refusal for want of a free family.
func noFreeFamily(err error) bool {
	var rf *Refusal
	return errors.As(err, &rf) && (rf.Code == PortLeaseExhausted || rf.Code == PortFamilyCollision)
}

// step is one operation's rule: the value that follows r, or why not (a refusal, or errUnchanged
// when there is nothing to commit). It changes nothing itself; what it reads beyond r it reads
// through reads, and what it needs done beyond deciding it asks of fx.
type step func(r Record, reads stepReads, fx stepEffects, now time.Time) (Value, error)

// stepEffects are what a step may ask the commit path to do, beyond reading: a claim's listener
// probe of a candidate family's ports, and the machine-wide holds of the family it would lease.
// The step asks for them candidate by candidate, since which families it reaches depends on the
// port index read in the transaction; applyStep performs them (txReads.holdFamily), so the step
// stays a function of its record, its reads and these answers.
type stepEffects struct {
	// probe says which of ports have a host TCP listener.
	probe func(ports []int) ([]int, error)
	// hold takes the machine-wide holds of a family's ports for the stack, all or none, and says
	// who holds the port it could not take (nil: taken); nil when the engine holds no ports.
	hold func(ports map[string]int) (*portlock.Holder, int, error)
}

// stepReads is what a step may read beyond its stack's record. Each read is a Get inside the
// commit's transaction, so a concurrent change of what the step decided on conflicts and retries.
type stepReads interface {
	cockpit() (cockpitMeta, error)
	activeLeases() (int, error)         // active leases in the cockpit
	leasesOf(uid uint32) (int, error)   // active leases taken by uid's claims, every cockpit
	portOwner(port int) (string, error) // "cockpit/stack" of another stack's active lease of port, "" if none
	// leasedPorts are the ports of the cockpit's active leases; known is false in a store that
	// does not keep them yet (see leasedPorts in portindex.go).
	leasedPorts() (ports []int, known bool, err error)
	// releasedDead tells the commit's events line the dead holders the step released.
	releasedDead(holders []Holder)
	// passedPrevious tells the commit's events line why the stack's previous family was not
	// leased again.
	passedPrevious(why string)
}

// txReads serves stepReads from a transaction on the stack (cockpit, stack).
type txReads struct {
	e           *Engine
	tx          storage.Txn
	cockpitName string
	stack       string
	skipped     *skippedHeld
}

// skippedHeld is what a claim's holds skipped: why each family, for the events line, and a stack
// this daemon holds one for (see behindHolds); and the dead holders it released, whose release
// the line names too (nothing else says who released them).
type skippedHeld struct {
	why  []string
	here string
	dead []Holder
	// previous is why the stack's previous family was passed ("": taken again, or none).
	previous string
}

func (t txReads) releasedDead(holders []Holder) { t.skipped.dead = append(t.skipped.dead, holders...) }

func (t txReads) passedPrevious(why string) { t.skipped.previous = why }

// holdFamily performs a step's hold effect (stepEffects.hold), and notes for the events line and
// behindHolds what it skipped.
func (t txReads) holdFamily(ports map[string]int) (*portlock.Holder, int, error) {
	holder, port, here, err := t.e.holds.takeFamily(stackKey(t.cockpitName, t.stack), t.cockpitName, t.stack, ports)
	if holder != nil {
		t.skipped.why = append(t.skipped.why, fmt.Sprintf("port %d is held by %s", port, holder))
	}
	if here != "" {
		t.skipped.here = here
	}
	return holder, port, err
}

func (t txReads) cockpit() (cockpitMeta, error) { return t.e.loadCockpit(t.tx, t.cockpitName) }

func (t txReads) activeLeases() (int, error) {
	n, _, err := readCount(t.tx, leaseCountKey(t.cockpitName))
	return n, err
}

func (t txReads) leasesOf(uid uint32) (int, error) {
	n, _, err := readCount(t.tx, uidLeasesKey(uid))
	return n, err
}

// leasedPorts: a set that does not decode is not known, so each family's index entries are read
// (reindexLeasedPorts rebuilds it at the cockpit's next lease change).
func (t txReads) leasedPorts() ([]int, bool, error) {
	ports, known, err := leasedPorts(t.tx, t.cockpitName)
	if isMalformed(err) {
		return nil, false, nil
	}
	return ports, known, err
}

// portOwner reads the names in port's index entry where it can without decoding it: a claim
// reads the entry of every occupied family it passes.
func (t txReads) portOwner(port int) (string, error) {
	key := portKey(port)
	data, err := t.tx.Get(key)
	if errors.Is(err, storage.ErrNotFound) {
		return t.unindexedOwner(port)
	}
	if err != nil {
		return "", err
	}
	_, cockpit, stack, _, _, plain := portOwnerFields(data)
	if !plain { // names JSON escapes: decoded as any entry is
		var owner PortOwner
		if err := decodeJSON(key, data, &owner); err != nil {
			return "", err
		}
		cockpit, stack = []byte(owner.Cockpit), []byte(owner.Stack)
	}
	if string(cockpit) == t.cockpitName && string(stack) == t.stack {
		return "", nil
	}
	return string(cockpit) + "/" + string(stack), nil
}

// unindexedOwner is portOwner of a port with no index entry: a stack whose record, read with
// Get, still holds it in an active lease (its entry deleted by hand), else none. Only the stacks
// leaseHolders names are read: one Get each (one, unless records disagree), and none for a port
// no lease held.
func (t txReads) unindexedOwner(port int) (string, error) {
	for _, key := range t.e.leaseHolders.holders(port) {
		if key == stackKey(t.cockpitName, t.stack) {
			continue
		}
		head, err := t.tx.Get(key)
		if errors.Is(err, storage.ErrNotFound) {
			continue
		}
		if err != nil {
			return "", err
		}
		cockpit, stack := splitStackKey(key)
		owner := cockpit + "/" + stack + ", missing from the port index"
		r, err := decodeHead(head)
		if err != nil {
			// It held the port when it last decoded: what it holds now is unknown, so not free.
			return owner + " (its record does not decode)", nil
		}
		if r.Value.Lease.Active() && slices.Contains(slices.Collect(maps.Values(r.Value.Lease.Ports)), port) {
			return owner, nil
		}
	}
	return "", nil
}

// applyStep commits the value s derives from the stack's current record.
func (e *Engine) applyStep(ctx context.Context, c Caller, cockpit, stack string, s step) error {
	return e.apply(ctx, c, stackKey(cockpit, stack), func(tx storage.Txn, now time.Time) (change, error) {
		r, err := e.readRecord(tx, cockpit, stack)
		if err != nil {
			return change{}, err
		}
		var skipped skippedHeld
		reads := txReads{e: e, tx: tx, cockpitName: cockpit, stack: stack, skipped: &skipped}
		fx := stepEffects{probe: listeners.Listening}
		if e.holds != nil {
			fx.hold = reads.holdFamily
		}
		v, err := s(r.Record, reads, fx, now)
		if skipped.here != "" && noFreeFamily(err) {
			// hold is asked only of families free in the snapshot: the claim that holds this one
			// is newer than it.
			return change{}, behindHolds{stack: skipped.here, refusal: err}
		}
		if err != nil {
			return change{}, err
		}
		var warnings []string
		if len(skipped.dead) > 0 {
			released := make([]string, len(skipped.dead))
			for i, h := range skipped.dead {
				released[i] = fmt.Sprintf("%s (process %d)", h.Name, h.PID)
			}
			warnings = append(warnings, "released dead holders: "+strings.Join(released, ", "))
		}
		if skipped.previous != "" {
			warnings = append(warnings, skipped.previous)
		}
		if len(skipped.why) > 0 {
			// A candidate family another process holds was skipped: the claim's line says why.
			warnings = append(warnings, "skipped candidate families: "+strings.Join(skipped.why, "; "))
		}
		return nextRecord(r, v, strings.Join(warnings, "; ")), nil
	})
}

// change is what an operation's step decided: every write of its commit, and the events file its
// line goes to. Only commitChange writes it.
type change struct {
	cockpit string
	meta    *cockpitMeta // the cockpit's next metadata
	// record is a stack's next value after prev, committed as its next revision with its port
	// index (see nextRecord).
	record *recordChange
	// created is a new stack's first record.
	created *Record
	// declared are a stack's next declared values (declaredValuesKey).
	declared *declaredChange
	// removedStack names a stack removed: its record, declared values and events go.
	removedStack string
	// removedCockpit: the cockpit's metadata, lease counts and events go.
	removedCockpit bool
	// counted changes how many cockpits owner has made (uidCockpitsKey): +1 for one made, -1 for a
	// counted one removed.
	counted int
	owner   uint32
	// stacks changes how many stacks creator has made that exist (uidStacksKey): +1 for one made,
	// -1 for one removed.
	stacks  int
	creator uint32
	// line is the events file of the operation's line: a stack's name, cockpitLevel for the
	// cockpit's own, "" for none (a removed cockpit keeps no events file).
	line string
	// revision is what the line names: the revision of the record or cockpit the change is about.
	// A record's next revision (record) names itself.
	revision int64
	warning  string // the line's warning, "" for none
}

type recordChange struct {
	prev  cachedRecord
	value Value
}

type declaredChange struct {
	stack  string
	values DeclaredValues
}

// nextRecord is the change that commits v as r's next value, its line in r's events file.
func nextRecord(r cachedRecord, v Value, warning string) change {
	return change{cockpit: r.Cockpit, record: &recordChange{prev: r, value: v}, line: r.Stack, warning: warning}
}

// apply runs an operation whose step reads what it decides on in tx (Gets, so a concurrent change
// of it conflicts) and returns its change, then commits that change, all in one transaction
// under key's lock.
func (e *Engine) apply(ctx context.Context, c Caller, key string, step func(tx storage.Txn, now time.Time) (change, error)) error {
	return e.update(ctx, key, func(tx storage.Txn, now time.Time) error {
		ch, err := step(tx, now)
		if err != nil {
			return err
		}
		return e.commitChange(tx, c, ch, now)
	})
}

// commitChange writes ch in tx, then the operation's events line: the cockpit's metadata, a
// stack's next record after its invariants (a transition that would break one commits nothing)
// with its port index, a new stack's record, declared values, removals, the counts.
func (e *Engine) commitChange(tx storage.Txn, c Caller, ch change, now time.Time) error {
	revision := ch.revision
	var repaired []string // damaged counts this commit recounts: its line says so
	if ch.meta != nil {
		// Before the counts: a count recounted from the cockpits counts this one.
		if err := setJSON(tx, cockpitKey(ch.cockpit), *ch.meta); err != nil {
			return err
		}
	}
	if rc := ch.record; rc != nil {
		r, v := rc.prev, chargeLease(rc.value)
		saved, err := saveRecord(tx, r, r.next(v, now))
		if err != nil {
			return err
		}
		staged := stagedCommit{record: saved}
		if e.vanished != nil {
			staged.vanished = vanishedHolders(r.Record, saved.Record)
		}
		e.staged.Store(stackKey(r.Cockpit, r.Stack), staged)
		if err := reindexLease(tx, r.Cockpit, r.Stack, r.Value.Lease, v.Lease, &repaired); err != nil {
			return err
		}
		revision = saved.Revision
	}
	if ch.created != nil {
		if _, err := saveRecord(tx, cachedRecord{}, *ch.created); err != nil {
			return err
		}
	}
	if d := ch.declared; d != nil {
		if err := setJSON(tx, declaredValuesKey(ch.cockpit, d.stack), d.values); err != nil {
			return err
		}
	}
	if stack := ch.removedStack; stack != "" {
		if err := deleteKeys(tx, []string{stackKey(ch.cockpit, stack), declaredValuesKey(ch.cockpit, stack)}); err != nil {
			return err
		}
		if err := deleteEvents(tx, ch.cockpit, stack); err != nil {
			return err
		}
	}
	if ch.removedCockpit {
		if err := deleteKeys(tx, []string{cockpitKey(ch.cockpit), leaseCountKey(ch.cockpit), leasedPortsKey(ch.cockpit)}); err != nil {
			return err
		}
		if err := deleteEvents(tx, ch.cockpit, cockpitLevel); err != nil {
			return err
		}
	}
	if ch.counted != 0 {
		if err := addCount(tx, uidCockpitsKey(ch.owner), ch.counted, &repaired); err != nil {
			return err
		}
	}
	if ch.stacks != 0 {
		if err := addCount(tx, uidStacksKey(ch.creator), ch.stacks, &repaired); err != nil {
			return err
		}
	}
	if ch.line == "" {
		return nil
	}
	ev := okEvent(c, now, revision)
	ev.Warning = strings.Join(slices.DeleteFunc(append([]string{ch.warning}, repaired...), func(w string) bool { return w == "" }), "; ")
	return appendEvent(tx, ch.cockpit, ch.line, ev)
}

// update runs fn as one transaction while holding the lock of key, so writers of one stack queue
// here instead of retrying conflicts in the store. The wait for the lock and the store's conflict
// retries share one budget, so STATE_LOCKED comes within it, not within twice it. The lock is
// released at the commit, before its sync: the next writer reads the commit in its own
// transaction, and writers queued on one stack share syncs as writers on distinct stacks do.
// Readers and watchers of key see the commit only once it is durable: the observers (the caches
// and the waiters, Engine.observers) hear of it before it writes, once it is ordered, and once it
// is durable, and only then does the cache take it and are watchers woken.
func (e *Engine) update(ctx context.Context, key string, fn func(tx storage.Txn, now time.Time) error) error {
	budget, cancel := withBudget(ctx, e.budget)
	defer cancel()
	unlock, err := e.locks.lock(budget, key)
	if err != nil {
		return e.locked(ctx, key, nil)
	}
	observers := e.observers()
	var outcome commitOutcome
	for _, o := range observers {
		o.commitBegins(key)
	}
	defer func() {
		for _, o := range observers {
			o.commitEnds(key, &outcome)
		}
	}()
	run := func(tx storage.Txn) error {
		e.staged.Delete(key) // only the run that commits counts
		if e.holds != nil {
			// A run that conflicted may have held a family this one will not choose (another
			// freed meanwhile): holding both would refuse another stack's claim.
			e.holds.releasePendingOf(key)
		}
		return fn(tx, e.now())
	}
	durable, err := e.commitPastHolds(budget, run)
	var vanished []string
	if staged, ok := e.staged.LoadAndDelete(key); ok && err == nil {
		s := staged.(stagedCommit)
		outcome.written, vanished = &s.record, s.vanished
	}
	if e.holds != nil {
		// Still under the stack's lock: what the transaction held becomes the committed lease's,
		// or goes.
		var lease *Lease
		if outcome.written != nil {
			lease = outcome.written.Value.Lease
		}
		e.holds.settle(key, outcome.written != nil, lease)
	}
	if errors.Is(err, errUnchanged) {
		unlock()
		return nil
	}
	for _, o := range observers {
		o.commitOrdered(key, &outcome)
	}
	unlock()
	if err == nil {
		err = durable()
	}
	if err != nil {
		outcome.written = nil
	}
	outcome.durable = err == nil
	switch {
	case errors.Is(err, storage.ErrLocked):
		return e.locked(ctx, key, err)
	case err != nil:
		return err
	}
	if len(vanished) > 0 {
		w := outcome.written
		e.vanished(ctx, Vanished{Cockpit: w.Cockpit, Stack: w.Stack, Holders: vanished})
	}
	return nil
}

// commitObserver is a cache of what the store holds, or the waiters of a change: something every
// commit must keep fresh. update walks Engine.observers, in list order, at three points of each
// commit on key; a new cache joins the list, not the lines of update.
type commitObserver interface {
	// commitBegins comes before the transaction runs, so before anything it writes can be read:
	// the store may show a commit to other readers before its committer is back (a sync round
	// another committer leads, a backend durable at commit).
	commitBegins(key string)
	// commitOrdered comes once the transaction is over, unless it changed nothing, while key's
	// lock still orders this commit before the next one on key. c.written is the record it
	// wrote (nil: none, or it failed).
	commitOrdered(key string, c *commitOutcome)
	// commitEnds comes once the commit is durable (c.durable), failed, or changed nothing, with
	// key's lock released.
	commitEnds(key string, c *commitOutcome)
}

// commitOutcome is what a commit's observers learn of it.
type commitOutcome struct {
	written *cachedRecord // the stack's record as the commit wrote it; nil: none, or not durable
	durable bool          // a change was committed and is durable: its waiters may look
	gen     uint64        // the record cache's generation for this commit (commitOrdered)
}

// observers are what a commit keeps fresh, in the order update walks them: the record cache takes
// a commit's record before its waiters wake, so they read it from memory.
func (e *Engine) observers() [9]commitObserver {
	return [...]commitObserver{&e.records, &e.changes, &e.cockpitChanges, &e.inventory, &e.ports, &e.status, &e.cockpits, &e.healthCache, &e.leaseHolders}
}

// commitPastHolds commits run; a run refused behind another stack's newer holds (behindHolds)
// runs again once that stack's transaction is over, each such stack waited for once.
func (e *Engine) commitPastHolds(budget context.Context, run func(storage.Txn) error) (func() error, error) {
	durable, err := e.db.Commit(budget, run)
	var waited []string
	for {
		// run's errors come back unchanged (storage.Store), so a type assertion finds it.
		behind, ok := err.(behindHolds)
		if !ok {
			break
		}
		if slices.Contains(waited, behind.stack) {
			// Its hold is still newer than a snapshot taken after its transaction: the holds
			// and the store disagree, and the refusal stands rather than wait for nothing.
			err = behind.refusal
			break
		}
		waited = append(waited, behind.stack)
		// Once the other stack's transaction is over, a fresh snapshot shows its claim, or its
		// hold is gone. The waiting claim holds no port (it has no lease, and its run let go of
		// what it took), so no claim waits for it in turn.
		unlockOther, lockErr := e.locks.lock(budget, behind.stack)
		if lockErr == nil {
			unlockOther()
		}
		if lockErr != nil || budget.Err() != nil {
			err = fmt.Errorf("%w: %w", storage.ErrLocked, err)
			break
		}
		durable, err = e.db.Commit(budget, run)
	}
	return durable, err
}

// locked is why an operation on key gave up waiting: the caller's own cancellation (an
// interrupt), or contention that outlasted the budget (STATE_LOCKED).
//
// cause is the store's ErrLocked, which says what kept it (conflicts, or an etcd quorum that did
// not answer); nil when the wait was for this daemon's own lock.
func (e *Engine) locked(ctx context.Context, key string, cause error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if cause != nil {
		return refuse(StateLocked, key, "retry", "the store did not commit within %s: %s", e.budget, strings.TrimPrefix(cause.Error(), storage.ErrLocked.Error()+": "))
	}
	return refuse(StateLocked, key, "retry", "contention did not clear within %s", e.budget)
}

// keyedLocks queues the writers of one key in this process; lock waits until ctx is done. A key's
// entry lives while someone holds or awaits it, so keys of removed stacks do not pile up.
type keyedLocks struct {
	mu sync.Mutex // guards m and each entry's users; a leaf (LOCK ORDERING 7)
	m  map[string]*keyLock
}

type keyLock struct {
	ch    chan struct{} // the key's lock (LOCK ORDERING 2): one slot, so a waiter can give up at ctx
	users int           // holder and waiters
}

func (k *keyedLocks) lock(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyLock{}
	}
	l, ok := k.m[key]
	if !ok {
		l = &keyLock{ch: make(chan struct{}, 1)}
		k.m[key] = l
	}
	l.users++
	k.mu.Unlock()
	// A free lock is taken without asking for ctx's Done, which would arm its timer (see
	// budgetContext).
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; k.release(key, l) }, nil
	default:
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; k.release(key, l) }, nil
	case <-ctx.Done():
		k.release(key, l)
		return nil, ctx.Err()
	}
}

func (k *keyedLocks) release(key string, l *keyLock) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.users--; l.users == 0 {
		delete(k.m, key)
	}
}

// notifier wakes waiters on a key: next hands out a channel that publish closes.
type notifier struct {
	mu sync.Mutex // guards m; a leaf
	m  map[string]chan struct{}
}

func (n *notifier) next(key string) <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = map[string]chan struct{}{}
	}
	ch, ok := n.m[key]
	if !ok {
		ch = make(chan struct{})
		n.m[key] = ch
	}
	return ch
}

// publishAll wakes every waiter (changes may have been missed).
func (n *notifier) publishAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for key, ch := range n.m {
		close(ch)
		delete(n.m, key)
	}
}

func (n *notifier) commitBegins(string)                  {}
func (n *notifier) commitOrdered(string, *commitOutcome) {}

// commitEnds wakes key's waiters once a change of it is durable.
func (n *notifier) commitEnds(key string, c *commitOutcome) {
	if c.durable {
		n.publish(key)
	}
}

func (n *notifier) publish(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ch, ok := n.m[key]; ok {
		close(ch)
		delete(n.m, key)
	}
}
