package engine

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
)

// Claims and leases: the pure steps of a claim, a holder write and a release, beside the drain
// steps in drain.go. Use cases (operations.go) observe processes first; applyStep (commit.go)
// runs the step in the stack's transaction and commits what it returns.

// drainReservedFix is how a holder change refused by a reserved drain is resolved.
const drainReservedFix = "wait for the drain to finish (cat wait) or cancel an unstarted one (rm drain/request)"

// UIDBound is how many of something one uid may hold on this daemon (active leases, cockpits,
// stacks, reads waiting in wait files), so that one user cannot take or fill what every user
// shares: 0 is no bound. Root and the uids given as unbounded are held to none.
type UIDBound struct {
	perUID    int
	unbounded map[uint32]bool
}

// NewUIDBound bounds each uid but root and the unbounded ones to perUID (0: no bound).
func NewUIDBound(perUID int, unbounded []uint32) UIDBound {
	b := UIDBound{perUID: perUID, unbounded: map[uint32]bool{}}
	for _, uid := range unbounded {
		b.unbounded[uid] = true
	}
	return b
}

// Of is uid's bound (0: none).
func (b UIDBound) Of(uid uint32) int {
	if uid == rootUID || b.unbounded[uid] {
		return 0
	}
	return b.perUID
}

// BoundLeases lets each uid but root and those listed hold at most perUID active leases (0: no
// bound). A lease counts against the uid that holds it now (see chargeLease) until it is
// released. Call it before the engine serves.
func (e *Engine) BoundLeases(perUID int, unbounded ...uint32) {
	e.leaseBound = NewUIDBound(perUID, unbounded)
}

// claimInput is a claim as observed before its transaction: the holder proposed and the holders
// proven dead.
type claimInput struct {
	holder Holder // as proposed (see Holder.claimed)
	dead   []Holder
	// uidLeaseLimit bounds the active leases the claimant's uid may hold (0: no bound).
	uidLeaseLimit int
	// groups are the claimant's groups, read from its process when a stack open to its group
	// asks (mayJoin).
	groups func() []uint32
}

// claimHolder adds in.holder to the stack and leases the stack a port family if it has none (§4).
// Holders observed dead are released first; when none would remain, the claimant takes the stack
// over. Choosing a family, it asks fx for a listener probe and holds (see leaseFamily); a lease its
// holders kept is not probed for listeners: they are the stack's own.
func claimHolder(r Record, in claimInput, reads stepReads, fx stepEffects, now time.Time) (Value, error) {
	m, err := reads.cockpit()
	if err != nil {
		return r.Value, err
	}
	if _, held := r.Value.Holder(in.holder.Name); !held {
		// Who may join comes before anything else of the claim (§6).
		if err := mayJoin(r, m, in.holder.UID, in.groups); err != nil {
			return r.Value, err
		}
	}
	if r.Value.Drain != nil {
		return r.Value, refuse(ClaimCoTenant, r.SubjectID, drainReservedFix, "claims are refused while a drain is reserved on the stack")
	}
	cfg, ok := m.config()
	if !ok {
		return r.Value, refuse(PortFamilyOutOfRange, m.ID, fmt.Sprintf("write %s/config first", r.Cockpit), "cockpit %s has no port declaration", r.Cockpit)
	}
	retained := len(r.Value.Holders) > 0 && r.Value.Lease.Active()
	_, held := r.Value.Holder(in.holder.Name)
	v, released := releaseDead(r.Value, in.dead, &in.holder, now)
	reads.releasedDead(released)
	v, added, err := addHolder(v, in.holder, now)
	if err != nil {
		return r.Value, err
	}
	if held {
		// The seeds' claim by a holder the stack has already changes nothing, but only under the
		// declaration its lease was taken with.
		if err := leaseDeclared(r, m, nil); err != nil {
			return r.Value, err
		}
	}
	if !added && len(released) == 0 {
		return r.Value, errUnchanged
	}
	if retained && v.Lease.Active() {
		// Joining counts whether the claimant is added here or takes the stack over from its
		// dead holders inside releaseDead: either way it would hold ports the config no longer
		// declares.
		if !held && !v.Lease.Declaration.Equal(cfg.Declaration) {
			return r.Value, declarationChanged(r.SubjectID)
		}
		if was, is := leaseUID(r.Value.Lease), leaseUID(chargeLease(v).Lease); is != nil && *is == in.holder.UID && (was == nil || *was != *is) {
			// A takeover of dead holders' stack: its lease would count against the claimant now.
			if err := withinLeaseBound(r, in, reads); err != nil {
				return r.Value, err
			}
		}
		return v, nil
	}
	var active int
	if !v.Lease.Active() {
		// Before anything else is read: past the bound, no family of any cockpit is the
		// claimant's to take.
		if err := withinLeaseBound(r, in, reads); err != nil {
			return r.Value, err
		}
		if active, err = reads.activeLeases(); err != nil {
			return r.Value, err
		}
	}
	var leased map[int]bool
	if !v.Lease.Active() && active > 0 && active < cfg.Declaration.Count {
		ports, known, err := reads.leasedPorts()
		if err != nil {
			return r.Value, err
		}
		if known {
			leased = make(map[int]bool, len(ports))
			for _, p := range ports {
				leased[p] = true
			}
		}
	}
	lease, err := leaseFamily(v.Lease, retained, leaseInputs{config: cfg, activeLeases: active, leased: leased, occupiedBy: reads.portOwner, effects: fx, passedPrevious: reads.passedPrevious})
	if err != nil {
		return r.Value, err
	}
	if !v.Lease.Active() {
		uid := in.holder.UID
		lease.UID = &uid
		v.Lease = lease
	}
	return v, nil
}

