// Package etcdstore keeps cockpitfs's store in etcd, under one key prefix, so that daemons on many
// machines share one namespace. It implements the storage contract with one etcd transaction per
// Update:
//
//   - fn reads one snapshot at a revision R: a linearizable read of one key (one round trip)
//     returns a revision X, and R is X or later (below); or, for a first attempt that commits,
//     the cache as it stands (WRITES THAT NEED NO READ FIRST). Writes are buffered; reads see
//     them (read-your-writes).
//   - The commit is a single Txn: If every compare holds, Then every buffered write. It compares
//     the ModRevision of every key fn read with Get or that a Scan returned (0 for a key read as
//     missing) against the one read at R, and for every scanned range that ModRevision < R+1 over
//     the whole range. Together they prove the range unchanged since R: a key created or changed
//     since R has ModRevision > R and fails the range compare; a key deleted since R fails its own
//     compare; a key created and deleted again since R leaves the range as it was at R. So etcd
//     protects Scan against phantoms too, which the contract does not require.
//   - Update returns nil only once etcd answers that the Txn succeeded, i.e. a quorum committed it.
//     A failed compare is a conflict: fn runs again on a fresh snapshot until the budget ends.
//   - A Txn whose answer was lost with its connection or member is settled (outcome.go): sent
//     again, or found in etcd's history, the compares keeping it from applying twice.
//
// # READS FROM THE CACHE, AND WHY THEY ARE CURRENT
//
// One watch on the prefix keeps a cache of every key under it (cache.go): values, ModRevisions,
// and the revision the cache is complete through. A snapshot's reads are served from the cache
// with no round trip each, when this proof holds, else from etcd at X:
//
//  1. X is current. The read of one key is linearizable (etcd's ReadIndex: the member answers only
//     once it has applied everything the leader had committed when the read arrived), so X is at
//     least the revision of every commit acknowledged, to anyone, before the operation began.
//  2. The cache holds R ≥ X. A transaction pins the cache only once it is complete through X,
//     at its revision R then: every commit up to R under the prefix is applied, in revision order,
//     and nothing later (the watch's order, and etcd's never splitting a revision across
//     responses, see cache). Until the pin ends the cache keeps every version a read at R sees.
//  3. So the snapshot at R is the store as it stood at a moment within the operation: after it
//     began (R ≥ X covers everything acknowledged before), before the read of the cache (R was
//     committed by then). Reads at R are linearizable, as reads of etcd at X would be; a View
//     or an Update that writes nothing needs nothing more, and a commit is protected by its
//     compares exactly as above.
//
// So every read costs one round trip to learn X, whatever number of keys and ranges it reads, and
// a write one round trip, its commit, when the cache is current (below), else two. The round trip
// to learn X cannot go without another proof of currency: a watch delivers another daemon's
// commit some time after it is acknowledged, and no daemon can know, without asking etcd, that
// none is on its way (etcd offers no read leases). It also keeps the quorum check before anything
// is proposed: without a quorum the read fails, the operation refuses and nothing applies. A
// cache behind X (the watch is cut off, or slow) costs the reads from etcd, never a stale one;
// a revision past the cache's with no event on its way (a commit outside the prefix) is settled
// by a progress request on the watch.
//
// # WRITES THAT NEED NO READ FIRST
//
// A commit needs no proof that its snapshot is current: its compares prove its reads unchanged
// up to its own revision, so a commit that applies decided on the store as it stood just before
// it. So Update first runs fn on the cache as it stands (once the cache holds every revision this
// store has seen) and commits with no read of etcd: one round trip, the commit (tryOptimistic).
// Only what returns without a commit needs the read: a refusal, a failure, or nothing to write,
// decided on a cache that may miss another daemon's commit; fn then runs again on a linearizable
// snapshot, as it does when the compares fail. The read before a commit also proves a quorum
// before anything is proposed, so this is done only while a quorum answered within the last
// 100 ms (tryOptimistic says why).
//
// Recent serves hints from the cache as it stands, with no round trip and no proof: only for what
// a later transaction reads again before it decides.
//
// The store is Shared (storage.Shared): other daemons write the same keys, so the engine reads
// through its caches and wakes its waiters from Watch.
package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/storage"
	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
)

const (
	minSpread = 200 * time.Microsecond
	maxSpread = 500 * time.Millisecond
)

