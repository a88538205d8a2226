package engine

import "context"

// Vanished is what one commit took out of a stack's tree: the holders it released (a drain's, the
// dead ones a claim released, the one a release named) and the ports of the lease it ended. A
// reader that keeps names (the kernel's dentries) learns of them here rather than at its next
// open of each.
type Vanished struct {
	Cockpit, Stack string
	Holders        []string
	Ports          map[string]int // key → port, of the lease that ended
}

// OnVanished has fn told, after each of this engine's durable commits that took names out of a
// stack, what it took, with the operation's context. fn runs on the committer's goroutine, after
// the stack's lock is released, and must not block. Set it before the first operation.
func (e *Engine) OnVanished(fn func(ctx context.Context, v Vanished)) { e.vanished = fn }

// vanishedBetween is what the commit from prev to next takes out of the tree; ok is false when
// nothing. Both holder lists are sorted by id (checkRecord).
func vanishedBetween(prev, next Record) (v Vanished, ok bool) {
	before, after := prev.Value.Holders, next.Value.Holders
	// A step adds at most one holder: one more than before is an addition and nothing gone.
	if len(after) != len(before)+1 {
		for len(before) > 0 {
			switch {
			case len(after) == 0 || before[0].HolderID < after[0].HolderID:
				v.Holders = append(v.Holders, before[0].Name)
				before = before[1:]
			case after[0].HolderID < before[0].HolderID:
				after = after[1:]
			default:
				before, after = before[1:], after[1:]
			}
		}
	}
	if prev.Value.Lease.Active() && !next.Value.Lease.Active() {
		v.Ports = prev.Value.Lease.Ports
	}
	v.Cockpit, v.Stack = prev.Cockpit, prev.Stack
	return v, len(v.Holders) > 0 || len(v.Ports) > 0
}
