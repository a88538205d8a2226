package engine

import (
	"fmt"
	"slices"
)

// Authorisation (SPEC §6): who may act on what a uid owns. A cockpit belongs to its creator, a
// holder to the uid that claimed it, a drain to the uid of the holder that reserved it; the
// stack's creator and its cockpit's owner may also remove any of its holders and act on its
// drain, and who may join a stack is its creator's choice (its directory's mode).

// Caller is who asked for an operation and what it was, as an events line names it.
type Caller struct {
	PID  int    // the calling process (never a thread id); 0 when it could not be resolved
	UID  uint32 // the caller's uid
	GID  uint32 // the caller's gid (the kernel's fsgid)
	Op   string // e.g. "create", "write", "unlink", "mkdir"
	Path string // the path below the mountpoint
}

const rootUID = 0

// may reports whether c may act on something owned by uid (§6: the owner, or root).
func (c Caller) may(uid uint32) bool { return c.UID == rootUID || c.UID == uid }

func (c Caller) denied(what string, owner uint32) error {
	return refuse(PermissionDenied, "", fmt.Sprintf("run it as uid %d (or root)", owner), "%s belongs to uid %d, not %d", what, owner, c.UID)
}

// mayActOn is nil when c may act on what uid owns in r's stack (a holder, a drain): uid itself,
// root, the stack's creator or its cockpit's owner, so that nothing another user adds to a
// stack can lock its creator out of it. The cockpit is read only when c is not uid or root.
func (c Caller) mayActOn(r Record, reads stepReads, what string, uid uint32) error {
	if c.may(uid) {
		return nil
	}
	m, err := reads.cockpit()
	if err != nil {
		return err
	}
	creator := r.creator(m)
	if c.UID == creator || c.UID == m.UID {
		return nil
	}
	return refuse(PermissionDenied, "", fmt.Sprintf("run it as uid %d, as the stack's creator (uid %d) or its cockpit's owner (uid %d), or as root", uid, creator, m.UID),
		"%s belongs to uid %d, not %d", what, uid, c.UID)
}

// Stack modes: the permission bits a stack's directory shows. Its creator chooses who else may
// join it (add a holder) by the group and other write bits, as a directory's mode says who may
// create in it; nothing else of the mode changes.
const (
	// StackModeClosed is a new stack's mode: only its creator, its cockpit's owner and root join.
	StackModeClosed uint32 = 0o755
	// stackModeJoin are the bits a chmod of a stack may change: g+w lets the stack's group join,
	// o+w anyone.
	stackModeJoin uint32 = 0o022
)

// StackMode is the stack directory's permission bits: StackModeClosed unless its creator
// changed them.
func (r Record) StackMode() uint32 {
	if r.Mode != nil {
		return *r.Mode
	}
	return StackModeClosed
}

// mayJoin is nil when uid, a member of groups (read only when they decide), may add a holder to r's stack: root, its creator,
// its cockpit's owner, anyone when its mode has o+w, a member of its group when g+w. A stack is
// closed to everyone else by default, so no user can pin another's stack (its drain refused
// while the pin stands) or make it count against them.
func mayJoin(r Record, m cockpitMeta, uid uint32, groups func() []uint32) error {
	creator, mode := r.creator(m), r.StackMode()
	switch {
	case uid == rootUID, uid == creator, uid == m.UID, mode&0o002 != 0:
		return nil
	case mode&0o020 != 0 && r.GID != nil && groups != nil && slices.Contains(groups(), *r.GID):
		return nil
	}
	return refuse(PermissionDenied, r.SubjectID,
		fmt.Sprintf("claim a stack of your own (mkdir stacks/<name>), or ask uid %d to open this one: chmod o+w (anyone) or chmod g+w (its group) on the stack's directory", creator),
		"stack %s/%s is uid %d's and closed to uid %d (mode %04o)", r.Cockpit, r.Stack, creator, uid, mode)
}

// StackOwner is the uid a stack's files show as their owner (§6): the uid that may act on its
// drain now. That is the drain's holder's while one is reserved, else the sole holder's (the only
// one who may reserve a drain), else the cockpit's owner; ok is false when the cockpit cannot be
// read.
func (e *Engine) StackOwner(r Record) (uid uint32, ok bool) {
	switch {
	case r.Value.Drain != nil:
		return r.Value.Drain.UID, true
	case len(r.Value.Holders) == 1:
		return r.Value.Holders[0].UID, true
	}
	info, err := e.Cockpit(r.Cockpit)
	return info.UID, err == nil
}

// StackCreator is the uid that made the stack, who (with root) may remove it; for a record kept
// from before creators were recorded, its cockpit's owner. ok is false when the cockpit cannot
// be read.
func (e *Engine) StackCreator(r Record) (uid uint32, ok bool) {
	info, err := e.Cockpit(r.Cockpit)
	if err != nil {
		return 0, false
	}
	return r.creator(cockpitMeta{UID: info.UID}), true
}