// Store is a prefix of an etcd cluster. It is safe for concurrent use.
type Store struct {
	cli       *clientv3.Client
	cfg       clientv3.Config // cli's, for the connection to the leader (leader.go)
	prefix    string
	budget    time.Duration
	conflicts atomic.Uint64
	// roundTrips counts the requests View and Update sent to etcd.
	roundTrips atomic.Uint64
	cache      *cache
	// watching is the context of the cache's watch, whose stream a progress request must name.
	watching atomic.Pointer[context.Context]
	// seen is the highest revision etcd has answered this store with, and clusterID the cluster
	// that answered first: a revision below seen, or another cluster, means the store behind the
	// endpoints is not the one this store's cache and caller know (revoked, below).
	seen      atomic.Int64
	clusterID atomic.Uint64
	// quorum is the boot-time clock when the last request a quorum answered was sent (a
	// linearizable read, or a commit: both pass through raft).
	quorum atomic.Int64
	// revoked, once set, fails every read and commit: the store was restored from an older
	// snapshot or replaced, and nothing this process holds of it can be trusted.
	revoked atomic.Pointer[error]
	// progress says whether the members answer a progress request in order with the watch's
	// events (progress.go): only then does the cache ask for and take progress notifications.
	progress bool
	// lead is the connection to the leader, nil while none is known (leader.go); seeking says a
	// search for the leader is under way, sought when the last one ended.
	lead     atomic.Pointer[leader]
	steering sync.Mutex
	seeking  bool
	sought   time.Time
	// announcements are the keys Announce keeps, by key: *announcement.
	announcements sync.Map
	// closing ends the watch when the store closes.
	closing context.Context
	close   context.CancelFunc
}

// Open connects to the cluster cfg names and checks that a quorum answers.
func Open(cfg etcdconf.Config) (*Store, error) {
	prefix, err := normalizePrefix(cfg.Prefix)
	if err != nil {
		return nil, err
	}
	budget := cfg.Budget
	if budget == 0 {
		budget = storage.Budget
	}
	cc := clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: budget,
		TLS:         cfg.TLS,
		Username:    cfg.Username,
		Password:    cfg.Password,
		Logger:      zap.NewNop(),
		// Detect a dead member on an idle connection and move to another.
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		if cause := describeAuth(err); cause != nil { // with --user, New authenticates
			err = cause
		}
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	s := &Store{cli: cli, cfg: cc, prefix: prefix, budget: budget, cache: newCache()}
	s.closing, s.close = context.WithCancel(context.Background())
	s.sought = time.Now() // the leader is found below, once the cluster has answered
	// A linearizable read needs a quorum: a cluster that cannot serve one is refused now.
	if err := s.load(); err != nil {
		s.Close()
		// The client hides why it could not connect behind a deadline: say it as etcdctl would.
		if cause := describeAuth(err); cause != nil {
			err = cause
		} else if cause := diagnose(cfg, budget); cause != nil {
			err = cause
		}
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	var leader string
	var term uint64
	s.progress, leader, term = progressTrusted(cli, cfg.Endpoints, budget)
	s.pin(leader, term)
	go s.follow()
	return s, nil
}

// normalizePrefix makes prefix end in '/', so that "team" and "team2" never share keys.
func normalizePrefix(prefix string) (string, error) {
	prefix = strings.Trim(prefix, "/")
	if prefix == "" {
		return "", errors.New("etcd: the store needs a key prefix (etcd://HOST:PORT/PREFIX)")
	}
	return prefix + "/", nil
}

// Close ends the store's watches and its connections.
func (s *Store) Close() error {
	s.close()
	if l := s.lead.Swap(nil); l != nil {
		l.close()
	}
	return s.cli.Close()
}

// Client is the store's etcd client, for what only etcd offers (leases).
func (s *Store) Client() *clientv3.Client { return s.cli }

// Conflicts returns how many times Update retried because a compare failed.
func (s *Store) Conflicts() uint64 { return s.conflicts.Load() }

// RoundTrips returns how many requests View and Update have sent to etcd.
func (s *Store) RoundTrips() uint64 { return s.roundTrips.Load() }

// Watch implements storage.Shared from the cache's watch: fn sees each change once the cache
// holds it, so a read fn's call prompts finds it there. It subscribes once the cache holds every
// commit acknowledged before Watch was called, so fn is not handed those as new (should the watch
// lag past the budget, it subscribes anyway: an extra call wakes a waiter for nothing, a missed one
// would leave it asleep).
func (s *Store) Watch(prefix string, fn func(key string)) error {
	full := s.prefix + prefix
	ctx, cancel := context.WithTimeout(s.closing, s.budget)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.prefix, clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("etcd watch %s: %w", full, s.describe(err))
	}
	bound := catchUp // no progress request: a revision moved outside the prefix brings no event
	if watching := s.watching.Load(); watching != nil && s.progress {
		_ = s.cli.RequestProgress(*watching)
		bound = s.budget
	}
	s.cache.await(ctx, resp.Header.Revision, bound)
	s.cache.subscribe(full, func(key string) {
		if key != "" {
			key = strings.TrimPrefix(key, s.prefix)
		}
		fn(key)
	})
	return nil
}

