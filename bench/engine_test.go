package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/kv"
	"github.com/cockpitfs/cockpitfs/storage"
)

// An engine over a real store on the data disk, driven in-process: the engine and badger without
// FUSE, with untracked holders so no liveness probe runs.

type engineFixture struct {
	db      *kv.DB
	eng     *engine.Engine
	commits *timedCommits
}

// timedCommits is a store that adds up the time its commits take, apart from the transaction's
// own function: badger's commit and the sync that makes it durable. An engine operation's time
// minus that is the engine's own work.
type timedCommits struct {
	*kv.DB
	spent atomic.Int64 // ns
}

func (s *timedCommits) Commit(ctx context.Context, fn func(storage.Txn) error) (func() error, error) {
	var inFn time.Duration
	began := time.Now()
	durable, err := s.DB.Commit(ctx, func(tx storage.Txn) error {
		fnBegan := time.Now()
		defer func() { inFn += time.Since(fnBegan) }()
		return fn(tx)
	})
	s.spent.Add(int64(time.Since(began) - inFn))
	if err != nil {
		return nil, err
	}
	return func() error {
		began := time.Now()
		defer func() { s.spent.Add(int64(time.Since(began))) }()
		return durable()
	}, nil
}

func (s *timedCommits) Update(ctx context.Context, fn func(storage.Txn) error) error {
	durable, err := s.Commit(ctx, fn)
	if err != nil {
		return err
	}
	return durable()
}

var ctx = context.Background()

// caller is the benchmark process as the engine sees a FUSE caller.
func caller(op string) engine.Caller {
	return engine.Caller{PID: os.Getpid(), UID: uint32(os.Getuid()), Op: op, Path: "bench"}
}

func untracked(name string) *engine.Holder {
	return &engine.Holder{CheckoutPath: "/src/" + name}
}

func newEngine(b *testing.B, name string) *engineFixture {
	b.Helper()
	db := newStore(b, name)
	commits := &timedCommits{DB: db}
	return &engineFixture{db: db, eng: engine.New(commits), commits: commits}
}

// newStore opens a fresh store below workDir for the rest of the run.
func newStore(b *testing.B, name string) *kv.DB {
	b.Helper()
	db, err := kv.Open(filepath.Join(workDir, name))
	if err != nil {
		b.Fatal(err)
	}
	cleanups = append(cleanups, func() { db.Close() })
	return db
}

// cockpit creates a cockpit with config(base, step, count).
func (f *engineFixture) cockpit(b *testing.B, name string, base, step, count int) {
	b.Helper()
	if err := f.eng.CreateCockpit(ctx, caller("mkdir"), name); err != nil {
		b.Fatal(err)
	}
	if err := f.eng.SetConfig(ctx, caller("write"), name, []byte(config(base, step, count))); err != nil {
		b.Fatal(err)
	}
}

// heldStack creates a stack claimed by an untracked holder "base", leasing it a family.
func (f *engineFixture) heldStack(b *testing.B, cockpit, stack string) {
	b.Helper()
	if err := f.eng.CreateStack(ctx, caller("mkdir"), cockpit, stack); err != nil {
		b.Fatal(err)
	}
	if err := f.eng.Claim(ctx, caller("create"), cockpit, stack, "base", untracked("base")); err != nil {
		b.Fatal(err)
	}
}

// cycle is one claim and one release of holder on a stack another holder keeps: two commits.
func (f *engineFixture) cycle(cockpit, stack, holder string) error {
	if err := f.eng.Claim(ctx, caller("create"), cockpit, stack, holder, untracked(holder)); err != nil {
		return fmt.Errorf("claim %s/%s/%s: %w", cockpit, stack, holder, err)
	}
	if err := f.eng.Release(ctx, caller("unlink"), cockpit, stack, holder); err != nil {
		return fmt.Errorf("release %s/%s/%s: %w", cockpit, stack, holder, err)
	}
	return nil
}

// drainSleep ends a stack's lease the only way the SPEC allows: a sleep drain by its only holder,
// started and published, which releases the holder and the lease.
func (f *engineFixture) drainSleep(cockpit, stack, holder string) error {
	r, err := f.eng.Stack(cockpit, stack)
	if err != nil {
		return err
	}
	req := engine.DrainRequest{Purpose: "sleep", Holder: holder}
	if err := f.eng.ReserveDrain(ctx, caller("write"), cockpit, stack, req, r.Revision); err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	if err := f.eng.StartAttempt(ctx, caller("write"), cockpit, stack, 0); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if err := f.eng.PublishOutcome(ctx, caller("write"), cockpit, stack, engine.Outcome{Success: true}); err != nil {
		return fmt.Errorf("outcome: %w", err)
	}
	return nil
}
