package engine

import (
	"context"
	"errors"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/storage"
)

// CreateCockpit makes a namespace owned by the caller.
func (e *Engine) CreateCockpit(ctx context.Context, c Caller, name string) error {
	if !validCockpitName(name) {
		return refuse(StateRecordMalformed, name, "use 1-128 bytes of [A-Za-z0-9._-], not starting with '.' or '-', and not README or ports",
			"cockpit name %q is invalid", name)
	}
	return e.update(ctx, cockpitKey(name), func(tx storage.Txn, now time.Time) error {
		if _, err := tx.Get(cockpitKey(name)); err == nil {
			return refuse(Exists, cockpitID(name), "", "cockpit %s already exists", name)
		} else if !errors.Is(err, storage.ErrNotFound) {
			return err
		}
		m := cockpitMeta{Name: name, ID: cockpitID(name), UID: c.UID, CreatedAt: stamp(now), UpdatedAt: stamp(now)}
		if err := setJSON(tx, cockpitKey(name), m); err != nil {
			return err
		}
		return appendEvent(tx, name, cockpitLevel, okEvent(c, now, m.Revision))
	})
}

// RemoveCockpit removes a namespace that has no stacks; only its owner (or root) may.
func (e *Engine) RemoveCockpit(ctx context.Context, c Caller, name string) error {
	err := e.update(ctx, cockpitKey(name), func(tx storage.Txn, now time.Time) error {
		m, err := e.loadCockpit(tx, name)
		if err != nil {
			return err
		}
		if !c.may(m.UID) {
			return c.denied("cockpit "+name, m.UID)
		}
		if m.Stacks > 0 {
			return refuse(NotEmpty, m.ID, "remove its stacks first", "cockpit %s still has %d stacks", name, m.Stacks)
		}
		for _, k := range []string{cockpitKey(name), leaseCountKey(name), leasedPortsKey(name)} {
			if err := tx.Delete(k); err != nil {
				return err
			}
		}
		return deleteEvents(tx, name, cockpitLevel)
	})
	if err == nil {
		// Nothing reads a removed cockpit again to drop it from the cache (its config may be
		// 60 KiB): a thousand mkdir, config, rmdir cycles would keep a thousand of them.
		e.cockpits.forget(cockpitKey(name))
		e.records.forget(cockpitKey(name)) // update keeps a generation of every key it commits
	}
	return err
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
	return e.update(ctx, cockpitKey(cockpit), func(tx storage.Txn, now time.Time) error {
		m, err := e.loadCockpit(tx, cockpit)
		if err != nil {
			return err
		}
		// Ownership first: anyone else learns nothing about the document's validity.
		if !c.may(m.UID) {
			return c.denied("the config of cockpit "+cockpit, m.UID)
		}
		cfg, err := portdecl.Parse(text)
		if err != nil {
			return refuse(PortFamilyOutOfRange, m.ID, configFix, "%v", err)
		}
		if m.Config == string(text) {
			return errUnchanged
		}
		m.Config, m.Declared = string(text), &cfg
		m.Revision++
		m.UpdatedAt = stamp(now)
		if err := setJSON(tx, cockpitKey(cockpit), m); err != nil {
			return err
		}
		ok := okEvent(c, now, m.Revision)
		ok.Warning = ephemeralWarning(cfg.Declaration)
		return appendEvent(tx, cockpit, cockpitLevel, ok)
	})
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
	return e.update(ctx, stackKey(cockpit, stack), func(tx storage.Txn, now time.Time) error {
		m, err := e.loadCockpit(tx, cockpit)
		if err != nil {
			return err
		}
		if _, err := tx.Get(stackKey(cockpit, stack)); err == nil {
			return refuse(Exists, StackID(cockpit, stack), "", "stack %s already exists", stack)
		} else if !errors.Is(err, storage.ErrNotFound) {
			return err
		}
		if m.Stacks >= MaxStacks {
			return refuse(StateInventoryLimit, StackID(cockpit, stack), "remove a stack this cockpit no longer needs",
				"cockpit %s already has %d stacks", cockpit, MaxStacks)
		}
		if _, err := saveRecord(tx, cachedRecord{}, newRecord(cockpit, stack, c.UID, c.GID, now)); err != nil {
			return err
		}
		m.Stacks++
		if err := setJSON(tx, cockpitKey(cockpit), m); err != nil {
			return err
		}
		return appendEvent(tx, cockpit, cockpitLevel, okEvent(c, now, 0))
	})
}

