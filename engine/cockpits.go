package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/storage"
)

// BoundCockpits lets each uid but root and those listed have made at most perUID cockpits that
// exist (0: no bound), so that one user cannot fill the store and the daemon's memory every user
// shares: each cockpit's config may be 64 KiB, which the daemon keeps decoded. Call it before the
// engine serves.
func (e *Engine) BoundCockpits(perUID int, unbounded ...uint32) {
	e.cockpitBound = NewUIDBound(perUID, unbounded)
}

// CountStacks has the engine keep, with each stack it makes or removes, how many stacks each uid
// made (its record's creator), and lets each uid but root and those listed have made at most
// perUID stacks that exist, every cockpit counted (0: no bound). A store never counted (made by an
// earlier release) is counted here, once, from its records; a record without a creator counts
// against no one. Call it before the engine serves.
func (e *Engine) CountStacks(ctx context.Context, perUID int, unbounded ...uint32) error {
	err := e.db.Update(ctx, func(tx storage.Txn) error {
		if counted, err := found(tx, stacksCountedKey); err != nil || counted {
			return err
		}
		made := map[uint32]int{}
		if err := tx.Scan(allStacksPrefix, func(_ string, value []byte) error {
			if r, err := decodeHead(value); err == nil && r.Creator != nil {
				made[*r.Creator]++ // one that does not decode is verify's to report
			}
			return nil
		}); err != nil {
			return err
		}
		for uid, n := range made {
			if err := setJSON(tx, uidStacksKey(uid), n); err != nil {
				return err
			}
		}
		return setJSON(tx, stacksCountedKey, true)
	})
	if err != nil {
		return fmt.Errorf("counting each user's stacks: %w", err)
	}
	e.stackBound, e.stacksCounted = NewUIDBound(perUID, unbounded), true
	return nil
}

// CreateCockpit makes a namespace owned by the caller.
func (e *Engine) CreateCockpit(ctx context.Context, c Caller, name string) error {
	if !ValidCockpitName(name) {
		return refuse(StateRecordMalformed, name, "use "+CockpitNameRule,
			"cockpit name %q is invalid", name)
	}
	err := e.apply(ctx, c, cockpitKey(name), func(tx storage.Txn, now time.Time) (change, error) {
		taken, err := found(tx, cockpitKey(name))
		if err != nil {
			return change{}, err
		}
		made, _, err := readCount(tx, uidCockpitsKey(c.UID))
		if err != nil {
			return change{}, err
		}
		return createCockpit(c, name, taken, made, e.cockpitBound.Of(c.UID), now)
	})
	if err == nil {
		e.cockpits.created(cockpitKey(name))
	}
	return err
}

// createCockpit makes cockpit name for c, whose uid has made made cockpits that exist, of at most
// limit (0: no bound).
func createCockpit(c Caller, name string, taken bool, made, limit int, now time.Time) (change, error) {
	if taken {
		return change{}, refuse(Exists, cockpitID(name), "", "cockpit %s already exists", name)
	}
	if limit > 0 && made >= limit {
		return change{}, refuse(CockpitUIDLimit, cockpitID(name),
			"remove a cockpit of yours you no longer need (rmdir it once its stacks are gone), or ask the daemon's administrator to raise --max-cockpits-per-uid",
			"uid %d already has %d cockpits, the most one user may have on this daemon, so that the store and the daemon's memory stay for everyone", c.UID, made)
	}
	m := cockpitMeta{Name: name, ID: cockpitID(name), UID: c.UID, CreatedAt: stamp(now), UpdatedAt: stamp(now), Counted: true}
	return change{cockpit: name, meta: &m, line: cockpitLevel, revision: m.Revision, counted: 1, owner: c.UID}, nil
}