// Withhold implements storage.Shared: the cache keeps of a key keep refuses only the key and its
// ModRevision, so a value put under the prefix outside the caller's layout (by hand, by another
// version) costs this process no memory; a read that meets one reads etcd at its snapshot's
// revision, one round trip more.
func (s *Store) Withhold(keep func(key string) bool) {
	s.cache.withhold(func(full string) bool { return keep(strings.TrimPrefix(full, s.prefix)) })
}

// Announce implements storage.Shared with an etcd lease of ttl, kept alive until Close. When the
// lease is lost (expired while cut off) the key is written again under a new one.
func (s *Store) Announce(key string, ttl time.Duration) error {
	a := &announcement{full: s.prefix + key, ttl: ttl}
	a.mu.Lock()
	err := s.announce(a)
	a.mu.Unlock()
	if err != nil {
		return fmt.Errorf("etcd announce %s: %w", key, s.describe(err))
	}
	s.announcements.Store(key, a)
	// The key itself is anyone's to delete or overwrite (a teammate tidying the prefix with
	// etcdctl): gone, every other machine would read this one's holders dead, and their next
	// claim release them while their processes run. Each change to it is checked, and the key
	// written again under the lease.
	changed := make(chan struct{}, 1)
	s.cache.subscribe(a.full, func(string) {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	go func() {
		for s.closing.Err() == nil {
			a.mu.Lock()
			lost := a.lost
			a.mu.Unlock()
			select {
			case <-changed:
				if !s.keepAnnounced(a) {
					_ = sleep(s.closing, time.Second)
					select {
					case changed <- struct{}{}: // checked again
					default:
					}
				}
				continue
			case <-lost:
			}
			_ = sleep(s.closing, time.Second)
			a.mu.Lock()
			for s.closing.Err() == nil && a.lost == lost { // Prove may have written it again already
				if err := s.announce(a); err == nil {
					break
				}
				a.mu.Unlock()
				_ = sleep(s.closing, time.Second)
				a.mu.Lock()
			}
			a.mu.Unlock()
		}
	}()
	return nil
}

// keepAnnounced writes a's key again under its lease unless etcd holds it so, and says whether
// etcd answered.
func (s *Store) keepAnnounced(a *announcement) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.closing, s.budget)
	defer cancel()
	resp, err := s.cli.Get(ctx, a.full)
	if err != nil {
		return false
	}
	if len(resp.Kvs) == 1 && clientv3.LeaseID(resp.Kvs[0].Lease) == a.lease {
		return true
	}
	_, err = s.cli.Put(ctx, a.full, "", clientv3.WithLease(a.lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		err = s.announce(a) // lost meanwhile: a new lease, as the lost lease's keeper would
	}
	return err == nil
}

// announcement is one key Announce keeps, under its current lease.
type announcement struct {
	full string
	ttl  time.Duration

	mu     sync.Mutex // held across a renewal or a new lease, so one Prove asks for all
	lease  clientv3.LeaseID
	lost   <-chan struct{} // closed once the lease's keep-alive ends
	proven time.Duration   // boot-time clock when the last renewal that succeeded was sent
}

// Prove implements storage.Shared.
func (s *Store) Prove(key string) error {
	v, ok := s.announcements.Load(key)
	if !ok {
		return fmt.Errorf("%w: %s was never announced", storage.ErrLocked, key)
	}
	a := v.(*announcement)
	a.mu.Lock()
	defer a.mu.Unlock()
	if bootClock()-a.proven < a.ttl/2 {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.closing, s.budget)
	defer cancel()
	sent := bootClock()
	_, err := s.cli.KeepAliveOnce(ctx, a.lease)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// Expired while this process was paused or cut off: others have read its machine gone
		// meanwhile. It is announced again before anything it does relies on it.
		err = s.announce(a)
	} else if err == nil {
		a.proven = sent
	}
	if err != nil {
		return fmt.Errorf("%w: etcd could not renew %s: %w", storage.ErrLocked, key, s.describe(err))
	}
	return nil
}

