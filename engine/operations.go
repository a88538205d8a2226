package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The stack's use cases, every one in the same shape: observe what lies outside the store
// (observe.go), then applyStep runs the operation's pure step (claims.go, drain.go) over the
// stack's record in one transaction and commits what it returns (commit.go).

// Claim adds a holder to the stack and leases it a port family (§4). proposed, when given, chooses
// the holder's checkout path and pid (0: none) instead of the caller's working directory and
// session; its other fields are derived.
func (e *Engine) Claim(ctx context.Context, c Caller, cockpit, stack, name string, proposed *Holder) error {
	_, err := e.ClaimObserved(ctx, c, cockpit, stack, name, proposed)
	return err
}

// Claimed is a holder as the claim that added it recorded it, and the state (HolderState's
// words) that claim observed its process in.
type Claimed struct {
	Holder Holder
	State  string
	// Revision is the stack's revision the claim committed: over a shared store the create
	// shows the holder from it, where a read would cost a round trip to etcd.
	Revision int64
}

// ClaimObserved is Claim, also returning the holder it added and the state it just observed it
// in, so the create that made the holder shows it without probing its process again; nil when
// the claim added no holder (it claimed the stack already).
func (e *Engine) ClaimObserved(ctx context.Context, c Caller, cockpit, stack, name string, proposed *Holder) (*Claimed, error) {
	if err := checkName("holder", name); err != nil {
		return nil, err
	}
	if err := e.proveMachine(); err != nil {
		return nil, err
	}
	nh, err := observeClaimant(c, name, proposed)
	if err != nil {
		return nil, err
	}
	before, err := e.recentStack(cockpit, stack)
	if err != nil {
		return nil, err
	}
	if err := e.refreshLeaseHolders(); err != nil { // before any lock: it reads the store
		return nil, err
	}
	id := holderID(name)
	in := claimInput{holder: nh, dead: e.deadHolders(before.Value.Holders, id, nh),
		uidLeaseLimit: e.leaseBound.Of(nh.UID), groups: func() []uint32 { return callerGroups(c) }}
	var added *Claimed // of the step's last run, the one committed
	err = e.applyStep(ctx, c, cockpit, stack, func(r Record, reads stepReads, fx stepEffects, now time.Time) (Value, error) {
		added = nil
		if e.shared {
			// A run after a conflict: the commit it conflicted with (another daemon's lease, its
			// index entry perhaps deleted since) is what leases hold now.
			if err := e.refreshLeaseHolders(); err != nil {
				return r.Value, err
			}
		}
		v, err := claimHolder(r, in, reads, fx, now)
		if _, held := r.Value.holderByID(id); err == nil && !held {
			if h, ok := v.holderByID(id); ok {
				added = &Claimed{Holder: h, State: observedState(h), Revision: r.Revision + 1} // r.next
			}
		}
		return v, err
	})
	if rf := (*Refusal)(nil); errors.As(err, &rf) && rf.Code == PortLeaseExhausted && strings.HasSuffix(rf.Message, fullCockpit) {
		return nil, e.nameFullCockpit(cockpit, stack, rf)
	}
	if err != nil {
		return nil, err
	}
	return added, nil
}

// nameFullCockpit adds to the refusal of a lease past the cockpit's count the stacks whose
// leases fill it, which of them have only dead holders (observed now, after the refusal), and
// what frees one: a claim of such a stack takes it over, releasing its dead holders.
func (e *Engine) nameFullCockpit(cockpit, stack string, rf *Refusal) error {
	stacks, err := e.Stacks(cockpit)
	if err != nil {
		return rf
	}
	var held, dead []string
	for _, s := range stacks {
		r, err := e.Stack(cockpit, s)
		if err != nil || s == stack || !r.Value.Lease.Active() {
			continue
		}
		live := false // a holder not known dead (untracked, another machine's) keeps the stack
		for _, h := range r.Value.Holders {
			live = live || e.HolderState(h) != "dead"
		}
		if live {
			held = append(held, s)
		} else {
			dead = append(dead, s)
		}
	}
	named := *rf
	named.Message += fmt.Sprintf(": held by %s; with only dead holders: %s", stackList(held), stackList(dead))
	if len(dead) > 0 {
		named.Fix = fmt.Sprintf("claim %s/stacks/%s instead (a claim takes over a stack whose holders are all dead), or drain it to free its family; or raise the config's count after checking host capacity (a new [ports]: each running stack refuses its next claim or touch until drained)", cockpit, dead[0])
	}
	return &named
}