// ChmodStack sets the permission bits of a stack's directory (chmod): only its group and other
// write bits change, which say who else may join the stack (mayJoin); only its creator, its
// cockpit's owner or root may change them.
func (e *Engine) ChmodStack(ctx context.Context, c Caller, cockpit, stack string, mode uint32) error {
	return e.update(ctx, stackKey(cockpit, stack), func(tx storage.Txn, now time.Time) error {
		m, err := e.loadCockpit(tx, cockpit)
		if err != nil {
			return err
		}
		r, err := e.readRecord(tx, cockpit, stack)
		if err != nil {
			return err
		}
		if creator := r.creator(m); !c.may(creator) && c.UID != m.UID {
			return c.denied("stack "+cockpit+"/"+stack, creator)
		}
		if mode&^stackModeJoin != StackModeClosed {
			return refuse(Unsupported, r.SubjectID, "chmod g+w or o+w to let others join the stack, g-w or o-w to close it again",
				"a stack's mode is %04o with its group and other write bits as its creator chooses; %04o changes more", StackModeClosed, mode)
		}
		if mode == r.StackMode() {
			return errUnchanged
		}
		if r.Value.Drain != nil {
			// A drain's record stays at the revision its last step committed (the seeds'
			// decodeCoordinationRecord refuses any other), which its next step builds on.
			return refuse(ClaimCoTenant, r.SubjectID, drainReservedFix, "a stack's mode cannot change while a drain is reserved")
		}
		r.Mode = &mode
		return e.commit(tx, c, r, r.Value, now, "")
	})
}

// RemoveStack removes a stack with no holders, no active lease and no drain; only its creator
// (or root) may: removing it deletes its history.
func (e *Engine) RemoveStack(ctx context.Context, c Caller, cockpit, stack string) error {
	err := e.removeStack(ctx, c, cockpit, stack)
	if err == nil {
		// Nothing reads a removed stack's record again to drop it from the cache.
		e.records.forget(stackKey(cockpit, stack))
	}
	return err
}

func (e *Engine) removeStack(ctx context.Context, c Caller, cockpit, stack string) error {
	return e.update(ctx, stackKey(cockpit, stack), func(tx storage.Txn, now time.Time) error {
		m, r, err := e.loadStack(tx, cockpit, stack)
		if err != nil {
			return err
		}
		if owner := r.creator(m); !c.may(owner) {
			return c.denied("stack "+cockpit+"/"+stack, owner)
		}
		if v := r.Value; len(v.Holders) > 0 || v.Lease.Active() || v.Drain != nil {
			return refuse(ClaimCoTenant, r.SubjectID, "drain the stack first (echo down > drain/request, then its attempts)",
				"stack %s still has holders, an active lease or a drain", stack)
		}
		if err := tx.Delete(stackKey(cockpit, stack)); err != nil {
			return err
		}
		if err := tx.Delete(declaredValuesKey(cockpit, stack)); err != nil {
			return err
		}
		if err := deleteEvents(tx, cockpit, stack); err != nil {
			return err
		}
		m.Stacks--
		if err := setJSON(tx, cockpitKey(cockpit), m); err != nil {
			return err
		}
		return appendEvent(tx, cockpit, cockpitLevel, okEvent(c, now, r.Revision))
	})
}