// found says whether key has a value in tx, read with Get so the transaction conflicts with its
// creation or removal.
func found(tx storage.Txn, key string) (bool, error) {
	_, err := tx.Get(key)
	if errors.Is(err, storage.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// RemoveCockpit removes a namespace that has no stacks; only its owner (or root) may.
func (e *Engine) RemoveCockpit(ctx context.Context, c Caller, name string) error {
	err := e.apply(ctx, c, cockpitKey(name), func(tx storage.Txn, _ time.Time) (change, error) {
		m, err := e.loadCockpit(tx, name)
		if err != nil {
			return change{}, err
		}
		return removeCockpit(c, m)
	})
	if err == nil {
		// Nothing reads a removed cockpit again to drop it from the cache (its config may be
		// 60 KiB): a thousand mkdir, config, rmdir cycles would keep a thousand of them.
		e.cockpits.removed(cockpitKey(name))
		e.records.forget(cockpitKey(name)) // update keeps a generation of every key it commits
	}
	return err
}

func removeCockpit(c Caller, m cockpitMeta) (change, error) {
	if !c.may(m.UID) {
		return change{}, c.denied("cockpit "+m.Name, m.UID)
	}
	if m.Stacks > 0 {
		return change{}, refuse(NotEmpty, m.ID, "remove its stacks first", "cockpit %s still has %d stacks", m.Name, m.Stacks)
	}
	ch := change{cockpit: m.Name, removedCockpit: true}
	if m.Counted {
		ch.counted, ch.owner = -1, m.UID
	}
	return ch, nil
}

// MayWriteConfig refuses c writing the cockpit's config unless it is the cockpit's owner (or
// root): checked when config is opened for writing, before any document is written.
func (e *Engine) MayWriteConfig(c Caller, cockpit string) error {
	info, err := e.Cockpit(cockpit)
	if err != nil {
		return err
	}
	if !c.may(info.UID) {
		return c.denied("the config of cockpit "+cockpit, info.UID)
	}
	return nil
}

// configFix is what a refused config document says to do.
const configFix = "correct the named value and write the whole config again"

// CheckConfigPrefix refuses the beginning of a config document still being written (up to the
// end of a line) when no further line can make it valid, with the refusal SetConfig would give
// the whole document: a writer that reports no close's errno (bash's printf and echo) is told
// at the write that brings the error.
func (e *Engine) CheckConfigPrefix(cockpit string, text []byte) error {
	if err := portdecl.ParsePrefix(text); err != nil {
		return refuse(PortFamilyOutOfRange, cockpitID(cockpit), configFix, "%v", err)
	}
	return nil
}

// SetConfig accepts a port declaration (§3) for the cockpit; only its owner (or root) may.
// Leases keep the declaration they were taken under.
func (e *Engine) SetConfig(ctx context.Context, c Caller, cockpit string, text []byte) error {
	// Observed before the transaction: the document's parse, and the host's ephemeral range it
	// is warned against.
	in := configInput{text: text}
	in.cfg, in.parseErr = portdecl.Parse(text)
	if in.parseErr == nil {
		in.warning = ephemeralWarning(in.cfg.Declaration)
	}
	return e.apply(ctx, c, cockpitKey(cockpit), func(tx storage.Txn, now time.Time) (change, error) {
		m, err := e.loadCockpit(tx, cockpit)
		if err != nil {
			return change{}, err
		}
		return setConfig(c, m, in, now)
	})
}

// configInput is a config document as observed before its transaction.
type configInput struct {
	text     []byte
	cfg      portdecl.Config
	parseErr error
	warning  string // of its candidates in the host's ephemeral range
}

func setConfig(c Caller, m cockpitMeta, in configInput, now time.Time) (change, error) {
	// Ownership first: anyone else learns nothing about the document's validity.
	if !c.may(m.UID) {
		return change{}, c.denied("the config of cockpit "+m.Name, m.UID)
	}
	if in.parseErr != nil {
		return change{}, refuse(PortFamilyOutOfRange, m.ID, configFix, "%v", in.parseErr)
	}
	if m.Config == string(in.text) {
		return change{}, errUnchanged
	}
	cfg := in.cfg
	m.Config, m.Declared = string(in.text), &cfg
	m.Revision++
	m.UpdatedAt = stamp(now)
	return change{cockpit: m.Name, meta: &m, line: cockpitLevel, revision: m.Revision, warning: in.warning}, nil
}

// creator is who made the stack. A record kept from before creators were recorded names none:
// its cockpit's owner stands in, the uid that already owned its files when nobody held it.
func (r Record) creator(m cockpitMeta) uint32 {
	if r.Creator != nil {
		return *r.Creator
	}
	return m.UID
}

// CreateStack makes a stack whose record starts at revision 0: no holders, no lease, no drain.
func (e *Engine) CreateStack(ctx context.Context, c Caller, cockpit, stack string) error {
	if err := checkName("stack", stack); err != nil {
		return err
	}
	return e.apply(ctx, c, stackKey(cockpit, stack), func(tx storage.Txn, now time.Time) (change, error) {
		m, err := e.loadCockpit(tx, cockpit)
		if err != nil {
			return change{}, err
		}
		taken, err := found(tx, stackKey(cockpit, stack))
		if err != nil {
			return change{}, err
		}
		made := -1 // not counted
		if e.stacksCounted {
			if made, _, err = readCount(tx, uidStacksKey(c.UID)); err != nil {
				return change{}, err
			}
		}
		return createStack(c, m, stack, taken, made, e.stackBound.Of(c.UID), now)
	})
}

// createStack makes stack in m for c, whose uid has made made stacks that exist (-1: not
// counted), of at most limit (0: no bound).
func createStack(c Caller, m cockpitMeta, stack string, taken bool, made, limit int, now time.Time) (change, error) {
	if taken {
		return change{}, refuse(Exists, StackID(m.Name, stack), "", "stack %s already exists", stack)
	}
	if m.Stacks >= MaxStacks {
		return change{}, refuse(StateInventoryLimit, StackID(m.Name, stack), "remove a stack this cockpit no longer needs",
			"cockpit %s already has %d stacks", m.Name, MaxStacks)
	}
	if limit > 0 && made >= limit {
		return change{}, refuse(StackUIDLimit, StackID(m.Name, stack),
			"remove a stack of yours you no longer need (rmdir it once idle), or ask the daemon's administrator to raise --max-stacks-per-uid",
			"uid %d already made %d stacks, the most one user may have on this daemon, every cockpit counted, so that the store and the daemon's memory stay for everyone", c.UID, made)
	}
	r := newRecord(m.Name, stack, c.UID, c.GID, now)
	m.Stacks++
	ch := change{cockpit: m.Name, created: &r, meta: &m, line: cockpitLevel, revision: r.Revision}
	if made >= 0 {
		ch.stacks, ch.creator = 1, c.UID
	}
	return ch, nil
}

// ChmodStack sets the permission bits of a stack's directory (chmod): only its group and other
// write bits change, which say who else may join the stack (mayJoin); only its creator, its
// cockpit's owner or root may change them.
func (e *Engine) ChmodStack(ctx context.Context, c Caller, cockpit, stack string, mode uint32) error {
	return e.apply(ctx, c, stackKey(cockpit, stack), func(tx storage.Txn, _ time.Time) (change, error) {
		m, err := e.loadCockpit(tx, cockpit)
		if err != nil {
			return change{}, err
		}
		r, err := e.readRecord(tx, cockpit, stack)
		if err != nil {
			return change{}, err
		}
		return chmodStack(c, m, r, mode)
	})
}

func chmodStack(c Caller, m cockpitMeta, r cachedRecord, mode uint32) (change, error) {
	if creator := r.creator(m); !c.may(creator) && c.UID != m.UID {
		return change{}, c.denied("stack "+m.Name+"/"+r.Stack, creator)
	}
	if mode&^stackModeJoin != StackModeClosed {
		return change{}, refuse(Unsupported, r.SubjectID, "chmod g+w or o+w to let others join the stack, g-w or o-w to close it again",
			"a stack's mode is %04o with its group and other write bits as its creator chooses; %04o changes more", StackModeClosed, mode)
	}
	if mode == r.StackMode() {
		return change{}, errUnchanged
	}
	if r.Value.Drain != nil {
		// A drain's record stays at the revision its last step committed (the seeds'
		// decodeCoordinationRecord refuses any other), which its next step builds on.
		return change{}, refuse(ClaimCoTenant, r.SubjectID, drainReservedFix, "a stack's mode cannot change while a drain is reserved")
	}
	r.Mode = &mode
	return nextRecord(r, r.Value, ""), nil
}

// RemoveStack removes a stack with no holders, no active lease and no drain; only its creator
// (or root) may: removing it deletes its history.
func (e *Engine) RemoveStack(ctx context.Context, c Caller, cockpit, stack string) error {
	err := e.apply(ctx, c, stackKey(cockpit, stack), func(tx storage.Txn, _ time.Time) (change, error) {
		m, r, err := e.loadStack(tx, cockpit, stack)
		if err != nil {
			return change{}, err
		}
		ch, err := removeStack(c, m, stack, r)
		if err == nil && e.stacksCounted && r.Creator != nil {
			ch.stacks, ch.creator = -1, *r.Creator
		}
		return ch, err
	})
	if err == nil {
		// Nothing reads a removed stack's record again to drop it from the cache.
		e.records.forget(stackKey(cockpit, stack))
	}
	return err
}

// removeStack removes an idle stack for its creator, its cockpit's owner or root: the owner too, so
// that no other user can fill the owner's cockpit with the 1024 stacks it holds and leave the
// owner unable to make one (the owner may already drain them: removal takes only what is idle).
func removeStack(c Caller, m cockpitMeta, stack string, r Record) (change, error) {
	if owner := r.creator(m); !c.may(owner) && c.UID != m.UID {
		return change{}, refuse(PermissionDenied, "", fmt.Sprintf("run it as uid %d, as its cockpit's owner (uid %d), or as root", owner, m.UID),
			"stack %s/%s belongs to uid %d, not %d", m.Name, stack, owner, c.UID)
	}
	if v := r.Value; len(v.Holders) > 0 || v.Lease.Active() || v.Drain != nil {
		return change{}, refuse(ClaimCoTenant, r.SubjectID, "drain the stack first (echo down > drain/request, then its attempts)",
			"stack %s still has holders, an active lease or a drain", stack)
	}
	m.Stacks--
	return change{cockpit: m.Name, removedStack: stack, meta: &m, line: cockpitLevel, revision: r.Revision}, nil
}