// stackList names stacks for a message, "none" for none.
func stackList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// MayWriteHolder refuses, before its content is even parsed, a write to another uid's holder.
func (e *Engine) MayWriteHolder(c Caller, cockpit, stack, name string) error {
	r, err := e.Stack(cockpit, stack)
	if err != nil {
		return err
	}
	if h, ok := r.Value.Holder(name); ok && !c.may(h.UID) {
		return c.denied("holder "+name, h.UID)
	}
	return nil
}

// SetHolder applies a write of text (`pid=<n>|none checkout=<absolute path>`) to a holder file.
// createdHere says the write comes through the open that created the holder, the only one that
// may still choose its checkout.
func (e *Engine) SetHolder(ctx context.Context, c Caller, cockpit, stack, name, text string, createdHere bool) error {
	w, err := parseHolderWrite(name, text)
	if err != nil {
		return err
	}
	if err := e.proveMachine(); err != nil {
		return err
	}
	w.createdHere = createdHere
	if w.setsPID && w.PID != 0 {
		if err := mayName(c, name, w.PID); err != nil {
			return err
		}
		if w.ProcessStart, err = processOf(w.PID); err != nil {
			return err
		}
	}
	return e.applyStep(ctx, c, cockpit, stack, func(r Record, _ stepReads, _ stepEffects, _ time.Time) (Value, error) {
		return setHolder(r, c, w)
	})
}

// Rebind binds an existing holder to the caller's session, as a claim binds a new one: what
// `touch` of a holder means, so a holder whose session died is live again once its owner touches
// it from a new one (a Makefile's claim re-run every time). Like any claim (the seeds' session
// start runs releaseDeadSessionHolders first), it releases the other holders proven dead.
func (e *Engine) Rebind(ctx context.Context, c Caller, cockpit, stack, name string) error {
	nh, err := defaultHolder(c, name)
	if err != nil {
		return err
	}
	if err := e.proveMachine(); err != nil {
		return err
	}
	var dead []Holder
	if r, err := e.Stack(cockpit, stack); err == nil {
		if dead = e.deadHolders(r.Value.Holders, holderID(name), nh); len(dead) == 0 {
			// Most touches change nothing (a Makefile's claim target touches on every run): the
			// current record answers those without a transaction. Anything else, refusals
			// included, is decided in one.
			if m, err := e.cockpitMeta(cockpit); err == nil {
				if _, err := rebindHolder(r, c, nh, m); errors.Is(err, errUnchanged) {
					return nil
				}
			}
		}
	}
	return e.applyStep(ctx, c, cockpit, stack, func(r Record, reads stepReads, _ stepEffects, now time.Time) (Value, error) {
		m, err := reads.cockpit()
		if err != nil {
			return r.Value, err
		}
		v, err := rebindHolder(r, c, nh, m)
		if err != nil && !errors.Is(err, errUnchanged) {
			return r.Value, err
		}
		if err != nil {
			v = r.Value
		}
		rv, released := releaseDead(v, dead, nil, now)
		if len(released) == 0 {
			return v, err
		}
		reads.releasedDead(released)
		return rv, nil
	})
}