// withinLeaseBound refuses a claim that would make one more active lease count against a
// claimant already holding as many as its uid may (in.uidLeaseLimit; 0: no bound).
func withinLeaseBound(r Record, in claimInput, reads stepReads) error {
	if in.uidLeaseLimit == 0 {
		return nil
	}
	held, err := reads.leasesOf(in.holder.UID)
	if err != nil {
		return err
	}
	if held >= in.uidLeaseLimit {
		return refuse(PortLeaseUIDLimit, r.SubjectID,
			"drain a stack of yours you no longer need (echo down > drain/request), or ask the daemon's administrator to raise --max-leases-per-uid",
			"uid %d already holds %d active leases, the most one user may hold on this daemon, so that other users find port families free", in.holder.UID, held)
	}
	return nil
}

// leaseUID is the uid an active lease counts against; nil for none (no active lease, or one
// taken before leases were counted).
func leaseUID(l *Lease) *uint32 {
	if !l.Active() {
		return nil
	}
	return l.UID
}

// chargeLease is v with its active lease counting against a uid that holds the stack now: the
// uid it counts against while that uid still holds the stack, else its first holder's (in holder
// order). So a takeover of a dead holder's stack counts against the taker, never against the
// uid that first took it. Every commit passes through it (commit.go). A lease with no holders
// (its drain's end releases both) or counted against no one is left as it is.
func chargeLease(v Value) Value {
	l := v.Lease
	if !l.Active() || l.UID == nil || len(v.Holders) == 0 ||
		slices.ContainsFunc(v.Holders, func(h Holder) bool { return h.UID == *l.UID }) {
		return v
	}
	moved := *l
	uid := v.Holders[0].UID
	moved.UID = &uid
	v.Lease = &moved
	return v
}

// leaseDeclared is ok, or the refusal of a claim by a holder r has already when r's active lease
// was taken under another declaration than m's.
func leaseDeclared(r Record, m cockpitMeta, ok error) error {
	if cfg, declared := m.config(); declared && r.Value.Lease.Active() && !r.Value.Lease.Declaration.Equal(cfg.Declaration) {
		return declarationChanged(r.SubjectID)
	}
	return ok
}

// declarationChanged refuses a claim on a lease taken under another declaration than the
// cockpit's: its ports would not be the family the config now declares.
func declarationChanged(target string) error {
	return refuse(ConfigChangedDuringExecution, target, "drain the stack, then claim again",
		"the stack's lease was taken under another port declaration")
}

