// Package etcdstore keeps cockpitfs's store in etcd, under one key prefix, so that daemons on many
// machines share one namespace. It implements the storage contract with one etcd transaction per
// Update:
//
//   - fn reads one snapshot: the first read is a linearizable read that fixes its revision R, every
//     later read is at R. Writes are buffered; reads see them (read-your-writes).
//   - The commit is a single Txn: If every compare holds, Then every buffered write. It compares
//     the ModRevision of every key fn read with Get or that a Scan returned (0 for a key read as
//     missing) against the one read at R, and for every scanned range that ModRevision < R+1 over
//     the whole range. Together they prove the range unchanged since R: a key created or changed
//     since R has ModRevision > R and fails the range compare; a key deleted since R fails its own
//     compare; a key created and deleted again since R leaves the range as it was at R. So etcd
//     protects Scan against phantoms too, which the contract does not require.
//   - Update returns nil only once etcd answers that the Txn succeeded, i.e. a quorum committed it.
//     A failed compare is a conflict: fn runs again on a fresh snapshot until the budget ends.
//
// The store is Shared (storage.Shared): other daemons write the same keys, so the engine reads
// through its caches and wakes its waiters from Watch.
package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cockpitfs/cockpitfs/storage"
)

// DefaultBudget bounds how long Update keeps retrying conflicts, and how long any read or commit
// waits for etcd (a lost quorum refuses after it, never hangs): the engine's STATE_LOCKED bound.
const DefaultBudget = 2 * time.Second

const (
	minSpread = 200 * time.Microsecond
	maxSpread = 500 * time.Millisecond
)

// Store is a prefix of an etcd cluster. It is safe for concurrent use.
type Store struct {
	cli       *clientv3.Client
	prefix    string
	budget    time.Duration
	conflicts atomic.Uint64
	// closing ends the watches when the store closes.
	closing context.Context
	close   context.CancelFunc
}

// Open connects to the cluster cfg names and checks that a quorum answers.
func Open(cfg Config) (*Store, error) {
	prefix, err := normalizePrefix(cfg.Prefix)
	if err != nil {
		return nil, err
	}
	budget := cfg.Budget
	if budget == 0 {
		budget = DefaultBudget
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
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	s := &Store{cli: cli, prefix: prefix, budget: budget}
	s.closing, s.close = context.WithCancel(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 2*budget)
	defer cancel()
	// A linearizable read needs a quorum: a cluster that cannot serve one is refused now.
	if _, err := cli.Get(ctx, prefix, clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(cfg.Endpoints, ","), s.describe(err))
	}
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
	return s.cli.Close()
}

// Client is the store's etcd client, for what only etcd offers (leases).
func (s *Store) Client() *clientv3.Client { return s.cli }

// Conflicts returns how many times Update retried because a compare failed.
func (s *Store) Conflicts() uint64 { return s.conflicts.Load() }

// Watch implements storage.Shared: it reports every change under prefix after the revision it
// reads now, resuming where it left off when a member goes away.
func (s *Store) Watch(prefix string, fn func(key string)) error {
	full := s.prefix + prefix
	ctx, cancel := context.WithTimeout(s.closing, s.budget)
	resp, err := s.cli.Get(ctx, full, clientv3.WithCountOnly())
	cancel()
	if err != nil {
		return fmt.Errorf("etcd watch %s: %w", full, s.describe(err))
	}
	go s.watch(full, resp.Header.Revision+1, fn)
	return nil
}

// Announce implements storage.Shared with an etcd lease of ttl, kept alive until Close. When the
// lease is lost (expired while cut off) the key is written again under a new one.
func (s *Store) Announce(key string, ttl time.Duration) error {
	lost, err := s.announce(s.prefix+key, ttl)
	if err != nil {
		return fmt.Errorf("etcd announce %s: %w", key, s.describe(err))
	}
	go func() {
		for s.closing.Err() == nil {
			<-lost
			_ = sleep(s.closing, time.Second)
			for s.closing.Err() == nil {
				if lost, err = s.announce(s.prefix+key, ttl); err == nil {
					break
				}
				_ = sleep(s.closing, time.Second)
			}
		}
	}()
	return nil
}