// bootClock reads CLOCK_BOOTTIME, which, unlike Go's monotonic clock, counts the time a machine
// spent suspended: an etcd lease expires through a suspend.
func bootClock() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 1 << 62 // unreadable: every Prove renews
	}
	return time.Duration(ts.Nano())
}

// announce writes a's key under a new lease and keeps it alive; a.mu is held.
func (s *Store) announce(a *announcement) error {
	ctx, cancel := context.WithTimeout(s.closing, s.budget)
	defer cancel()
	sent := bootClock()
	lease, err := s.cli.Grant(ctx, int64((a.ttl+time.Second-1)/time.Second))
	if err != nil {
		return err
	}
	if _, err := s.cli.Put(ctx, a.full, "", clientv3.WithLease(lease.ID)); err != nil {
		return err
	}
	alive, err := s.cli.KeepAlive(s.closing, lease.ID)
	if err != nil {
		return err
	}
	lost := make(chan struct{})
	go func() {
		for range alive {
		}
		close(lost)
	}()
	a.lease, a.lost, a.proven = lease.ID, lost, sent
	return nil
}

// catchUp bounds how long a read waits for the watch to bring the cache up to the revision it
// must see before it reads etcd instead: a watch event follows its commit within a millisecond or
// so, and a watch that is cut off must not hold operations up.
const catchUp = 100 * time.Millisecond

// View runs fn on one linearizable snapshot (see the package comment).
func (s *Store) View(fn func(storage.Txn) error) error {
	t, err := s.snapshot(context.Background(), false)
	if err != nil {
		return err
	}
	defer t.done()
	if err := fn(t); err != nil {
		return err
	}
	return t.failure
}

// Recent implements storage.Shared: fn reads the cache as it stands, with no round trip.
func (s *Store) Recent(fn func(storage.Txn) error) error {
	t := s.newTxn(context.Background(), false)
	t.rev, t.cached = s.cache.pin(0)
	err := fn(t)
	t.done()
	if t.failure == errStale {
		// A withheld value is read from etcd at the cache's revision, which stays where the
		// prefix's last commit left it while only other keys change: once etcd compacted past
		// it, fn reads a current snapshot instead.
		return s.View(fn)
	}
	if err != nil {
		return err
	}
	return t.failure
}

// snapshot begins a transaction on a linearizable snapshot: one round trip (a linearizable read
// of one key) learns a revision every commit acknowledged so far is at or below, and the
// transaction reads the cache once the watch has brought it that far, or etcd at that revision.
func (s *Store) snapshot(ctx context.Context, writable bool) (*txn, error) {
	late := ctx.Err() != nil
	checkCtx, cancel := context.WithTimeout(ctx, s.budget)
	began, sent, floor := time.Now(), bootClock(), s.seen.Load()
	resp, err := viaLeader(s, checkCtx, func(ctx context.Context, kv clientv3.KV) (*clientv3.GetResponse, error) {
		return kv.Get(ctx, s.prefix, clientv3.WithCountOnly())
	})
	cancel()
	s.roundTrips.Add(1)
	if err != nil {
		if failed := s.revoked.Load(); failed != nil {
			return nil, *failed
		}
		return nil, fmt.Errorf("%w: etcd read: %w", storage.ErrLocked, s.describeRead(late, time.Since(began), err))
	}
	if err := s.observe(resp.Header, floor); err != nil {
		return nil, err
	}
	s.answered(sent)
	t := s.newTxn(ctx, writable)
	t.rev = resp.Header.Revision
	if at, ok := s.pinAtLeast(t.rev); ok {
		t.rev, t.cached = at, true
	}
	return t, nil
}

// pinAtLeast pins the cache once it is complete through rev. A revision past the cache's with no
// event on its way (a commit outside the prefix moved it) is confirmed by a progress request on
// the watch's stream, where the members answer one in order (progress.go). While the watch is cut off (a member went away), reads stop waiting for it
// after the first one that waited in vain.
func (s *Store) pinAtLeast(rev int64) (int64, bool) {
	if at, ok := s.cache.pin(rev); ok {
		return at, true
	}
	if watching := s.watching.Load(); watching != nil && s.progress {
		_ = s.cli.RequestProgress(*watching)
	}
	if s.cache.lagging() {
		return 0, false // the last wait was in vain: read etcd until the watch delivers again
	}
	ctx, cancel := context.WithTimeout(s.closing, catchUp)
	defer cancel()
	if !s.cache.await(ctx, rev, catchUp) {
		s.cache.lag()
		return 0, false
	}
	return s.cache.pin(rev)
}

