package engine

import "time"

// The holder list's transitions, pure functions of a value, which the claim and drain steps
// share.

// addHolder adds h unless a holder of that name already claims the stack (changed = false); one of
// that name from another checkout is refused, since a checkout is part of a holder's identity.
func addHolder(v Value, h Holder, now time.Time) (Value, bool, error) {
	if existing, ok := v.Holder(h.Name); ok {
		if !existing.mayBeFrom(h.CheckoutPath) {
			return v, false, refuse(StateRecordMalformed, holderID(h.Name), "use another holder name for another checkout",
				"holder %s already claims this stack from %s", h.Name, Printable(existing.CheckoutPath))
		}
		return v, false, nil
	}
	if len(v.Holders) >= maxHolders {
		return v, false, refuse(ClaimHolderLimit, holderID(h.Name), "release a holder first",
			"the stack already has %d holders", maxHolders)
	}
	holders := append(append(make([]Holder, 0, len(v.Holders)+1), v.Holders...), h.claimed(now))
	sortHolders(holders)
	v.Holders = holders
	if v.LastReleasedHolder != nil && *v.LastReleasedHolder == holderID(h.Name) {
		v.LastReleasedHolder = nil
	}
	return v, true, nil
}

// releaseHolder is a holder's own release (the seeds' releaseClaim): never while a drain is
// reserved, never the last holder.
func releaseHolder(v Value, name string) (Value, error) {
	id := holderID(name)
	if v.Drain != nil {
		return v, refuse(ClaimCoTenant, id, "wait for the drain to finish or cancel it (rm drain/request)",
			"claim release is blocked while the stack has a reserved drain")
	}
	if _, ok := v.Holder(name); !ok {
		return v, refuse(NotFound, id, "", "holder %s does not claim this stack", name)
	}
	kept := v.withoutHolders(map[string]bool{id: true})
	if len(kept) == 0 {
		return v, refuse(ClaimCoTenant, id, "reserve and complete a drain (echo sleep > drain/request) instead",
			"the final holder must reserve and complete a drain before releasing the stack")
	}
	v.Holders = kept
	v.LastReleasedHolder = &id
	return v, nil
}

// releaseDead drops the holders observed dead that are still recorded exactly as observed (same
// claim, pid and start). When none would remain, the successor takes the stack over in the same
// value: the stack is still running. Nothing is released while a drain is reserved.
func releaseDead(v Value, dead []Holder, successor *Holder, now time.Time) (Value, []Holder) {
	if v.Drain != nil || !v.Lease.Active() || len(dead) == 0 {
		return v, nil
	}
	gone := map[string]bool{}
	var released []Holder
	for _, d := range dead {
		for _, h := range v.Holders {
			if h.HolderID == d.HolderID && h.ClaimedAt == d.ClaimedAt && h.PID == d.PID && h.ProcessStart == d.ProcessStart {
				gone[h.HolderID] = true
				released = append(released, h)
			}
		}
	}
	if len(released) == 0 {
		return v, nil
	}
	v.Holders = v.withoutHolders(gone)
	last := released[len(released)-1].HolderID
	v.LastReleasedHolder = &last
	if len(v.Holders) == 0 && successor != nil {
		v, _, _ = addHolder(v, *successor, now)
	}
	return v, released
}
