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
