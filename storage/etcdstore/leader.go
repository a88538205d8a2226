package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// A request a follower answers costs a hop among the members more than one the leader answers:
// a linearizable read at a follower asks the leader for its commit index first, and a Txn sent to
// a follower is forwarded to the leader and answered once the follower has learned that it
// committed. The client spreads requests over every endpoint, so two in three of an operation's
// requests to a three-member cluster paid that hop (a claim's lookup and commit over loopback:
// ≈ 0.1 ms and 0.2 ms of each). So the requests on an operation's path, the read that proves the
// cache current and the commit (and a refusal's confirmation), go to the leader's endpoint over a
// connection of their own while the store knows which one it is; everything else (the watch,
// leases, a commit's settling, reads at a revision) goes over the client of every endpoint.
//
// Knowing the leader costs no request on an operation's path: every answer carries the raft term,
// which grows whenever leadership may have moved, and a term past the one the leader was found in
// has the store look for it again, in the background, asking each endpoint's member for its
// status. Until then requests keep going to the old leader, which still answers (as a follower),
// or, once its connection is lost, to every endpoint again; once the new leader is found, the
// requests under way over the old connection still get their answers there before it closes
// (retire). A request under way when the leader's
// connection is lost ends at once: a read is sent again over the client of every endpoint, a
// commit is settled like any commit whose answer was lost (outcome.go).

// leader is the connection to the member that was the leader in term.
type leader struct {
	cli      *clientv3.Client
	endpoint string
	term     atomic.Uint64 // raised when the same member is found leading in a later term
	// lost ends when the connection leaves the ready state (its member stopped or went away):
	// the requests under way over it end, and the store stops using it.
	lost context.Context
	drop context.CancelFunc

	mu      sync.Mutex
	users   int  // requests under way over cli
	retired bool // a newer leader was found: cli closes once users is 0
}

// errLeaderLost is a request ended by its connection to the leader being lost: Unavailable, as
// gRPC says of a connection that broke, so a commit's settling sends it again (transient).
var errLeaderLost = status.Error(codes.Unavailable, "etcd: the connection to the leader was lost")

// leading is the connection to the leader, or nil while the store knows of none.
func (s *Store) leading() *leader { return s.lead.Load() }

// steer looks for the leader again, in the background, when an answer's term is past the one the
// connection to the leader was made in, or when there is none: one search at a time, at most one
// a second (a cluster amid an election, or whose members cannot say, costs next to nothing).
func (s *Store) steer(term uint64) {
	if len(s.cfg.Endpoints) < 2 {
		return // one endpoint: every request goes there anyway
	}
	if l := s.leading(); l != nil && term <= l.term.Load() {
		return
	}
	s.steering.Lock()
	defer s.steering.Unlock()
	if s.seeking || s.closing.Err() != nil || time.Since(s.sought) < time.Second {
		return
	}
	s.seeking = true
	go func() {
		s.seek()
		s.steering.Lock()
		s.seeking, s.sought = false, time.Now()
		s.steering.Unlock()
	}()
}

// seek asks each endpoint's member for its status and connects to the one that is the leader.
func (s *Store) seek() {
	var (
		mu       sync.Mutex
		found    string
		term     uint64
		answered sync.WaitGroup
	)
	for _, endpoint := range s.cfg.Endpoints {
		answered.Add(1)
		go func() {
			defer answered.Done()
			ctx, cancel := context.WithTimeout(s.closing, s.budget)
			defer cancel()
			st, err := s.cli.Status(ctx, endpoint)
			if err != nil || !leads(st) {
				return
			}
			mu.Lock()
			if st.RaftTerm >= term {
				found, term = endpoint, st.RaftTerm
			}
			mu.Unlock()
		}()
	}
	answered.Wait()
	s.pin(found, term)
}

// pin sends operations to endpoint, found leading in term, from now on.
func (s *Store) pin(found string, term uint64) {
	old := s.leading()
	if found == "" || len(s.cfg.Endpoints) < 2 {
		return
	}
	if old != nil && old.endpoint == found && old.lost.Err() == nil {
		old.term.Store(term)
		return
	}
	l, err := s.connect(found, term)
	if err != nil {
		return
	}
	if !s.lead.CompareAndSwap(old, l) || s.closing.Err() != nil {
		l.close()
		return
	}
	if old != nil {
		old.retire()
	}
}