// Update runs fn and commits its writes in one etcd transaction (see the package comment). Like
// kv, it gives up once conflicts have kept it from committing for its budget; each read and the
// commit have the budget of their own, so a slow but healthy cluster is not mistaken for a lost
// one.
func (s *Store) Update(ctx context.Context, fn func(storage.Txn) error) error {
	deadline := time.Now().Add(s.budget)
	if done, err := s.tryOptimistic(ctx, fn); done {
		return err
	}
	spread := time.Duration(0)
	for attempt := 1; ; attempt++ {
		began := time.Now()
		conflicted, err := s.tryUpdate(ctx, fn)
		if !conflicted {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %d attempts conflicted over %v", storage.ErrLocked, attempt, s.budget)
		}
		s.conflicts.Add(1)
		// Rivals that read together commit together and conflict again: spread the retries
		// over a span that doubles each time, from one attempt's length (a round trip to a
		// quorum, which no fixed backoff matches).
		spread = min(max(2*spread, time.Since(began), minSpread), maxSpread)
		if err := sleep(ctx, rand.N(spread)); err != nil {
			return fmt.Errorf("%w: %d attempts conflicted: %w", storage.ErrLocked, attempt, err)
		}
	}
}

// Commit is Update: an etcd commit is on a quorum's disks when it returns, with no sync after it
// to wait for.
func (s *Store) Commit(ctx context.Context, fn func(storage.Txn) error) (durable func() error, err error) {
	if err := s.Update(ctx, fn); err != nil {
		return nil, err
	}
	return func() error { return nil }, nil
}

// tryOptimistic is Update's first attempt: fn runs on the cache as soon as it holds every revision
// this store has seen (a local wait, with no round trip), and what fn wrote is committed with no
// read of etcd before it. The compares alone make the commit linearizable: it applies only if
// every key fn read, and every range it scanned, is at its commit's revision as fn read it, so fn
// decided on the store as it stood just before the commit, within the operation. What returns
// without a commit has no such proof: fn's refusal, its failure, or its finding nothing to write
// may rest on a snapshot behind another daemon's acknowledged commit. Then, as when the compares
// fail, it is not done, and Update runs fn again the usual way, on a linearizable snapshot, at once:
// a cache behind another daemon's commit is no contention to back off from.
//
// It is tried only when a quorum answered a request sent within the last quorumFresh (in a mount,
// the kernel's lookup before the write; or the operation before): a commit proposed to a cluster
// that has lost its quorum is answered by nothing, and its outcome stays unknown (it may apply
// once the quorum is back), where a read first refuses it with nothing proposed. So only a
// quorum lost within that span leaves a write's outcome unknown, as one lost between a read and
// its commit does.
func (s *Store) tryOptimistic(ctx context.Context, fn func(storage.Txn) error) (done bool, err error) {
	if s.revoked.Load() != nil || bootClock()-time.Duration(s.quorum.Load()) > quorumFresh {
		return false, nil
	}
	rev, ok := s.pinAtLeast(s.seen.Load())
	if !ok {
		return false, nil // the watch lags: read etcd
	}
	t := s.newTxn(ctx, true)
	t.rev, t.cached = rev, true
	defer t.done()
	failed := fn(t)
	var conflicted bool
	if failed != nil || len(t.writes) == 0 {
		conflicted, err = s.confirm(ctx, t)
		if err == nil {
			err = failed
		}
	} else {
		conflicted, err = s.commit(ctx, t)
	}
	if conflicted {
		s.conflicts.Add(1)
	}
	return !conflicted, err
}

// confirm asks etcd whether every key and range t read is still as t read it, in one
// linearizable read (a Txn of t's compares that writes nothing): then what fn decided on its
// snapshot holds of the store as it is now, within the operation. etcd serves a Txn of no
// operations, or of serializable reads only, from the answering member's own state, which may lag
// or have lost its cluster: the count of the prefix makes it a linearizable read.
func (s *Store) confirm(ctx context.Context, t *txn) (conflicted bool, err error) {
	late := ctx.Err() != nil
	ctx, cancel := context.WithTimeout(ctx, s.budget)
	defer cancel()
	began, sent, floor := time.Now(), bootClock(), s.seen.Load()
	resp, err := viaLeader(s, ctx, func(ctx context.Context, kv clientv3.KV) (*clientv3.TxnResponse, error) {
		return kv.Txn(ctx).If(t.compares()...).Then(clientv3.OpGet(s.prefix, clientv3.WithCountOnly())).Commit()
	})
	s.roundTrips.Add(1)
	if err != nil {
		return false, fmt.Errorf("%w: etcd read: %w", storage.ErrLocked, s.describeRead(late, time.Since(began), err))
	}
	if err := s.observe(resp.Header, floor); err != nil {
		return false, err
	}
	s.answered(sent)
	return !resp.Succeeded, nil
}