// setHolder applies a holder write: only the holder's owner may, never while a drain is reserved,
// and a checkout, part of a holder's identity, only through the open that created it.
func setHolder(r Record, c Caller, w holderWrite) (Value, error) {
	h, ok := r.Value.Holder(w.Name)
	if !ok {
		return r.Value, refuse(NotFound, holderID(w.Name), "", "holder %s does not claim this stack", w.Name)
	}
	if !c.may(h.UID) {
		return r.Value, c.denied("holder "+w.Name, h.UID)
	}
	if r.Value.Drain != nil {
		return r.Value, refuse(ClaimCoTenant, h.HolderID, drainReservedFix, "holders cannot change while a drain is reserved")
	}
	changed := h
	if w.CheckoutPath != "" && checkoutID(w.CheckoutPath) != h.CheckoutID {
		// An unknown checkout (the creator's working directory was not the daemon's to read) is
		// not an identity yet: any later write of the owner's may name it.
		if !w.createdHere && h.CheckoutPath != "" {
			return r.Value, refuse(StateRecordMalformed, h.HolderID, "claim under another holder name for another checkout",
				"holder %s is bound to checkout %s; a checkout is part of a holder's identity", w.Name, Printable(h.CheckoutPath))
		}
		changed.CheckoutPath, changed.CheckoutID = w.CheckoutPath, checkoutID(w.CheckoutPath)
	}
	if w.setsPID {
		changed.PID, changed.ProcessStart = w.PID, w.ProcessStart
	}
	if changed == h {
		return r.Value, errUnchanged
	}
	v := r.Value
	v.Holders = append([]Holder(nil), v.Holders...)
	for i := range v.Holders {
		if v.Holders[i].HolderID == h.HolderID {
			v.Holders[i] = changed
		}
	}
	return v, nil
}

// rebindHolder is a touch of an existing holder: only its owner may, from the holder's own
// checkout (so a checkout whose stack name collides with another's cannot take over its holder),
// never while a drain is reserved. An untracked holder (pid=none) stays as its owner chose:
// nothing ends it, so a touch has nothing to renew.
//
// A touch is the holder claiming again (a Makefile's claim re-run), so like the seeds' claim of an
// existing holder it is refused when the lease was taken under another declaration than m's:
// the ports it holds are not the ones the config now declares.
func rebindHolder(r Record, c Caller, nh Holder, m cockpitMeta) (Value, error) {
	h, ok := r.Value.Holder(nh.Name)
	if !ok {
		return r.Value, refuse(NotFound, holderID(nh.Name), "", "holder %s does not claim this stack", nh.Name)
	}
	if !c.may(h.UID) {
		return r.Value, c.denied("holder "+nh.Name, h.UID)
	}
	if h.PID == 0 {
		return r.Value, leaseDeclared(r, m, errUnchanged)
	}
	if r.Value.Drain != nil {
		return r.Value, refuse(ClaimCoTenant, h.HolderID, drainReservedFix, "holders cannot change while a drain is reserved")
	}
	if !h.mayBeFrom(nh.CheckoutPath) {
		return r.Value, refuse(StateRecordMalformed, h.HolderID, fmt.Sprintf("touch it from %s, or give this checkout a stack of its own", Printable(h.CheckoutPath)),
			"holder %s is bound to checkout %s, not %s", nh.Name, Printable(h.CheckoutPath), Printable(nh.CheckoutPath))
	}
	if err := leaseDeclared(r, m, nil); err != nil {
		return r.Value, err
	}
	if h.PID == nh.PID && h.ProcessStart == nh.ProcessStart {
		return r.Value, errUnchanged
	}
	v := r.Value
	v.Holders = append([]Holder(nil), v.Holders...)
	for i := range v.Holders {
		if v.Holders[i].HolderID == h.HolderID {
			v.Holders[i].PID, v.Holders[i].ProcessStart = nh.PID, nh.ProcessStart
		}
	}
	return v, nil
}

