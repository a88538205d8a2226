package fs

import (
	"context"
	"errors"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/storage"
)

// The errno boundary. Every FUSE operation defers guard, so a panic is EIO and a log line, never
// the mount's end. Every error an operation meets becomes an errno in errnoOf, the one mapping,
// and is reported once, in fail: a refusal as a line of the nearest events file, anything else
// as a log line with the whole error.

// errnos maps every refusal code to the errno SPEC §8 names.
var errnos = map[engine.Code]syscall.Errno{
	engine.StateRecordMalformed:         syscall.EINVAL,
	engine.PortFamilyOutOfRange:         syscall.EINVAL,
	engine.ClaimCoTenant:                syscall.EBUSY,
	engine.PortLeaseExhausted:           syscall.ENOSPC,
	engine.PortLeaseUIDLimit:            syscall.EDQUOT,
	engine.CockpitUIDLimit:              syscall.EDQUOT,
	engine.StackUIDLimit:                syscall.EDQUOT,
	engine.PortFamilyCollision:          syscall.EADDRINUSE,
	engine.PortListenerEvidenceInvalid:  syscall.EAGAIN,
	engine.ConfigChangedDuringExecution: syscall.ESTALE,
	engine.ExecutionPreconditionChanged: syscall.ESTALE,
	engine.LifecycleEvidenceInvalid:     syscall.ESTALE,
	engine.DrainAttemptRepairRequired:   syscall.ENOTRECOVERABLE,
	engine.StateLocked:                  syscall.EAGAIN,
	engine.MachineUnannounced:           syscall.EAGAIN,
	engine.StateRootUnavailable:         syscall.EIO,
	engine.ClaimHolderLimit:             syscall.ENOSPC,
	engine.StateInventoryLimit:          syscall.ENOSPC,
	engine.StateRecordTooLarge:          syscall.EFBIG,
	engine.PermissionDenied:             syscall.EACCES,
	engine.CommandTooLarge:              syscall.EFBIG,
	engine.UndefinedName:                syscall.EPERM,
	engine.NotFound:                     syscall.ENOENT,
	engine.Exists:                       syscall.EEXIST,
	engine.NotEmpty:                     syscall.ENOTEMPTY,
	engine.Unsupported:                  syscall.EPERM,
	engine.OpenSnapshotLimit:            syscall.ENOMEM,
	engine.WaitUIDLimit:                 syscall.ENOMEM,
	engine.ConfigEditLimit:              syscall.ENOSPC,
	engine.WriteAbandoned:               syscall.ECANCELED,
}

// errGone: a name the kernel holds was gone when the operation reached it (a holder released
// between a create's claim and its lookup, or between a lookup and an open). ESTALE has the
// kernel walk the path again, so `touch` creates it anew and `cat` reports ENOENT.
var errGone = errors.New("gone since the kernel looked it up")

// gone is err, or errGone when it says a name the kernel holds is missing.
func gone(err error) error {
	if errnoOf(err) == syscall.ENOENT {
		return errGone
	}
	return err
}

// errnoOf is the errno err returns to the caller: its refusal's, ESTALE for errGone, EINTR for
// the caller's own interrupt, ENOSPC for a store refusing on a full disk, EIO for anything else
// (a damaged store's storage.ErrCorrupt among them: never a guess at an answer).
func errnoOf(err error) syscall.Errno {
	var r *engine.Refusal
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errGone):
		return syscall.ESTALE
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	case errors.Is(err, storage.ErrNoSpace):
		return syscall.ENOSPC // nothing was written (and the events line waits for space too)
	case errors.Is(err, storage.ErrLocked):
		return syscall.EAGAIN // a read the store could not serve in time (etcd: no quorum)
	case errors.As(err, &r):
		if errno, ok := errnos[r.Code]; ok {
			return errno
		}
	}
	return syscall.EIO
}

