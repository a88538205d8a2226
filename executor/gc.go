package executor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/liveness"
	"github.com/cockpitfs/cockpitfs/internal/probe"
)

// Stale stacks (docs/worktrees.md): a stack with an active lease whose every holder is dead or
// pid-less and whose every holder's checkout is known and gone (`git worktree remove`, rm -rf)
// runs for nobody. gc drains it (`down`) through the engine's fenced drain path, stopping what it
// still runs. A holder that is live or unknown, a checkout that exists or cannot be told gone
// (unknown, unreadable), or a drain reserved with more than its runtime-stop left, or whose
// attempt's executor may still run, keeps the stack.

// gcHolder is the holder a gc drain reserves for when every holder is dead: it takes the stack
// over from them, as any drain request naming a new holder does.
const gcHolder = "gc"

// Verdict is what gc makes of one stack with an active lease.
type Verdict struct {
	Cockpit, Stack string
	Stale          bool
	Why            string
	Grace          time.Duration // the cockpit's [gc] grace
	record         engine.Record
}

// Line is v as the gc file lists it: "drain" or "keep", the stack, why.
func (v Verdict) Line() string {
	verb := "keep"
	if v.Stale {
		verb = "drain"
	}
	return fmt.Sprintf("%s %s/stacks/%s: %s", verb, v.Cockpit, v.Stack, v.Why)
}

// Survey judges every stack with an active lease, cockpit by cockpit.
func (x *Executor) Survey() ([]Verdict, error) {
	cockpits, err := x.eng.Cockpits()
	if err != nil {
		return nil, err
	}
	var out []Verdict
	looks := x.newCheckouts()
	defer looks.close()
	for _, c := range cockpits {
		stacks, err := x.eng.Stacks(c.Name)
		if err != nil {
			continue // removed since
		}
		grace := lifecycleOf(x.eng, c.Name).GCGrace()
		for _, s := range stacks {
			r, err := x.eng.Stack(c.Name, s)
			if err != nil || !r.Value.Lease.Active() {
				continue
			}
			v := x.judge(r, looks)
			v.Grace = grace
			out = append(out, v)
		}
	}
	return out, nil
}

// checkoutWait is how long a checkout path may take to answer whether it exists; reapWait, how
// long its killed probe may take to end before it counts as stuck; quietFor, how long a path that
// did not answer is not looked at again: a stopped server costs the surveys (root's `cat gc`, the
// sweep) one wait a minute, not one every survey.
const (
	checkoutWait = 2 * time.Second
	reapWait     = 500 * time.Millisecond
	quietFor     = time.Minute
)

// checkouts looks at holders' checkout paths for one survey, through a probe (a path may be
// below a stopped FUSE server or a hung network mount, for as long as its user likes). Every
// survey looks at a uid's paths through that uid's one looker: one probe, one look at a time. A
// path that does not answer in time is not looked at again for quietFor, and costs its uid the
// rest of the looks of each survey that meets it meanwhile; a probe the kill cannot end costs its
// uid every survey's looks while it stays. So however many surveys run at once (a user's threads
// reading gc), one user's paths hold at most one process and leave everyone else's looked at: a
// survey waits for the look in progress rather than start another, and one waiting for a look
// that does not answer finds that path quiet (surveys list paths in the same order) and looks no
// further at that uid's.
//
// A daemon running as root looks at each holder's path as the holder's uid (its groups from the
// user database), in a probe of that uid's own: what gc says of a path (exists, gone, cannot be
// read) is then what its holder could find out, never what only root can see. A daemon of another
// user can take no other uid, and looks as itself.
type checkouts struct {
	x      *Executor
	joined map[uint32]*looker
	hung   map[uint32]error // why each uid's paths are not looked at in this survey
}

// looker looks at one uid's paths for every survey.
type looker struct {
	// turn is held by the look in progress: the uid's other looks wait for it, which ends within
	// its probe's start bound (when it starts one), checkoutWait and reapWait.
	turn  chan struct{}
	probe *probe.Prober // the turn's
	// Under the executor's lookersMu:
	surveys int                  // the surveys that joined it and have not ended: the last ends the probe
	stuck   *stuckProbe          // a probe the kill did not end, until it ends
	silent  map[string]time.Time // the paths that did not answer, and when, for quietFor
}