// releaseOwn is an unlink of a holder file: its owner may, and so may the stack's creator and its
// cockpit's owner (§4, §6), so that a holder another user added never locks them out.
func releaseOwn(r Record, c Caller, name string, reads stepReads) (Value, error) {
	if h, ok := r.Value.Holder(name); ok {
		if err := c.mayActOn(r, reads, "holder "+name, h.UID); err != nil {
			return r.Value, err
		}
	}
	return releaseHolder(r.Value, name)
}

// mayBeFrom says whether the holder may be the one of checkout path: the same checkout, or one
// of the two unknown (""), which is no evidence of another checkout (spec §4: an unknown
// working directory is never refused).
func (h Holder) mayBeFrom(path string) bool {
	return h.CheckoutPath == "" || path == "" || h.CheckoutID == checkoutID(path)
}

// claimed is h as a claim records it at now: its identities derived from its name and checkout.
// A claim proposes a Holder with only its name, checkout path, uid and process set.
func (h Holder) claimed(now time.Time) Holder {
	h.HolderID, h.CheckoutID, h.ClaimedAt = holderID(h.Name), checkoutID(h.CheckoutPath), stamp(now)
	return h
}

// leaseInputs is what choosing a family needs: the index of other stacks' ports, read inside the
// claim's transaction, and the effects it asks for (a listener probe and holds).
type leaseInputs struct {
	config       portdecl.Config
	activeLeases int // active leases in the cockpit, other stacks
	// leased are the ports of the cockpit's active leases, given to a new lease when known (nil
	// otherwise): a family with one of them is another stack's of this cockpit, passed without
	// reading its index entry.
	leased     map[int]bool
	occupiedBy func(port int) (string, error) // owner ("cockpit/stack") of port in another active lease, "" if free
	// effects are asked, in candidate order, for each family the snapshot shows free.
	effects stepEffects
	// passedPrevious hears why a stack's previous family (its released lease's) was not leased
	// again, when another one is; nil: no one listens.
	passedPrevious func(why string)
}

// fullCockpit ends the refusal of a lease past the cockpit's count; the claim names the stacks
// that hold the cockpit's families (nameFullCockpit).
const fullCockpit = " concurrent stacks is already active in this cockpit"

