package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/listeners"
	"github.com/cockpitfs/cockpitfs/engine/liveness"
	"github.com/cockpitfs/cockpitfs/storage"
)

// HolderAttrs is a holder write: `pid=<n>|none checkout=<absolute path>`, each optional.
type HolderAttrs struct {
	SetPID   bool
	PID      int    // with SetPID: 0 = none (untracked)
	Checkout string // "" = unchanged
}

// ParseHolderAttrs reads a holder write. Unknown keys, repeated keys and malformed values are
// refused; an empty write sets nothing.
func ParseHolderAttrs(text string) (HolderAttrs, error) {
	var a HolderAttrs
	seen := map[string]bool{}
	for _, token := range strings.Fields(text) {
		key, value, ok := strings.Cut(token, "=")
		if !ok || seen[key] {
			return a, refuse(StateRecordMalformed, "", "write pid=<n>|none and/or checkout=<absolute path>", "holder attribute %q is malformed or repeated", token)
		}
		seen[key] = true
		switch key {
		case "pid":
			a.SetPID = true
			if value == "none" {
				continue
			}
			pid, err := strconv.Atoi(value)
			if err != nil || pid < 1 || pid > 2147483647 || strconv.Itoa(pid) != value {
				return a, refuse(StateRecordMalformed, "", "write pid=<n> with a running process id, or pid=none", "pid %q is not a process id", value)
			}
			a.PID = pid
		case "checkout":
			if !filepath.IsAbs(value) || strings.ContainsRune(value, 0) || len(value) > 4096 {
				return a, refuse(StateRecordMalformed, "", "write checkout=$PWD", "checkout %q is not an absolute path", value)
			}
			a.Checkout = filepath.Clean(value)
		default:
			return a, refuse(StateRecordMalformed, "", "write pid=<n>|none and/or checkout=<absolute path>", "unknown holder attribute %q", key)
		}
	}
	return a, nil
}

// processOf observes pid for a holder or executor: its start identity, refusing a pid that does
// not exist. A pid whose start cannot be confirmed is kept without one (unknown is never dead).
func processOf(pid int) (string, error) {
	obs := liveness.Observe(pid)
	switch obs.State {
	case liveness.Absent:
		return "", refuse(StateRecordMalformed, "", "name a running process", "process %d does not exist", pid)
	case liveness.Present:
		return obs.Start, nil
	default:
		return "", nil
	}
}

// defaultHolder is a new holder as the caller's process implies it: held by its session (a
// terminal's shell, an agent's session) and checked out at its working directory.
func defaultHolder(c Caller, name string) (NewHolder, error) {
	h := NewHolder{Name: name, UID: c.UID}
	if c.PID <= 0 {
		return h, refuse(StateRecordMalformed, HolderID(name), "claim from a process cockpitfs can see", "the calling process could not be resolved")
	}
	cwd, err := liveness.Cwd(c.PID)
	if err != nil || !filepath.IsAbs(cwd) || strings.HasSuffix(cwd, " (deleted)") {
		return h, refuse(StateRecordMalformed, HolderID(name), "claim from an existing directory or write checkout=<path>", "the caller's working directory could not be read")
	}
	h.CheckoutPath = filepath.Clean(cwd)
	h.PID = c.PID
	if session, err := liveness.SessionHolder(c.PID); err == nil {
		h.PID = session
	}
	start, err := processOf(h.PID)
	if err != nil {
		// It exited since it was found: the caller itself holds.
		h.PID = c.PID
		if start, err = processOf(h.PID); err != nil {
			return h, err
		}
	}
	h.ProcessStart = start
	return h, nil
}

// maxHolderProbes bounds concurrent liveness probes; a stack may have a thousand holders.
const maxHolderProbes = 4

// deadHolders observes every holder with a pid except the one named and returns those proven gone.
func deadHolders(holders []Holder, except string) []Holder {
	var candidates []Holder
	for _, h := range holders {
		if h.PID != 0 && h.HolderID != except {
			candidates = append(candidates, h)
		}
	}
	gone := make([]bool, len(candidates))
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < min(maxHolderProbes, len(candidates)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				gone[i] = liveness.Gone(candidates[i].ProcessStart, liveness.Observe(candidates[i].PID))
			}
		}()
	}
	for i := range candidates {
		next <- i
	}
	close(next)
	wg.Wait()
	var dead []Holder
	for i, h := range candidates {
		if gone[i] {
			dead = append(dead, h)
		}
	}
	return dead
}

// HolderState is what reading a holder file reports: live, dead, unknown, or untracked (no pid).
func HolderState(h Holder) string {
	if h.PID == 0 {
		return "untracked"
	}
	obs := liveness.Observe(h.PID)
	switch {
	case liveness.Gone(h.ProcessStart, obs):
		return "dead"
	case obs.State == liveness.Present:
		return "live"
	default:
		return "unknown"
	}
}

var drainReservedFix = "wait for the drain to finish (cat wait) or cancel an unstarted one (rm drain/request)"

