package engine

import "context"

// Vanished is what one commit took out of a stack's holders: the names of the holders it released
// (a drain's, the dead ones a claim released, the one a release named). A reader that keeps names
// (the kernel's dentries) learns of them here rather than at its next use of each.
type Vanished struct {
	Cockpit, Stack string
	Holders        []string
}

// OnVanished has fn told, after each of this engine's durable commits that released holders, which
// ones, with the operation's context. fn runs on the committer's goroutine, after the stack's lock
// is released, and must not block. Set it before the first operation.
func (e *Engine) OnVanished(fn func(ctx context.Context, v Vanished)) { e.vanished = fn }

// vanishedHolders are the names of prev's holders next does not have. Both holder lists are sorted
// by id (checkRecord).
func vanishedHolders(prev, next Record) []string {
	var gone []string
	before, after := prev.Value.Holders, next.Value.Holders
	for len(before) > 0 {
		switch {
		case len(after) == 0 || before[0].HolderID < after[0].HolderID:
			gone = append(gone, before[0].Name)
			before = before[1:]
		case after[0].HolderID < before[0].HolderID:
			after = after[1:]
		default:
			before, after = before[1:], after[1:]
		}
	}
	return gone
}

// stagedCommit is what the transaction under way on a stack wrote (see Engine.staged).
type stagedCommit struct {
	record cachedRecord
	// vanished are the holders it released; nil: none, or nobody asked (OnVanished).
	vanished []string
}