// Release removes a holder (§4): its owner, the stack's creator or its cockpit's owner may,
// never while a drain is reserved, never the last one.
func (e *Engine) Release(ctx context.Context, c Caller, cockpit, stack, name string) error {
	return e.applyStep(ctx, c, cockpit, stack, func(r Record, reads stepReads, _ stepEffects, _ time.Time) (Value, error) {
		return releaseOwn(r, c, name, reads)
	})
}

// ReserveDrain applies a drain/request write. openedAt is the stack's revision when the file was
// opened: the expected revision unless the request names one.
func (e *Engine) ReserveDrain(ctx context.Context, c Caller, cockpit, stack string, req DrainRequest, openedAt int64) error {
	before, err := e.Stack(cockpit, stack)
	if err != nil {
		return err
	}
	expected := openedAt
	if req.Revision != nil {
		expected = *req.Revision
	}
	var dead []Holder
	if before.Value.Drain == nil {
		// The requester is never probed.
		except := req.requesterID()
		if except == "" && len(before.Value.Holders) == 1 {
			except = before.Value.Holders[0].HolderID
		}
		dead = e.deadHolders(before.Value.Holders, except, Holder{})
	}
	in := reserveInput{request: req, caller: c, expected: expected, dead: dead, mine: callerProcesses(c),
		generation: randomHex(), reservationID: randomHex(), groups: func() []uint32 { return callerGroups(c) }}
	if _, held := before.Value.Holder(req.Holder); req.Holder != "" && !held && len(dead) > 0 {
		nh, err := observeClaimant(c, req.Holder, nil)
		if err != nil {
			return err
		}
		in.successor = &nh
	}
	return e.applyStep(ctx, c, cockpit, stack, func(r Record, reads stepReads, _ stepEffects, now time.Time) (Value, error) {
		return reserveDrain(r, in, reads, now)
	})
}

// CancelDrain applies an unlink of drain/request.
func (e *Engine) CancelDrain(ctx context.Context, c Caller, cockpit, stack string) error {
	return e.applyStep(ctx, c, cockpit, stack, func(r Record, reads stepReads, _ stepEffects, _ time.Time) (Value, error) {
		return cancelDrain(r, c, reads)
	})
}

// StartAttempt applies `start [pid=<n>|none]` to drain/attempt: executorPID -1 names the writer,
// 0 none.
func (e *Engine) StartAttempt(ctx context.Context, c Caller, cockpit, stack string, executorPID int) error {
	if executorPID < 0 {
		if c.PID <= 0 {
			return refuse(StateRecordMalformed, StackID(cockpit, stack), "write start pid=<executor pid> or start pid=none",
				"the writing process could not be resolved to name the executor")
		}
		executorPID = c.PID
	}
	ex := executor{pid: executorPID}
	if ex.pid > 0 {
		var err error
		if ex.start, err = processOf(ex.pid); err != nil {
			return err
		}
	}
	attemptID := randomHex()
	return e.applyStep(ctx, c, cockpit, stack, func(r Record, reads stepReads, _ stepEffects, now time.Time) (Value, error) {
		return startAttempt(r, c, reads, ex, attemptID, now)
	})
}

// PublishOutcome applies an outcome write to drain/outcome.
func (e *Engine) PublishOutcome(ctx context.Context, c Caller, cockpit, stack string, o Outcome) error {
	return e.applyStep(ctx, c, cockpit, stack, func(r Record, reads stepReads, _ stepEffects, now time.Time) (Value, error) {
		return publishOutcome(r, c, reads, o, now)
	})
}

// Repair applies `terminated` to drain/repair. The executor is observed before the transaction,
// which then applies only to the attempt observed.
func (e *Engine) Repair(ctx context.Context, c Caller, cockpit, stack string) error {
	before, err := e.Stack(cockpit, stack)
	if err != nil {
		return err
	}
	seen := e.observeExecutor(before)
	return e.applyStep(ctx, c, cockpit, stack, func(r Record, reads stepReads, _ stepEffects, now time.Time) (Value, error) {
		return repairAttempt(r, c, reads, seen, now)
	})
}