// stuckProbe is a probe of a uid's checkout that did not answer, killed and not yet ended.
type stuckProbe struct {
	path   string
	since  time.Time
	reaped <-chan struct{}
}

func (x *Executor) newCheckouts() *checkouts {
	return &checkouts{x: x, joined: map[uint32]*looker{}, hung: map[uint32]error{}}
}

// close leaves the lookers c joined: the last survey to leave one ends its probe. A looker no
// survey holds is forgotten once it has nothing to remember.
func (c *checkouts) close() {
	c.x.lookersMu.Lock()
	defer c.x.lookersMu.Unlock()
	for _, l := range c.joined {
		if l.surveys--; l.surveys == 0 {
			l.probe.Close()
		}
	}
	for uid, l := range c.x.lookers {
		for path := range l.silent {
			l.unheard(path)
		}
		if l.surveys == 0 && l.unstuck() && len(l.silent) == 0 {
			delete(c.x.lookers, uid)
		}
	}
}

// looker is uid's looker, which c joins.
func (c *checkouts) looker(uid uint32) *looker {
	if l, ok := c.joined[uid]; ok {
		return l
	}
	c.x.lookersMu.Lock()
	defer c.x.lookersMu.Unlock()
	l, ok := c.x.lookers[uid]
	if !ok {
		l = &looker{turn: make(chan struct{}, 1), probe: &probe.Prober{Timeout: checkoutWait}, silent: map[string]time.Time{}}
		if os.Geteuid() == 0 && uid != 0 {
			l.probe.As = credential(uid)
		}
		c.x.lookers[uid] = l
	}
	l.surveys++
	c.joined[uid] = l
	return l
}

// unstuck says whether l has no probe the kill did not end, forgetting one that has ended since.
func (l *looker) unstuck() bool {
	if l.stuck == nil {
		return true
	}
	select {
	case <-l.stuck.reaped:
		l.stuck = nil
		return true
	default:
		return false
	}
}

// unheard says when path last did not answer, if that was less than quietFor ago; it forgets
// an older silence.
func (l *looker) unheard(path string) (time.Time, bool) {
	at, ok := l.silent[path]
	if ok && time.Since(at) >= quietFor {
		delete(l.silent, path)
		return at, false
	}
	return at, ok
}

// credential is uid with its primary group and the groups naming it as /etc/passwd and /etc/group
// give them, read here rather than through the system's user lookup, which may ask a directory
// server and wait on it; a uid these files do not know gets the overflow group (65534) alone.
// Either way the probe has no right its holder lacks.
func credential(uid uint32) *syscall.Credential {
	cred := &syscall.Credential{Uid: uid, Gid: 65534, Groups: []uint32{}}
	id := strconv.FormatUint(uint64(uid), 10)
	var name string
	for _, f := range dbEntries("/etc/passwd", 7) { // name:password:uid:gid:gecos:home:shell
		if gid, err := strconv.ParseUint(f[3], 10, 32); f[2] == id && err == nil {
			name, cred.Gid = f[0], uint32(gid)
			break
		}
	}
	if name == "" {
		return cred
	}
	for _, f := range dbEntries("/etc/group", 4) { // name:password:gid:members
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err == nil && slices.Contains(strings.Split(f[3], ","), name) {
			cred.Groups = append(cred.Groups, uint32(gid))
		}
	}
	return cred
}

// dbEntries are the lines of a colon-separated user database with n fields.
func dbEntries(path string, n int) [][]string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out [][]string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Split(line, ":"); len(f) == n {
			out = append(out, f)
		}
	}
	return out
}

