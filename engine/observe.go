package engine

import (
	"path/filepath"
	"strings"
	"sync"

	"github.com/cockpitfs/cockpitfs/engine/liveness"
)

// Host observation: what a use case learns about processes before its transaction. Probes are
// slow and may block, so none runs while a stack's lock is held; a step then acts only on what is
// still recorded exactly as observed. (The listener probe is the exception: which family it probes
// depends on the port index read in the transaction, so the claim step asks the commit path for it
// there, an effect beside the holds (stepEffects); the claimant's groups are read there too, only
// when the stack's mode makes them decide.)

// processOf observes pid for a holder or executor: its start identity, refusing a pid that does
// not exist. A pid whose start cannot be confirmed is kept without one (unknown is never dead).
func processOf(pid int) (string, error) { return startOf(pid, liveness.Observe(pid)) }

// startOf is processOf for obs, an observation of pid.
func startOf(pid int, obs liveness.Observation) (string, error) {
	switch obs.State {
	case liveness.Absent:
		return "", refuse(StateRecordMalformed, "", "name a running process", "process %d does not exist", pid)
	case liveness.Present:
		return obs.Start, nil
	default:
		return "", nil
	}
}

// observedState is what HolderState reports of a holder recorded with the start its claim just
// observed: live when the start was confirmed, unknown when it could not be, untracked without a
// process.
func observedState(h Holder) string {
	switch {
	case h.PID == 0:
		return "untracked"
	case h.ProcessStart != "":
		return "live"
	default:
		return "unknown"
	}
}

// observeClaimant is the holder a claim proposes: the one proposed (its checkout path and pid, 0
// for none), or, without one, the one the caller's process implies.
func observeClaimant(c Caller, name string, proposed *Holder) (Holder, error) {
	if proposed == nil {
		return defaultHolder(c, name)
	}
	nh := Holder{Name: name, UID: c.UID, CheckoutPath: proposed.CheckoutPath}
	if nh.CheckoutPath == "" {
		return nh, refuse(StateRecordMalformed, holderID(name), "write checkout=<absolute path>", "a holder needs a checkout")
	}
	if proposed.PID != 0 {
		if err := mayName(c, name, proposed.PID); err != nil {
			return nh, err
		}
		start, err := processOf(proposed.PID)
		if err != nil {
			return nh, err
		}
		nh.PID, nh.ProcessStart = proposed.PID, start
	}
	return nh, nil
}

// defaultHolder is a new holder as the caller's process implies it: held by its session (a
// terminal's shell, an agent's session) and checked out at its working directory. A working
// directory the daemon may not read (another user's, for a daemon that is not root) or that is
// gone leaves the checkout unknown (""): the claim stands, and a write on the same open may still
// name it (`echo checkout=$PWD > holders/me`).
func defaultHolder(c Caller, name string) (Holder, error) {
	h := Holder{Name: name, UID: c.UID}
	if c.PID <= 0 {
		return h, refuse(StateRecordMalformed, holderID(name), "claim from a process cockpitfs can see", "the calling process could not be resolved")
	}
	if cwd, err := liveness.Cwd(c.PID); err == nil && filepath.IsAbs(cwd) && !strings.HasSuffix(cwd, " (deleted)") {
		h.CheckoutPath = filepath.Clean(cwd)
	}
	// The session holder is observed from what finding it read: its stat is not read again.
	var obs liveness.Observation
	h.PID = c.PID
	if session, observed, err := liveness.ObserveSessionHolder(c.PID); err == nil {
		h.PID, obs = session, observed
	} else {
		obs = liveness.Observe(c.PID)
	}
	start, err := startOf(h.PID, obs)
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

// callerProcesses are the caller's process and the process holding its session: a holder held by
// either is the caller's own.
func callerProcesses(c Caller) map[int]bool {
	mine := map[int]bool{}
	if c.PID > 0 {
		mine[c.PID] = true
		if session, err := liveness.SessionHolder(c.PID); err == nil {
			mine[session] = true
		}
	}
	return mine
}

// callerGroups are the groups the caller acts in: its gid, and its process's supplementary
// groups (FUSE reports only the gid).
func callerGroups(c Caller) []uint32 {
	groups := []uint32{c.GID}
	if c.PID <= 0 {
		return groups
	}
	more, err := liveness.Groups(c.PID)
	if err != nil {
		return groups
	}
	return append(groups, more...)
}

// maxHolderProbes bounds concurrent liveness probes; a stack may have a thousand holders.
const maxHolderProbes = 4

// deadHolders observes every holder with a pid except the one named and returns those proven gone.
// Holders of one process (same pid and start) share one probe: a session often holds many. Holders
// of present's process, which the operation observed present a moment ago (a claimant's session),
// are not probed again.
func (e *Engine) deadHolders(holders []Holder, except string, present Holder) []Holder {
	type process struct {
		pid   int
		start string
	}
	var candidates []process
	seen := map[process]bool{{present.PID, present.ProcessStart}: present.PID != 0}
	for _, h := range holders {
		p := process{h.PID, h.ProcessStart}
		if h.PID != 0 && h.HolderID != except && !seen[p] {
			seen[p] = true
			candidates = append(candidates, p)
		}
	}
	gone := make([]bool, len(candidates))
	switch len(candidates) {
	case 0:
		return nil
	case 1: // the co-tenant's usual case: probed here, with no goroutine to hand it to and wait for
		gone[0] = e.gone(candidates[0].start, candidates[0].pid)
	default:
		var wg sync.WaitGroup
		next := make(chan int)
		for w := 0; w < min(maxHolderProbes, len(candidates)); w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					gone[i] = e.gone(candidates[i].start, candidates[i].pid)
				}
			}()
		}
		for i := range candidates {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	dead := map[process]bool{}
	for i, p := range candidates {
		dead[p] = gone[i]
	}
	var out []Holder
	for _, h := range holders {
		if h.HolderID != except && dead[process{h.PID, h.ProcessStart}] {
			out = append(out, h)
		}
	}
	return out
}

// observeExecutor is what Repair needs to know of the attempt recorded in r: which it is and
// whether its executor is proven gone.
func (e *Engine) observeExecutor(r Record) executorCheck {
	var seen executorCheck
	if d := r.Value.Drain; d != nil && d.Attempt != nil {
		a := d.Attempt
		seen.attemptID = a.AttemptID
		seen.gone = a.ExecutorPID != 0 && e.gone(a.ExecutorStart, a.ExecutorPID)
	}
	return seen
}

// HolderState is what reading a holder file reports: live, dead, unknown, or untracked (no pid). A
// holder of another machine is dead once its machine is, and unknown until then: only a daemon on
// its machine can probe it.
func (e *Engine) HolderState(h Holder) string {
	if h.PID == 0 {
		return "untracked"
	}
	if e.machines != nil {
		if boot, ok := liveness.BootOf(h.ProcessStart); ok && boot != e.machines.boot {
			if e.gone(h.ProcessStart, h.PID) {
				return "dead"
			}
			return "unknown"
		}
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

// mayName refuses a holder naming a process its writer could not signal: a holder lives as long
// as its process, so pid 1 or another user's process would pin the stack beyond its owner's reach.
func mayName(c Caller, holder string, pid int) error {
	if liveness.Signalable(c.UID, pid) {
		return nil
	}
	return refuse(PermissionDenied, holderID(holder), "name one of your own processes (pid=<n>), or pid=none",
		"process %d is not one uid %d may signal", pid, c.UID)
}