func (s *Store) tryUpdate(ctx context.Context, fn func(storage.Txn) error) (conflicted bool, err error) {
	t, err := s.snapshot(ctx, true)
	if err != nil {
		return false, err
	}
	defer t.done()
	if err := fn(t); err != nil {
		if t.failure != nil {
			// fn saw a read fail and returned it, perhaps wrapped: report etcd's side.
			return t.failure == errStale, t.failure
		}
		return false, err
	}
	if t.failure != nil {
		return t.failure == errStale, t.failure
	}
	if len(t.writes) == 0 {
		return false, nil // nothing to commit: the reads were one linearizable snapshot
	}
	return s.commit(ctx, t)
}

// commit sends t's writes in one Txn with its compares, and reports whether they failed.
func (s *Store) commit(ctx context.Context, t *txn) (conflicted bool, err error) {
	// Once sent, the Txn is etcd's to decide: its answer is awaited for the store's budget even if
	// the caller's context ends meanwhile (an interrupt, the engine's budget), so that only a
	// cluster that does not answer leaves an outcome unknown. A caller already gone sends nothing.
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("%w: gave up before committing (nothing applied): %w", storage.ErrLocked, err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.budget)
	defer cancel()
	sent, floor := bootClock(), s.seen.Load()
	send := func(ctx context.Context, kv clientv3.KV) (*clientv3.TxnResponse, error) {
		return kv.Txn(ctx).If(t.compares()...).Then(t.ops()...).Commit()
	}
	var resp *clientv3.TxnResponse
	if l := s.leading(); l != nil {
		resp, err = sendVia(s, l, ctx, send) // not sent again here: settle finds out what became of it
	} else {
		resp, err = send(ctx, s.cli)
	}
	s.roundTrips.Add(1)
	if err != nil {
		// The Txn may have reached a quorum before the answer was lost: ask etcd.
		return t.settle(ctx, err)
	}
	if err := s.observe(resp.Header, floor); err != nil {
		return false, err
	}
	s.answered(sent)
	return !resp.Succeeded, nil
}

// quorumFresh is how recently a quorum must have answered for a write to go without a read first
// (tryOptimistic).
const quorumFresh = 100 * time.Millisecond

// answered records that a quorum answered a request sent at sent (the boot-time clock).
func (s *Store) answered(sent time.Duration) {
	for {
		last := s.quorum.Load()
		if int64(sent) <= last || s.quorum.CompareAndSwap(last, int64(sent)) {
			return
		}
	}
}

// load reads the whole prefix into the cache with a linearizable read.
func (s *Store) load() error {
	ctx, cancel := context.WithTimeout(s.closing, 2*s.budget)
	defer cancel()
	sent, floor := bootClock(), s.seen.Load()
	resp, err := s.cli.Get(ctx, s.prefix, clientv3.WithPrefix())
	if err != nil {
		return s.describe(err)
	}
	if err := s.observe(resp.Header, floor); err != nil {
		return err
	}
	s.answered(sent)
	notify(s.cache.reload(resp.Kvs, resp.Header.Revision))
	return nil
}

// observe checks an answer's header against what this store has seen: etcd's revision never goes
// backward and its cluster never changes, unless the cluster behind the endpoints was restored
// from an older snapshot (etcdutl snapshot restore) or replaced. Then every key this process
// holds may be one the cluster no longer has, and a commit it makes may be invisible to the
// daemons that still read the old state: the store refuses everything from then on, and says why
// once in the daemon's log.
//
// floor is what seen was when the request was sent: a linearizable answer is at least every
// revision answered before it was asked (answers to requests in flight together come in any
// order).
func (s *Store) observe(h *etcdserverpb.ResponseHeader, floor int64) error {
	if failed := s.revoked.Load(); failed != nil {
		return *failed
	}
	if h == nil {
		return nil
	}
	if err := s.observeCluster(h); err != nil {
		return err
	}
	if h.Revision < floor {
		return s.revoke(fmt.Sprintf("etcd's revision went backward: this daemon had seen %d, the cluster now answers %d", floor, h.Revision))
	}
	s.steer(h.RaftTerm)
	for {
		seen := s.seen.Load()
		if h.Revision <= seen || s.seen.CompareAndSwap(seen, h.Revision) {
			return nil
		}
	}
}

