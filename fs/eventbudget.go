package fs

import (
	"sync"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
)

// eventLinesBurst and eventLinesPerSecond bound the events lines of each uid's refusals, root's
// and the daemon's own user's aside. Each line is a durable commit of its own: 8 processes of one
// user looping over a refused write made 2,500 lines a second, a CPU of the daemon's and 2,000
// fdatasyncs a second, beside every other user's commits (docs/machines.md). Past the budget a
// refusal still returns its errno and changes nothing, and is counted: the uid's next line says
// how many refusals have no line (unshown), and the latest of them is written itself once the
// budget allows, so the last refusal of a burst is in its events file a tenth of a second later.
const (
	eventLinesBurst     = 32 // an events file's window of one uid's refusals (engine's refusalsKept)
	eventLinesPerSecond = 10
)

// eventBudget is each budgeted uid's bucket of events lines (eventLinesBurst, refilled at
// eventLinesPerSecond), and what its refusals past it left without a line.
type eventBudget struct {
	mu    sync.Mutex
	swept time.Time // when the buckets that hold nothing were last let go
	by    map[uint32]*uidLines
}

type uidLines struct {
	tokens  float64   // the lines it may write now
	at      time.Time // when tokens was counted
	unshown int       // its refusals without a line since its last line, held among them
	held    *refusalLine
	armed   bool // a flush of held is scheduled (FS.flushLater)
}

// refusalLine is a refusal's events line, as fail hands it to the engine.
type refusalLine struct {
	c              engine.Caller
	cockpit, stack string
	refusal        *engine.Refusal
	errno          string
}

// take says whether line may be written at now, and how many refusals of its uid before it have
// no line. If not, it is counted and held in place of the one held before (which stays counted);
// arm is then how long until the held line may be written, when a flush must be scheduled for it
// (0: one is).
func (b *eventBudget) take(now time.Time, line refusalLine) (unshown int, write bool, arm time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sweep(now)
	u := b.by[line.c.UID]
	if u == nil {
		u = &uidLines{tokens: eventLinesBurst, at: now}
		b.by[line.c.UID] = u
	}
	u.refill(now)
	if u.tokens >= 1 {
		u.tokens--
		unshown, u.unshown, u.held = u.unshown, 0, nil
		return unshown, true, 0
	}
	u.unshown++
	u.held = &line
	if u.armed {
		return 0, false, 0
	}
	u.armed = true
	return 0, false, u.wait()
}

// flush hands back uid's held line once the budget allows it, with how many refusals before it
// have no line; else again is how long until it may be (a line written since took the budget),
// or 0 when nothing is held any more.
func (b *eventBudget) flush(uid uint32, now time.Time) (line *refusalLine, unshown int, again time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	u := b.by[uid] // armed, so not swept
	if u.held == nil {
		u.armed = false
		return nil, 0, 0
	}
	u.refill(now)
	if u.tokens < 1 {
		return nil, 0, u.wait()
	}
	u.tokens--
	line, unshown = u.held, u.unshown-1
	u.held, u.unshown, u.armed = nil, 0, false
	return line, unshown, 0
}

// sweep lets go, once a minute, of the buckets that are full and hold nothing: the map keeps only
// the uids refused lately.
func (b *eventBudget) sweep(now time.Time) {
	if b.by == nil {
		b.by = map[uint32]*uidLines{}
	}
	if now.Sub(b.swept) < time.Minute {
		return
	}
	b.swept = now
	for uid, u := range b.by {
		if u.refill(now); u.tokens == eventLinesBurst && !u.armed {
			delete(b.by, uid)
		}
	}
}

// refill counts u's lines at now.
func (u *uidLines) refill(now time.Time) {
	if now.After(u.at) {
		u.tokens = min(eventLinesBurst, u.tokens+now.Sub(u.at).Seconds()*eventLinesPerSecond)
		u.at = now
	}
}

// wait is how long until u may write a line (at least a millisecond: never 0, which means none).
func (u *uidLines) wait() time.Duration {
	return max(time.Millisecond, time.Duration((1-u.tokens)/eventLinesPerSecond*float64(time.Second)))
}

// logRefusal writes line into its events file, or, past its uid's budget, counts it and holds it
// for a flush.
func (f *FS) logRefusal(line refusalLine, logged bool) {
	unshown := 0
	if uid := line.c.UID; uid != 0 && uid != f.uid {
		var write bool
		var arm time.Duration
		if unshown, write, arm = f.eventLines.take(time.Now(), line); !write {
			if arm > 0 {
				f.flushLater(uid, arm)
			}
			return
		}
	}
	f.writeRefusal(line, unshown, logged)
}

// flushLater writes uid's held refusal line after d, or once its budget allows.
func (f *FS) flushLater(uid uint32, d time.Duration) {
	time.AfterFunc(d, func() {
		line, unshown, again := f.eventLines.flush(uid, time.Now())
		switch {
		case line != nil:
			f.writeRefusal(*line, unshown, false)
		case again > 0:
			f.flushLater(uid, again)
		}
	})
}

// writeRefusal appends line to its events file, and logs it when that fails and it was not
// logged already.
func (f *FS) writeRefusal(line refusalLine, unshown int, logged bool) {
	if err := f.eng.LogRefusal(line.c, line.cockpit, line.stack, line.refusal, line.errno, unshown); err != nil && !logged {
		f.log.Printf("%s %s: %s %v (not in events: %v)", line.c.Op, line.c.Path, line.errno, line.refusal, err)
	}
}
