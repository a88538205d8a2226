package etcdstore

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cockpitfs/cockpitfs/storage"
)

// resendPause is how long settle waits before sending a commit again after a failure of the
// connection or member it went to, so that the client moves on rather than spins.
const resendPause = 50 * time.Millisecond

// errWatchEnded is the history's watch closing with no answer: the store is closing.
var errWatchEnded = errors.New("etcd watch ended")

// settle finds out what became of t's commit whose answer was lost with the connection or member
// it went to (lost), within ctx, the commit's budget. It returns what the commit's answer would
// have: applied (false, nil), or its compares failed (true, nil). The outcome stays unknown
// (ErrLocked, as before settle) only when etcd does not tell within the budget (no quorum, its
// history compacted), when t has no fence, or in the case below.
//
// A key t read as present is compared on its ModRevision r ≠ 0, which once left never returns
// (revisions only grow; a deleted key's is 0): from its first change on, that compare fails for
// good. The fence is such a key that t also writes. So whichever copy of t applies first moves the
// fence off r, and every other copy's compare fails: the first send and its resends apply at most
// once in all. And the commit that first changed the fence after the snapshot is the only one that
// can be t's: before it t had not applied, since applying changes the fence; after it, t never can.
//
// So settle sends t again, asking, should the compares fail, for every key t read as present.
// Applied: this copy is the only one. Failed, fence changed: etcd's history shows whether the
// commit that first changed it is t's. Failed, fence unchanged: t has not applied; if another
// such key changed t never will, a conflict; else a key read as missing, or a range, failed,
// which can return to how t read it, and t's first send may still be on its way through raft.
func (t *txn) settle(ctx context.Context, lost error) (conflicted bool, err error) {
	fence, ok := t.fence()
	present := t.present()
	gets := make([]clientv3.Op, len(present))
	for i, k := range present {
		gets[i] = clientv3.OpGet(k, clientv3.WithKeysOnly())
	}
	for ok && transient(lost) {
		if err := sleep(ctx, resendPause); err != nil {
			lost = err // the budget ran out: no quorum answered
			break
		}
		resp, err := t.s.cli.Txn(ctx).If(t.compares()...).Then(t.ops()...).Else(gets...).Commit()
		t.s.roundTrips.Add(1)
		if err != nil {
			lost = err
			continue
		}
		if resp.Succeeded {
			return false, nil
		}
		fenceMoved, moved := false, false
		for i, k := range present {
			if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) == 0 || kvs[0].ModRevision != t.read[k] {
				fenceMoved, moved = fenceMoved || k == fence, true
			}
		}
		switch {
		case fenceMoved:
			applied, err := t.firstChangeIsMine(ctx, fence)
			if err != nil {
				return false, unknown(t.s.describe(err))
			}
			return !applied, nil
		case moved:
			return true, nil
		default:
			return false, unknown(fmt.Errorf("its answer was lost (%w), and a key it read as missing, or a range it read, has changed since", lost))
		}
	}
	return false, unknown(t.s.describe(lost))
}

// unknown reports a commit whose outcome etcd did not tell.
func unknown(why error) error {
	return fmt.Errorf("%w: etcd commit (it may or may not have applied): %w", storage.ErrLocked, why)
}

// transient is a failure of the connection or member a request went to (etcd and gRPC say
// Unavailable): another member, or the same one over a new connection, may answer.
func transient(err error) bool {
	var server rpctypes.EtcdError
	if errors.As(err, &server) {
		return server.Code() == codes.Unavailable
	}
	return status.Code(err) == codes.Unavailable
}

// fence returns a key t writes and read as present (see settle), if there is one. A transaction
// that only creates keys, or only deletes keys it did not see, has none.
func (t *txn) fence() (string, bool) {
	for k := range t.writes {
		if t.read[k] != 0 {
			return k, true
		}
	}
	return "", false
}

// present lists the keys t read as present.
func (t *txn) present() []string {
	var keys []string
	for k, rev := range t.read {
		if rev != 0 {
			keys = append(keys, k)
		}
	}
	return keys
}

// firstChangeIsMine reads etcd's history after the snapshot up to the first commit that changed
// fence and reports whether that commit made exactly t's writes. A watch from a past revision
// delivers every change of one revision in one response. A commit by another writer that made
// exactly t's changes is taken for t's: etcd records no author, and the store holds what t's
// commit would have left.
func (t *txn) firstChangeIsMine(ctx context.Context, fence string) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t.s.roundTrips.Add(1)
	for resp := range t.s.cli.Watch(ctx, t.s.prefix, clientv3.WithPrefix(), clientv3.WithRev(t.rev+1)) {
		if err := resp.Err(); err != nil {
			return false, err // compacted: the history is gone
		}
		for _, ev := range resp.Events {
			if string(ev.Kv.Key) == fence {
				return t.made(resp.Events, ev.Kv.ModRevision), nil
			}
		}
	}
	return false, cmp.Or(ctx.Err(), errWatchEnded)
}

// made reports whether the changes events hold at revision rev are exactly t's writes.
func (t *txn) made(events []*clientv3.Event, rev int64) bool {
	changed := map[string]bool{}
	for _, ev := range events {
		if ev.Kv.ModRevision != rev {
			continue
		}
		k := string(ev.Kv.Key)
		v, ok := t.writes[k]
		if !ok || (v == nil) != (ev.Type == mvccpb.DELETE) || v != nil && !bytes.Equal(*v, ev.Kv.Value) {
			return false
		}
		changed[k] = true
	}
	for k, v := range t.writes {
		// Every put leaves an event; a delete only of a key that was there, as one read so was.
		if !changed[k] && (v != nil || t.read[k] != 0) {
			return false
		}
	}
	return true
}