// announce writes key under a new lease and returns a channel closed once the lease is lost.
func (s *Store) announce(full string, ttl time.Duration) (<-chan struct{}, error) {
	ctx, cancel := context.WithTimeout(s.closing, s.budget)
	defer cancel()
	lease, err := s.cli.Grant(ctx, int64((ttl+time.Second-1)/time.Second))
	if err != nil {
		return nil, err
	}
	if _, err := s.cli.Put(ctx, full, "", clientv3.WithLease(lease.ID)); err != nil {
		return nil, err
	}
	alive, err := s.cli.KeepAlive(s.closing, lease.ID)
	if err != nil {
		return nil, err
	}
	lost := make(chan struct{})
	go func() {
		for range alive {
		}
		close(lost)
	}()
	return lost, nil
}

func (s *Store) watch(full string, next int64, fn func(key string)) {
	for s.closing.Err() == nil {
		// WithRequireLeader ends the watch when its member loses the cluster, so it moves on to
		// one that has it instead of staying silent.
		ctx := clientv3.WithRequireLeader(s.closing)
		for resp := range s.cli.Watch(ctx, full, clientv3.WithPrefix(), clientv3.WithRev(next)) {
			if resp.CompactRevision != 0 {
				fn("")
				next = resp.CompactRevision
				continue
			}
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				fn(strings.TrimPrefix(string(ev.Kv.Key), s.prefix))
				next = ev.Kv.ModRevision + 1
			}
		}
		_ = sleep(s.closing, 100*time.Millisecond)
	}
}

// View runs fn on one linearizable snapshot.
func (s *Store) View(fn func(storage.Txn) error) error {
	t := s.newTxn(context.Background(), false)
	if err := fn(t); err != nil {
		return err
	}
	return t.failure
}

// Update runs fn and commits its writes in one etcd transaction (see the package comment). Like
// kv, it gives up once conflicts have kept it from committing for its budget; each read and the
// commit have the budget of their own, so a slow but healthy cluster is not mistaken for a lost
// one.
func (s *Store) Update(ctx context.Context, fn func(storage.Txn) error) error {
	deadline := time.Now().Add(s.budget)
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

func (s *Store) tryUpdate(ctx context.Context, fn func(storage.Txn) error) (conflicted bool, err error) {
	t := s.newTxn(ctx, true)
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
	ctx, cancel := context.WithTimeout(ctx, s.budget)
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(t.compares()...).Then(t.ops()...).Commit()
	if err != nil {
		// The Txn may have reached a quorum before the answer was lost.
		return false, fmt.Errorf("%w: etcd commit (it may or may not have applied): %w", storage.ErrLocked, s.describe(err))
	}
	return !resp.Succeeded, nil
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
	rev      int64            // the snapshot's revision; 0 until the first read fixes it
	read     map[string]int64 // full key → ModRevision at rev (0: missing)
	ranges   []string         // full-key prefixes scanned
	writes   map[string]*[]byte
	// failure is the first failed read: fn may swallow or wrap the error, the outcome may not.
	failure error
}

func (s *Store) newTxn(ctx context.Context, writable bool) *txn {
	return &txn{s: s, ctx: ctx, writable: writable, read: map[string]int64{}, writes: map[string]*[]byte{}}
}

// get reads at the snapshot's revision, fixing it at the first read.
func (t *txn) get(key string, opts ...clientv3.OpOption) ([]*mvccpb.KeyValue, error) {
	if t.failure != nil {
		return nil, t.failure
	}
	if t.rev != 0 {
		opts = append(opts, clientv3.WithRev(t.rev))
	}
	ctx, cancel := context.WithTimeout(t.ctx, t.s.budget)
	defer cancel()
	resp, err := t.s.cli.Get(ctx, key, opts...)
	if err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) {
			t.failure = errStale
		} else {
			t.failure = fmt.Errorf("%w: etcd read: %w", storage.ErrLocked, t.s.describe(err))
		}
		return nil, t.failure
	}
	if t.rev == 0 {
		t.rev = resp.Header.Revision
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
	kvs, err := t.get(full)
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
	kvs, err := t.get(full, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
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