// observeCluster is observe's check of the cluster alone, for answers (a watch's) that may lag.
func (s *Store) observeCluster(h *etcdserverpb.ResponseHeader) error {
	if failed := s.revoked.Load(); failed != nil {
		return *failed
	}
	if h == nil || h.ClusterId == 0 {
		return nil
	}
	if s.clusterID.CompareAndSwap(0, h.ClusterId) || s.clusterID.Load() == h.ClusterId {
		return nil
	}
	return s.revoke(fmt.Sprintf("another etcd cluster (id %x) answers where cluster %x did", h.ClusterId, s.clusterID.Load()))
}

// revoke fails the store for good, saying why once in the daemon's log.
func (s *Store) revoke(why string) error {
	err := fmt.Errorf("%s: the store behind --store was restored from an older snapshot or replaced, so what this daemon read of %s may no longer be there; it serves the prefix no more: restart it (cockpitfs unmount, then cockpitfs mount --store …) to read the prefix as it is now", why, s.prefix)
	if s.revoked.CompareAndSwap(nil, &err) {
		log.Print(err)
	}
	return *s.revoked.Load()
}

// follow keeps the cache current from one watch on the prefix, resuming where it left off when a
// member goes away, and loading the prefix again when the history it missed was compacted.
func (s *Store) follow() {
	for s.closing.Err() == nil && s.revoked.Load() == nil {
		// WithRequireLeader ends the watch when its member loses the cluster, so it moves on to
		// one that has it instead of staying silent.
		ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(s.closing))
		s.watching.Store(&ctx)
		next := s.cache.revision() + 1
		for resp := range s.cli.Watch(ctx, s.prefix, clientv3.WithPrefix(), clientv3.WithRev(next)) {
			if resp.CompactRevision != 0 {
				if s.load() != nil {
					break
				}
				cancel() // the server ended the watch; start again past what was loaded
				continue
			}
			if resp.Err() != nil {
				break
			}
			// A watch's member may lag behind the revision a linearizable read saw: only a
			// revocation found by a read, or another cluster, stops the cache.
			if s.observeCluster(resp.Header) != nil {
				break
			}
			switch {
			case len(resp.Events) > 0:
				notify(s.cache.apply(resp.Events, resp.Events[len(resp.Events)-1].Kv.ModRevision))
			case resp.IsProgressNotify() && s.progress:
				notify(s.cache.apply(nil, resp.Header.Revision))
			}
		}
		cancel()
		_ = sleep(s.closing, 100*time.Millisecond)
	}
}

func notify(changes []change) {
	for _, c := range changes {
		c.fn(c.key)
	}
}

// errStale is a read at the snapshot's revision that etcd had compacted away: a conflict.
var errStale = errors.New("etcd: snapshot revision compacted")

// describe names etcd's failures for the events line; a context deadline means no quorum
// answered in time.
func (s *Store) describe(err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no etcd quorum answered within %v: %w", s.budget, err)
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return fmt.Errorf("%w (raise the etcd server's --max-txn-ops)", err)
	}
	return err
}

// describeRead is describe for a read made within its caller's context, which may end before the
// store's budget (the engine's). A read begun after its caller's time was up (spent waiting for
// its lock or on conflicts) asked etcd nothing and must not send the user looking for a lost
// quorum; a read that waited names how long etcd did not answer.
func (s *Store) describeRead(late bool, waited time.Duration, err error) error {
	switch {
	case late:
		return fmt.Errorf("the operation's time ran out before this read (waiting for its stack or on conflicts): %w", err)
	case errors.Is(err, context.DeadlineExceeded) && waited < s.budget:
		return fmt.Errorf("no etcd quorum answered within %v: %w", waited.Round(time.Millisecond), err)
	}
	return s.describe(err)
}

func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// txn is one attempt of fn.
type txn struct {
	s        *Store
	ctx      context.Context
	writable bool
	cached   bool             // reads come from the cache, pinned at rev
	rev      int64            // the snapshot's revision
	read     map[string]int64 // full key → ModRevision at rev (0: missing)
	ranges   []string         // full-key prefixes scanned
	writes   map[string]*[]byte
	// failure is the first failed read: fn may swallow or wrap the error, the outcome may not.
	failure error
}

