package engine

import (
	"context"
	"errors"

	"github.com/cockpitfs/cockpitfs/storage"
)

// LogStopped records in the stack's events file what a drain's stop step did to one process
// (result "stopped", the message naming it): the stop step signals processes, which no record
// holds, so its lines are the only trace of whom it ended.
func (e *Engine) LogStopped(c Caller, cockpit, stack, message string) error {
	return e.logLine(c, cockpit, stack, event{Result: "stopped", Message: message})
}

// logLine appends ev, stamped now and naming c, to the events file of the stack, or of the
// cockpit when stack is "" or no longer exists (the nearest one). A cockpit that does not exist
// has no events file, and then nothing is recorded.
//
// It does not queue for the stack's lock: a refusal for contention (STATE_LOCKED) would otherwise
// wait for the same contention again before the caller hears of it. The events sequence is read
// with Get, so the store orders this line against the stack's commits.
func (e *Engine) logLine(c Caller, cockpit, stack string, ev event) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.budget)
	defer cancel()
	level := stack
	e.cockpits.begin()
	err := e.db.Update(ctx, func(tx storage.Txn) error {
		level = stack
		if stack == "" || !exists(tx, stackKey(cockpit, stack)) {
			level = cockpitLevel
		}
		if !exists(tx, cockpitKey(cockpit)) {
			return errUnchanged
		}
		line := ev
		line.At, line.Op, line.Path, line.PID, line.UID = stamp(e.now()), c.Op, c.Path, c.PID, c.UID
		return appendEvent(tx, cockpit, level, line)
	})
	e.cockpits.end()
	switch {
	case errors.Is(err, errUnchanged):
		return nil
	case err != nil:
		return err
	}
	// The line is a change of its events file: the cockpit's waiters hear of it.
	if level == cockpitLevel {
		e.cockpitChanges.publish(cockpitKey(cockpit))
	} else {
		e.cockpitChanges.publish(stackKey(cockpit, stack))
	}
	return nil
}