// leads says whether the member that answered st is its cluster's leader.
func leads(st *clientv3.StatusResponse) bool {
	return st.Header != nil && st.Leader != 0 && st.Leader == st.Header.MemberId
}

// connect opens a connection to endpoint alone, the leader in term, ready for requests.
func (s *Store) connect(endpoint string, term uint64) (*leader, error) {
	cfg := s.cfg
	cfg.Endpoints = []string{endpoint}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(s.closing, s.budget)
	defer cancel()
	// Status dials a connection of its own: a read over the client's makes it ready.
	if _, err := cli.Get(ctx, s.prefix, clientv3.WithCountOnly(), clientv3.WithSerializable()); err != nil {
		cli.Close()
		return nil, err
	}
	conn := cli.ActiveConnection()
	if conn.GetState() != connectivity.Ready {
		cli.Close()
		return nil, errors.New("etcd: the leader's connection is not ready")
	}
	l := &leader{cli: cli, endpoint: endpoint}
	l.term.Store(term)
	l.lost, l.drop = context.WithCancel(s.closing)
	go func() {
		conn.WaitForStateChange(l.lost, connectivity.Ready)
		l.drop()
		if s.lead.CompareAndSwap(l, nil) {
			l.close()
		}
	}()
	return l, nil
}

func (l *leader) close() {
	l.drop()
	l.cli.Close()
}

// use takes l for one request, unless l was retired; done gives it back.
func (l *leader) use() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.retired {
		return false
	}
	l.users++
	return true
}

func (l *leader) done() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.users--; l.retired && l.users == 0 {
		l.close()
	}
}

// retire closes l once the requests under way over it have their answers. The member still
// answers, as a follower: closing at once would end a commit under way with its outcome unknown,
// and a commit with no key it read as present (a blind write) cannot be settled (outcome.go).
func (l *leader) retire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.retired = true; l.users == 0 {
		l.close()
	}
}

// viaLeader sends a request that may be sent again (a read) over the connection to the leader
// when there is one, and over the client of every endpoint when there is none or the connection
// was lost while the request was under way: lost as the store saw it, or as the request did (an
// EOF, Unavailable, can come before the connection's state changes). Over that client it is sent
// again while an endpoint's connection fails (Unavailable) and ctx lasts: the client sends a Txn
// once, to whichever endpoint it picks, and a stopped member's EOF says nothing of the others.
func viaLeader[T any](s *Store, ctx context.Context, send func(context.Context, clientv3.KV) (T, error)) (T, error) {
	if l := s.leading(); l != nil {
		resp, err := sendVia(s, l, ctx, send)
		if err == nil || l.lost.Err() == nil && !transient(err) {
			return resp, err
		}
	}
	for {
		resp, err := send(ctx, s.cli)
		if err == nil || !transient(err) {
			return resp, err
		}
		if sleep(ctx, resendAfter) != nil {
			return resp, fmt.Errorf("%w; the last answer: %w", ctx.Err(), err)
		}
	}
}

// resendAfter is how long a read whose endpoint failed waits before it is sent again.
const resendAfter = 20 * time.Millisecond

// sendVia sends over l, ending the request with errLeaderLost should l's connection be lost.
// A request l leaves unanswered (its member cut off from the others, or from this machine, while
// the connection stays up) stops the store sending to l: the next requests go over the client of
// every endpoint until the store finds the leader again.
func sendVia[T any](s *Store, l *leader, ctx context.Context, send func(context.Context, clientv3.KV) (T, error)) (T, error) {
	if !l.use() {
		return send(ctx, s.cli) // retired since it was loaded
	}
	defer l.done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.lost, cancel)()
	resp, err := send(ctx, l.cli)
	switch {
	case err == nil:
	case l.lost.Err() != nil:
		err = errLeaderLost
	case unanswered(err):
		s.forsake(l)
	}
	return resp, err
}

// unanswered says whether err is a request's deadline passing or its connection failing, not an
// answer of etcd's.
func unanswered(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch status.Code(err) {
	case codes.DeadlineExceeded, codes.Unavailable:
		return true
	}
	return false
}

// forsake stops sending to l. The next answer over the client of every endpoint has the store
// look for the leader (steer); looking at once would mostly find an election under way.
func (s *Store) forsake(l *leader) {
	if s.lead.CompareAndSwap(l, nil) {
		l.close()
	}
}