// lstat is os.Lstat of h's checkout path, through its uid's looker.
func (c *checkouts) lstat(h engine.Holder) error {
	if err, ok := c.hung[h.UID]; ok {
		return err
	}
	l := c.looker(h.UID)
	l.turn <- struct{}{}
	defer func() { <-l.turn }()
	if err := c.x.notLooked(h, l); err != nil {
		c.hung[h.UID] = err
		return err
	}
	err := l.probe.Lstat(h.CheckoutPath)
	if na := (*probe.NoAnswerError)(nil); errors.As(err, &na) {
		c.hung[h.UID] = fmt.Errorf("uid %d's checkout %s did not answer in this survey", h.UID, h.CheckoutPath) // judge makes it printable
		silent := time.Now()
		var stuck *stuckProbe // notLooked found none
		select {
		case <-na.Reaped: // the kill ended it (a server that had not taken the request)
		case <-time.After(reapWait):
			stuck = &stuckProbe{h.CheckoutPath, silent, na.Reaped}
		}
		c.x.lookersMu.Lock()
		l.silent[h.CheckoutPath] = silent
		l.stuck = stuck
		c.x.lookersMu.Unlock()
	}
	return err
}

// notLooked is why h's checkout, and the rest of its uid's in this survey, are not looked at now
// through l; nil when it is.
func (x *Executor) notLooked(h engine.Holder, l *looker) error {
	x.lookersMu.Lock()
	defer x.lookersMu.Unlock()
	if !l.unstuck() {
		return fmt.Errorf("uid %d's checkout %s has not answered since %s", h.UID, l.stuck.path, l.stuck.since.UTC().Format(time.RFC3339))
	}
	if at, ok := l.unheard(h.CheckoutPath); ok {
		return fmt.Errorf("uid %d's checkout %s did not answer at %s, and is not looked at again before %s", h.UID, h.CheckoutPath,
			at.UTC().Format(time.RFC3339), at.Add(quietFor).UTC().Format(time.RFC3339))
	}
	return nil
}

// judge is gc's verdict on r, whose lease is active.
func (x *Executor) judge(r engine.Record, looks *checkouts) Verdict {
	v := Verdict{Cockpit: r.Cockpit, Stack: r.Stack, record: r}
	if d := r.Value.Drain; d != nil {
		// A drain whose only action left is the runtime-stop (a gc drain its daemon died in, a
		// `down` its holder reserved and left) is gc's to finish; any other is its executor's.
		if d.CompletedActionCount != len(d.Actions)-1 || d.Actions[d.CompletedActionCount].Stage != runtimeStop {
			v.Why = fmt.Sprintf("a %s drain by holder %s is reserved", d.Purpose, d.HolderName)
			return v
		}
		if a := d.Attempt; a != nil && a.Status == "active" && x.eng.HolderState(engine.Holder{PID: a.ExecutorPID, ProcessStart: a.ExecutorStart}) != "dead" {
			v.Why = fmt.Sprintf("the %s drain's attempt is active, its executor (process %d) not known to be gone", d.Purpose, a.ExecutorPID)
			return v
		}
	}
	if len(r.Value.Holders) == 0 {
		v.Why = "no holder"
		return v
	}
	var holders, gone []string
	for _, h := range r.Value.Holders {
		if x.eng.Shared() && !thisMachines(h) {
			// A checkout path names a directory of the holder's machine, which only that
			// machine's daemon can look at; a pid-less holder names no machine at all.
			v.Why = fmt.Sprintf("holder %s may be another machine's, whose checkouts this daemon cannot see", h.Name)
			return v
		}
		switch state := x.eng.HolderState(h); state {
		case "dead":
			holders = append(holders, fmt.Sprintf("%s (dead, process %d)", h.Name, h.PID))
		case "untracked":
			holders = append(holders, h.Name+" (pid-less)")
		default:
			v.Why = fmt.Sprintf("holder %s is %s (process %d)", h.Name, state, h.PID)
			return v
		}
		if h.CheckoutPath == "" {
			v.Why = fmt.Sprintf("holder %s's checkout is unknown", h.Name)
			return v
		}
		if x.mount != "" && (h.CheckoutPath == x.mount || strings.HasPrefix(h.CheckoutPath, x.mount+"/")) {
			// The daemon makes no request to its own mount.
			v.Why = fmt.Sprintf("holder %s's checkout %s is inside the mount", h.Name, engine.Printable(h.CheckoutPath))
			return v
		}
		if err := looks.lstat(h); !errors.Is(err, fs.ErrNotExist) {
			v.Why = fmt.Sprintf("holder %s's checkout %s exists", h.Name, engine.Printable(h.CheckoutPath))
			if err != nil {
				v.Why = fmt.Sprintf("holder %s's checkout %s cannot be told gone: %s", h.Name, engine.Printable(h.CheckoutPath), engine.Printable(err.Error()))
			}
			return v
		}
		if path := engine.Printable(h.CheckoutPath); !slices.Contains(gone, path) {
			gone = append(gone, path)
		}
	}
	v.Stale = true
	v.Why = fmt.Sprintf("holders %s; checkouts gone: %s", strings.Join(holders, ", "), strings.Join(gone, ", "))
	return v
}