func (s *Store) newTxn(ctx context.Context, writable bool) *txn {
	return &txn{s: s, ctx: ctx, writable: writable, read: map[string]int64{}, writes: map[string]*[]byte{}}
}

// done ends t, letting the cache drop what only t could still read.
func (t *txn) done() {
	if t.cached {
		t.s.cache.unpin(t.rev)
	}
}

// get reads key (with prefix: every key under it, in key order) at the snapshot's revision.
func (t *txn) get(key string, prefix bool) ([]*mvccpb.KeyValue, error) {
	if t.failure != nil {
		return nil, t.failure
	}
	if t.cached {
		if kvs, held := t.s.cache.read(key, prefix, t.rev); held {
			return kvs, nil
		}
		// A value the cache withholds is read from etcd at the same revision: the same snapshot.
	}
	var opts []clientv3.OpOption
	if prefix {
		opts = append(opts, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	}
	opts = append(opts, clientv3.WithRev(t.rev))
	late := t.ctx.Err() != nil
	ctx, cancel := context.WithTimeout(t.ctx, t.s.budget)
	defer cancel()
	began := time.Now()
	resp, err := t.s.cli.Get(ctx, key, opts...)
	t.s.roundTrips.Add(1)
	if err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) {
			t.failure = errStale
		} else {
			t.failure = fmt.Errorf("%w: etcd read: %w", storage.ErrLocked, t.s.describeRead(late, time.Since(began), err))
		}
		return nil, t.failure
	}
	return resp.Kvs, nil
}

func (t *txn) Get(key string) ([]byte, error) {
	full := t.s.prefix + key
	if v, ok := t.writes[full]; ok {
		if v == nil {
			return nil, storage.ErrNotFound
		}
		return append([]byte{}, *v...), nil
	}
	kvs, err := t.get(full, false)
	if err != nil {
		return nil, err
	}
	if len(kvs) == 0 {
		t.read[full] = 0
		return nil, storage.ErrNotFound
	}
	t.read[full] = kvs[0].ModRevision
	return append([]byte{}, kvs[0].Value...), nil
}

var errReadOnly = errors.New("etcd: write in a read-only View")

func (t *txn) Set(key string, value []byte) error {
	if !t.writable {
		return errReadOnly
	}
	v := append([]byte{}, value...)
	t.writes[t.s.prefix+key] = &v
	return nil
}

func (t *txn) Delete(key string) error {
	if !t.writable {
		return errReadOnly
	}
	t.writes[t.s.prefix+key] = nil
	return nil
}

// Scan merges the snapshot's range with the transaction's own writes under it.
func (t *txn) Scan(prefix string, fn func(key string, value []byte) error) error {
	full := t.s.prefix + prefix
	kvs, err := t.get(full, true)
	if err != nil {
		return err
	}
	t.ranges = append(t.ranges, full)
	merged := map[string][]byte{}
	for _, kv := range kvs {
		k := string(kv.Key)
		t.read[k] = kv.ModRevision
		merged[k] = kv.Value
	}
	for k, v := range t.writes {
		if !strings.HasPrefix(k, full) {
			continue
		}
		if v == nil {
			delete(merged, k)
		} else {
			merged[k] = *v
		}
	}
	keys := make([]string, 0, len(merged))
	for k := range merged {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := fn(strings.TrimPrefix(k, t.s.prefix), append([]byte{}, merged[k]...)); err != nil {
			return err
		}
	}
	return nil
}

// compares are what must still hold at commit for fn's reads to be current (package comment).
func (t *txn) compares() []clientv3.Cmp {
	cmps := make([]clientv3.Cmp, 0, len(t.read)+len(t.ranges))
	for k, rev := range t.read {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", rev))
	}
	for _, p := range t.ranges {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(p), "<", t.rev+1).WithPrefix())
	}
	return cmps
}

func (t *txn) ops() []clientv3.Op {
	keys := make([]string, 0, len(t.writes))
	for k := range t.writes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	ops := make([]clientv3.Op, 0, len(keys))
	for _, k := range keys {
		if v := t.writes[k]; v == nil {
			ops = append(ops, clientv3.OpDelete(k))
		} else {
			ops = append(ops, clientv3.OpPut(k, string(*v)))
		}
	}
	return ops
}