// leaseFamily keeps an active lease or leases a free family (the seeds' leasePortFamily): the
// stack's previous one first (the offset of its released lease, kept in the record across drains
// and restarts), so OAuth redirects and tunnels registered on its ports keep working, then the
// first free. retained says holders kept the lease before this claim, so its ports are the
// stack's own listeners and are not probed.
func leaseFamily(current *Lease, retained bool, in leaseInputs) (*Lease, error) {
	decl := in.config.Declaration
	// The candidates' offsets, each family's ports made only when it is reached: a cockpit with a
	// hundred stacks passes a hundred occupied families at each new lease.
	var offsets []int
	if current.Active() {
		if !current.Declaration.Equal(decl) {
			return nil, declarationChanged("")
		}
		if _, ok := decl.FamilyAt(current.Offset); !ok {
			return nil, refuse(ConfigChangedDuringExecution, "", "drain the stack, then claim again",
				"the lease's offset %d is not a candidate of the declaration", current.Offset)
		}
		offsets = []int{current.Offset}
	} else if in.activeLeases >= decl.Count {
		return nil, refuse(PortLeaseExhausted, "", "release an inactive stack, or raise the config's count after checking host capacity (a new [ports]: each running stack refuses its next claim or touch until drained)",
			"maximum %d"+fullCockpit, decl.Count)
	} else if decl.Validate() == nil {
		offsets = make([]int, decl.Count)
		for i := range offsets {
			offsets[i] = i * decl.Step
		}
	}
	previous := -1 // the released lease's offset, tried first when it is a candidate
	if current != nil && current.Released && len(offsets) > 0 {
		if _, ok := decl.FamilyAt(current.Offset); ok {
			previous = current.Offset
			offsets = slices.Insert(slices.DeleteFunc(offsets, func(o int) bool { return o == previous }), 0, previous)
		} else if in.passedPrevious != nil {
			in.passedPrevious(fmt.Sprintf("the stack's previous family (offset %d) is not a candidate of the current declaration", current.Offset))
		}
	}
	// A family's ports, sorted, are the sorted bases plus its offset.
	bases := familyPorts(portdecl.Family{Ports: decl.Bases})
	buf := make([]int, len(bases))
	portsAt := func(offset int) []int {
		for i, base := range bases {
			buf[i] = base + offset
		}
		return buf
	}
	var occupied []occupiedCandidate // spelled out only if no family is free
	sawListener := false
	for _, offset := range offsets {
		ports := portsAt(offset)
		if slices.ContainsFunc(ports, func(p int) bool { return in.leased[p] }) {
			occupied = append(occupied, occupiedCandidate{offset: offset}) // its why only if refused
			continue
		}
		owner, err := firstOwner(ports, in.occupiedBy)
		if err != nil {
			return nil, err
		}
		if owner != "" {
			occupied = append(occupied, occupiedCandidate{offset, "leased by " + owner})
			continue
		}
		family, _ := decl.FamilyAt(offset)
		if !(current.Active() && retained) {
			busy, err := in.effects.probe(ports)
			if err != nil {
				return nil, refuse(PortListenerEvidenceInvalid, joinPorts(ports), "restore access to /proc/net/tcp or loopback and retry",
					"the host listener check could not decide: %v", err)
			}
			if len(busy) > 0 {
				sawListener = true
				occupied = append(occupied, occupiedCandidate{offset, "host listener on " + joinPorts(busy)})
				continue
			}
		}
		if in.effects.hold != nil {
			holder, port, err := in.effects.hold(family.Ports)
			if err != nil {
				return nil, err
			}
			if holder != nil {
				// Another daemon's lease is like another stack's; anything else holding the port is
				// in the way as a listener is.
				sawListener = sawListener || holder.Identity == nil
				occupied = append(occupied, occupiedCandidate{offset, fmt.Sprintf("port %d held by %s", port, holder)})
				continue
			}
		}
		if previous >= 0 && offset != previous && in.passedPrevious != nil {
			why, err := occupied[0].explain(portsAt(previous), in.occupiedBy)
			if err != nil {
				return nil, err
			}
			in.passedPrevious(fmt.Sprintf("the stack's previous family %s is taken (%s)", joinPorts(portsAt(previous)), why))
		}
		return &Lease{
			Offset:      family.Offset,
			Ports:       family.Ports,
			Declaration: decl,
		}, nil
	}
	code := PortLeaseExhausted
	if sawListener {
		code = PortFamilyCollision
	}
	why := make([]string, len(occupied))
	for i, o := range occupied {
		ports := portsAt(o.offset)
		reason, err := o.explain(ports, in.occupiedBy)
		if err != nil {
			return nil, err
		}
		why[i] = joinPorts(ports) + " (" + reason + ")"
	}
	return nil, refuse(code, "", "release an inactive stack, stop the named host listener, or extend the declared candidate range",
		"no complete port family is free; occupied candidates: %s", strings.Join(why, "; "))
}

// occupiedCandidate is a candidate family a claim passed, and why.
type occupiedCandidate struct {
	offset int
	why    string // "" for one passed on the cockpit's leased ports: see explain
}

// explain is why the candidate, of ports, was passed: its why, or the owner the port index
// names for a family passed on the cockpit's leased ports.
func (o occupiedCandidate) explain(ports []int, occupiedBy func(int) (string, error)) (string, error) {
	if o.why != "" {
		return o.why, nil
	}
	owner, err := firstOwner(ports, occupiedBy)
	if err != nil {
		return "", err
	}
	if owner == "" { // the cockpit's leased ports disagree with the index: verify says where
		return "leased in this cockpit", nil
	}
	return "leased by " + owner, nil
}

func familyPorts(f portdecl.Family) []int {
	ports := make([]int, 0, len(f.Ports))
	for _, p := range f.Ports {
		ports = append(ports, p)
	}
	sort.Ints(ports)
	return ports
}

func firstOwner(ports []int, occupiedBy func(int) (string, error)) (string, error) {
	for _, p := range ports {
		owner, err := occupiedBy(p)
		if err != nil || owner != "" {
			return owner, err
		}
	}
	return "", nil
}

func joinPorts(ports []int) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, ",")
}
