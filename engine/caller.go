package engine

import "fmt"

// Authorisation (SPEC §6): who may act on what a uid owns. A cockpit belongs to its creator, a
// holder to the uid that claimed it, a drain to the uid of the holder that reserved it.

// Caller is who asked for an operation and what it was, as an events line names it.
type Caller struct {
	PID  int    // the calling process (never a thread id); 0 when it could not be resolved
	UID  uint32 // the caller's uid
	Op   string // e.g. "create", "write", "unlink", "mkdir"
	Path string // the path below the mountpoint
}

const rootUID = 0

// may reports whether c may act on something owned by uid (§6: the owner, or root).
func (c Caller) may(uid uint32) bool { return c.UID == rootUID || c.UID == uid }

func (c Caller) denied(what string, owner uint32) error {
	return refuse(PermissionDenied, "", fmt.Sprintf("run it as uid %d (or root)", owner), "%s belongs to uid %d, not %d", what, owner, c.UID)
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