// thisMachines says h's process was started on this machine's current boot.
func thisMachines(h engine.Holder) bool {
	boot, ok := liveness.BootOf(h.ProcessStart)
	here, err := liveness.BootID()
	return h.PID != 0 && ok && err == nil && boot == here
}

// mayDrain says whether uid may drain the stack of r as gc does: root, the stack's creator or
// its cockpit's owner (who may act on any holder of it and take it over).
func (x *Executor) mayDrain(uid uint32, r engine.Record) bool {
	if uid == 0 {
		return true
	}
	creator, ok := x.eng.StackCreator(r)
	info, err := x.eng.Cockpit(r.Cockpit)
	return ok && uid == creator || err == nil && uid == info.UID
}

// DrainStale drains the stack v judged stale, for c (nothing when it is no longer stale). A drain
// already reserved is finished: its orphaned attempt repaired, its runtime-stop run. Otherwise it
// releases all pid-less holders but the first, reserves `down` for that one (or, when every holder
// is dead, for a new holder named gc, which takes the stack over), and runs the drain's one action
// with the stop step, which signals only what each uid of as may. The reservation is planned at
// the revision judged, so a stack changed since (claimed again) is refused by the engine, not
// drained.
func (x *Executor) DrainStale(ctx context.Context, c engine.Caller, v Verdict, as []uint32) ([]Stopped, error) {
	r := v.record
	at := func(path string) engine.Caller {
		c := c
		c.Path = r.Cockpit + "/stacks/" + r.Stack + "/" + path
		return c
	}
	if d := r.Value.Drain; d != nil {
		// judge found the drain's runtime-stop left, its attempt (if active) orphaned.
		if a := d.Attempt; a != nil && a.Status == "active" {
			if err := x.eng.Repair(ctx, at("drain/repair"), r.Cockpit, r.Stack); err != nil {
				return nil, err
			}
		}
		return x.stopStack(ctx, c, r, r.Value.Holders, as)
	}
	var pidless []engine.Holder
	for _, h := range r.Value.Holders {
		if h.PID == 0 {
			pidless = append(pidless, h)
		}
	}
	holder := gcHolder
	if len(pidless) > 0 {
		holder = pidless[0].Name
		for _, h := range pidless[1:] {
			if err := x.eng.Release(ctx, at("holders/"+h.Name), r.Cockpit, r.Stack, h.Name); err != nil {
				return nil, err
			}
		}
		if len(pidless) > 1 {
			now, err := x.eng.Stack(r.Cockpit, r.Stack)
			if err != nil {
				return nil, err
			}
			looks := x.newCheckouts()
			v = x.judge(now, looks)
			looks.close()
			if !v.Stale {
				return nil, nil // claimed again meanwhile: kept
			}
			r = now
		}
	}
	req, err := engine.ParseDrainRequest("down holder=" + holder)
	if err != nil {
		return nil, err
	}
	if err := x.eng.ReserveDrain(ctx, at("drain/request"), r.Cockpit, r.Stack, req, r.Revision); err != nil {
		return nil, err
	}
	return x.stopStack(ctx, c, r, r.Value.Holders, as)
}