// Claim adds a holder to the stack and leases it a port family (§4). attrs, when given, replace the
// caller-derived pid and checkout.
func (e *Engine) Claim(ctx context.Context, c Caller, cockpit, stack, name string, attrs *HolderAttrs) error {
	if err := checkName("holder", name); err != nil {
		return err
	}
	nh, err := defaultHolderOr(c, name, attrs)
	if err != nil {
		return err
	}
	before, err := e.Stack(cockpit, stack)
	if err != nil {
		return err
	}
	// Probes are slow, so they run before the transaction; it releases only holders still
	// recorded exactly as observed.
	dead := deadHolders(before.Value.Holders, HolderID(name))
	return e.update(ctx, stackKey(cockpit, stack), func(tx storage.Txn, now time.Time) error {
		m, err := e.loadCockpit(tx, cockpit)
		if err != nil {
			return err
		}
		r, err := e.loadRecord(tx, cockpit, stack)
		if err != nil {
			return err
		}
		if r.Value.Drain != nil {
			return refuse(ClaimCoTenant, r.SubjectID, drainReservedFix, "claims are refused while a drain is reserved on the stack")
		}
		cfg, ok := m.config()
		if !ok {
			return refuse(PortFamilyOutOfRange, m.ID, fmt.Sprintf("write %s/config first", cockpit), "cockpit %s has no port declaration", cockpit)
		}
		retained := len(r.Value.Holders) > 0 && r.Value.Lease.Active()
		v, released := releaseDead(r.Value, dead, &nh, now)
		v, added, err := addHolder(v, nh, now)
		if err != nil {
			return err
		}
		if !added && len(released) == 0 {
			return errUnchanged
		}
		if !v.Lease.Active() || !retained {
			var active int
			if _, err := getJSON(tx, leaseCountKey(cockpit), &active); err != nil {
				return err
			}
			lease, err := leaseFamily(v.Lease, retained, leaseInputs{
				config:       cfg,
				activeLeases: active,
				occupiedBy:   portOwner(tx, cockpit, stack),
				listening:    listeners.Listening,
			})
			if err != nil {
				return err
			}
			if !v.Lease.Active() {
				v.Lease = lease
			}
		} else if !v.Lease.Declaration.Equal(cfg.Declaration) && added {
			return refuse(ConfigChangedDuringExecution, r.SubjectID, "drain the stack, then claim again",
				"the stack's lease was taken under another port declaration")
		}
		return e.commit(tx, c, r, v, now)
	})
}

func defaultHolderOr(c Caller, name string, attrs *HolderAttrs) (NewHolder, error) {
	if attrs == nil {
		return defaultHolder(c, name)
	}
	nh := NewHolder{Name: name, UID: c.UID, CheckoutPath: attrs.Checkout}
	if nh.CheckoutPath == "" {
		return nh, refuse(StateRecordMalformed, HolderID(name), "write checkout=<absolute path>", "a holder needs a checkout")
	}
	if attrs.PID > 0 {
		start, err := processOf(attrs.PID)
		if err != nil {
			return nh, err
		}
		nh.PID, nh.ProcessStart = attrs.PID, start
	}
	return nh, nil
}

// commit writes the next revision of r with value v, its port index and its events line.
func (e *Engine) commit(tx storage.Txn, c Caller, r Record, v Value, now time.Time) error {
	saved, err := saveRecord(tx, r.next(v, now))
	if err != nil {
		return err
	}
	e.staged.Store(stackKey(r.Cockpit, r.Stack), saved)
	if err := reindexLease(tx, r.Cockpit, r.Stack, r.Value.Lease, v.Lease); err != nil {
		return err
	}
	return appendEvent(tx, r.Cockpit, r.Stack, okEvent(c, now, saved.Revision))
}

// SetHolder applies a holder write. createdHere says the write comes through the open that
// created the holder, the only one that may still choose its checkout.
func (e *Engine) SetHolder(ctx context.Context, c Caller, cockpit, stack, name string, attrs HolderAttrs, createdHere bool) error {
	var start string
	if attrs.SetPID && attrs.PID > 0 {
		var err error
		if start, err = processOf(attrs.PID); err != nil {
			return err
		}
	}
	return e.update(ctx, stackKey(cockpit, stack), func(tx storage.Txn, now time.Time) error {
		r, err := e.loadRecord(tx, cockpit, stack)
		if err != nil {
			return err
		}
		h, ok := r.Value.Holder(name)
		if !ok {
			return refuse(NotFound, HolderID(name), "", "holder %s does not claim this stack", name)
		}
		if !c.may(h.UID) {
			return c.denied("holder "+name, h.UID)
		}
		if r.Value.Drain != nil {
			return refuse(ClaimCoTenant, h.HolderID, drainReservedFix, "holders cannot change while a drain is reserved")
		}
		changed := h
		if attrs.Checkout != "" && CheckoutID(attrs.Checkout) != h.CheckoutID {
			if !createdHere {
				return refuse(StateRecordMalformed, h.HolderID, "claim under another holder name for another checkout",
					"holder %s is bound to checkout %s; a checkout is part of a holder's identity", name, h.CheckoutPath)
			}
			changed.CheckoutPath, changed.CheckoutID = attrs.Checkout, CheckoutID(attrs.Checkout)
		}
		if attrs.SetPID {
			changed.PID, changed.ProcessStart = attrs.PID, start
		}
		if changed == h {
			return errUnchanged
		}
		v := r.Value
		v.Holders = append([]Holder(nil), v.Holders...)
		for i := range v.Holders {
			if v.Holders[i].HolderID == h.HolderID {
				v.Holders[i] = changed
			}
		}
		return e.commit(tx, c, r, v, now)
	})
}

// Release removes the caller's own holder (§4): only its owner may, never while a drain is
// reserved, never the last one.
func (e *Engine) Release(ctx context.Context, c Caller, cockpit, stack, name string) error {
	return e.update(ctx, stackKey(cockpit, stack), func(tx storage.Txn, now time.Time) error {
		r, err := e.loadRecord(tx, cockpit, stack)
		if err != nil {
			return err
		}
		if h, ok := r.Value.Holder(name); ok && !c.may(h.UID) {
			return c.denied("holder "+name, h.UID)
		}
		v, err := releaseHolder(r.Value, name)
		if err != nil {
			return err
		}
		return e.commit(tx, c, r, v, now)
	})
}