// fail turns err into the errno the caller sees and reports it once: a refusal in the events file
// of (cockpit, stack) — the nearest one; stack "" is the cockpit's, cockpit "" has none — or, past
// its uid's budget of lines, counted there (logRefusal); and anything else in the log, and in that
// events file under its code (STATE_ROOT_UNAVAILABLE, or STATE_RECORD_MALFORMED for a stored value
// that does not decode). A refusal no events file
// takes is logged when it would otherwise leave no trace of its cause: one the store could not
// serve (STATE_LOCKED: etcd without a quorum cannot take the events line either), and an open
// past its uid's snapshot bound (status.json has no events file).
func (f *FS) fail(c engine.Caller, cockpit, stack string, err error) syscall.Errno {
	errno := errnoOf(err)
	if errors.Is(err, errGone) || errno == syscall.EINTR {
		return errno // nothing was refused: the kernel retries, or the caller gave up
	}
	logged := errno == syscall.EIO || errors.Is(err, storage.ErrNoSpace)
	if logged {
		f.log.Printf("%s %s: %v", c.Op, c.Path, err)
	}
	refusal := engine.AsRefusal(err)
	switch {
	case cockpit != "":
		f.logRefusal(refusalLine{c: c, cockpit: cockpit, stack: stack, refusal: refusal, errno: unix.ErrnoName(errno)}, logged)
	case (refusal.Code == engine.StateLocked || refusal.Code == engine.OpenSnapshotLimit || refusal.Code == engine.CockpitUIDLimit) && !logged:
		if more, ok := f.refusalLines.allow(c.UID, time.Now()); ok {
			if more > 0 {
				f.log.Printf("uid %d: %d more refusals were not logged (at most %d lines a %v)", c.UID, more, refusalLogLines, refusalLogWindow)
			}
			f.log.Printf("%s %s: %s %v", c.Op, c.Path, unix.ErrnoName(errno), refusal)
		}
	}
	return errno
}

// refusalLogWindow and refusalLogLines bound the log lines of refusals no events file takes, per
// uid: a user looping over a refused mkdir would otherwise write the log, which lives in the data
// directory beside the store, as fast as the daemon answers (2 MiB a second), until the disk is
// full and every user's commits fail. Past the bound a window's refusals are counted, and the
// count is logged before the next line logged.
const (
	refusalLogWindow = time.Minute
	refusalLogLines  = 10
)

// refusalLimiter counts each uid's logged refusal lines in the current window.
type refusalLimiter struct {
	mu    sync.Mutex
	since time.Time // the current window's start
	by    map[uint32]*refusalCount
}

type refusalCount struct{ logged, dropped int }

// allow says whether uid's refusal may be logged at now, and how many of its refusals were not
// logged before it (to be said first).
func (l *refusalLimiter) allow(uid uint32, now time.Time) (dropped int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.since) >= refusalLogWindow {
		// A new window; a count not yet said is said with the uid's next line logged.
		kept := map[uint32]*refusalCount{}
		for u, c := range l.by {
			if c.dropped > 0 {
				kept[u] = &refusalCount{dropped: c.dropped}
			}
		}
		l.since, l.by = now, kept
	}
	c := l.by[uid]
	if c == nil {
		c = &refusalCount{}
		l.by[uid] = c
	}
	if c.logged >= refusalLogLines {
		c.dropped++
		return 0, false
	}
	c.logged++
	dropped, c.dropped = c.dropped, 0
	return dropped, true
}

// failNoEvent is fail for an operation whose refusal no events file takes (a lookup, a stat, a
// read): what is logged names only the operation and the path, so the caller's process is not
// resolved for it (two syscalls, at every negative lookup before a claim's create).
func (f *FS) failNoEvent(op, path string, err error) syscall.Errno {
	return f.fail(engine.Caller{Op: op, Path: path}, "", "", err)
}

// guard turns a panic in a handler into EIO and a log line, so bad input never takes the mount
// down. Every handler defers it, with the path it serves and the name it is asked about ("" for
// the path itself): the line is written only on a panic, so no request builds it.
func (f *FS) guard(op, path, name string, errno *syscall.Errno) {
	if p := recover(); p != nil {
		if name != "" {
			path = childPath(path, name)
		}
		f.log.Printf("panic in %s %s: %v\n%s", op, path, p, debug.Stack())
		*errno = syscall.EIO
	}
}