// sweepers are the uids a sweep's drain of r's stack stops processes for: every uid with a say in
// the stack being stale. Those are its creator, its cockpit's owner (who may remove any holder of
// it, and the record does not say who removed one), each holder's uid (another user's holder, a
// pid-less one of a path that does not exist, makes the stack stale once the others are gone) and
// a reserved drain's. The stop signals only what each of them may, so root's sweep ends nothing
// the users who made the stack stale could not have ended themselves. Root restricts nothing and
// is left out unless it is all there is.
func sweepers(r engine.Record, creator, owner uint32) []uint32 {
	var as []uint32
	add := func(uid uint32) {
		if uid != 0 && !slices.Contains(as, uid) {
			as = append(as, uid)
		}
	}
	add(creator)
	add(owner)
	for _, h := range r.Value.Holders {
		add(h.UID)
	}
	if d := r.Value.Drain; d != nil {
		add(d.UID)
	}
	if len(as) == 0 {
		return []uint32{0}
	}
	return as
}

// Drained is one stack a gc run drained, or tried to.
type Drained struct {
	Verdict
	Stopped []Stopped
	Err     error
}

// Collect drains, for c, every stale stack c may drain (root, its creator, its cockpit's
// owner), without waiting for any grace: what `cockpitfs gc` asks for.
func (x *Executor) Collect(ctx context.Context, c engine.Caller) ([]Drained, error) {
	verdicts, err := x.Survey()
	if err != nil {
		return nil, err
	}
	var out []Drained
	for _, v := range verdicts {
		if v.Stale && x.mayDrain(c.UID, v.record) {
			stopped, err := x.DrainStale(ctx, c, v, []uint32{c.UID})
			out = append(out, Drained{Verdict: v, Stopped: stopped, Err: err})
		}
	}
	return out, nil
}

// maxDrainsPerSweep bounds a sweep's drains: each may wait out its cockpit's stop grace.
const maxDrainsPerSweep = 8

// Sweeper drains stacks stale for their cockpit's [gc] grace, as the stack's creator, once per
// interval (Run), stopping only what every uid with a say in the stack being stale may signal
// (sweepers). It remembers when it first saw each stack stale: a restart starts the grace
// again, which only ever delays a drain.
type Sweeper struct {
	x *Executor
	// since is when a sweep first saw each stack ("cockpit/stack") stale; only Run's goroutine
	// sweeps.
	since map[string]time.Time
	// report reports why a stack's drain was refused, or failed: in its events.
	report func(c engine.Caller, cockpit, stack string, err error)
}

// NewSweeper returns the sweeper of x, reporting each drain refused or failed to report.
func NewSweeper(x *Executor, report func(c engine.Caller, cockpit, stack string, err error)) *Sweeper {
	return &Sweeper{x: x, since: map[string]time.Time{}, report: report}
}

// Run sweeps every interval until ctx ends. Sweeps never overlap.
func (s *Sweeper) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Sweep(ctx)
		}
	}
}

// Sweep judges every stack with an active lease once and drains, as its creator, up to
// maxDrainsPerSweep of those stale for their cockpit's grace, stopping only what each of its
// sweepers may signal; the rest wait for the next sweep.
func (s *Sweeper) Sweep(ctx context.Context) {
	verdicts, err := s.x.Survey()
	if err != nil {
		s.report(engine.Caller{PID: s.x.self, Op: "gc"}, "", "", err)
		return
	}
	now := time.Now()
	stale := map[string]time.Time{}
	var due []Verdict
	for _, v := range verdicts {
		if !v.Stale {
			continue
		}
		key := v.Cockpit + "/" + v.Stack
		since, seen := s.since[key]
		if !seen {
			since = now
		}
		stale[key] = since
		if now.Sub(since) >= v.Grace && len(due) < maxDrainsPerSweep {
			due = append(due, v)
		}
	}
	s.since = stale
	for _, v := range due {
		creator, ok := s.x.eng.StackCreator(v.record)
		info, err := s.x.eng.Cockpit(v.Cockpit)
		if !ok || err != nil {
			continue
		}
		c := engine.Caller{PID: s.x.self, UID: creator, Op: "gc"}
		if _, err := s.x.DrainStale(ctx, c, v, sweepers(v.record, creator, info.UID)); err != nil {
			s.report(c, v.Cockpit, v.Stack, err)
		}
	}
}
