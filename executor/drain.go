package executor

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/portdecl"
)

// Executor runs drain actions inside the daemon, through eng's use cases.
type Executor struct {
	eng *engine.Engine
	// self is the daemon's own pid: never stopped.
	self int
	// mount is the daemon's mount point, absolute: gc looks at no checkout below it.
	mount string

	lookersMu sync.Mutex
	lookers   map[uint32]*looker // by uid: see checkouts
}

// New returns the executor of the daemon serving eng at mount.
func New(eng *engine.Engine, mount string) *Executor {
	return &Executor{eng: eng, self: os.Getpid(), mount: mount, lookers: map[uint32]*looker{}}
}

const runtimeStop = "runtime-stop"

// StopAttempt runs the reserved drain's next action, which must be its runtime-stop, with the
// writer c as its executor: it starts the attempt, stops what the stack runs (see stopStack) and
// publishes the outcome: success, or failure when a process it signalled survived SIGKILL.
func (x *Executor) StopAttempt(ctx context.Context, c engine.Caller, cockpit, stack string) ([]Stopped, error) {
	r, err := x.eng.Stack(cockpit, stack)
	if err != nil {
		return nil, err
	}
	if d := r.Value.Drain; d != nil && d.CompletedActionCount < len(d.Actions) && d.Actions[d.CompletedActionCount].Stage != runtimeStop {
		a := d.Actions[d.CompletedActionCount]
		return nil, &engine.Refusal{Code: engine.StateRecordMalformed, Target: r.SubjectID,
			Message: fmt.Sprintf("the drain's next action is %s of %s, not %s: stop runs only the runtime-stop", a.Stage, a.TargetID, runtimeStop),
			Fix:     "echo start > drain/attempt, do the work, then echo success > drain/outcome"}
	}
	return x.stopStack(ctx, c, r, r.Value.Holders, []uint32{c.UID})
}

// stopStack starts an attempt of the drain reserved in r's stack with c's process as its
// executor, signals the processes the stack runs as each uid of as may (Find, Stop: those
// listening on the lease's ports and the members of holders' process groups, never c's own
// process, its ancestors, the daemon, or a process listening on another stack's leased port),
// records each in the stack's events, and publishes the attempt's outcome. as is c's uid for a
// stop its writer asks for; gc's sweep names more (sweepers).
func (x *Executor) stopStack(ctx context.Context, c engine.Caller, r engine.Record, holders []engine.Holder, as []uint32) ([]Stopped, error) {
	cockpit, stack := r.Cockpit, r.Stack
	at := func(name string) engine.Caller {
		c := c
		c.Path = cockpit + "/stacks/" + stack + "/drain/" + name
		return c
	}
	if err := x.eng.StartAttempt(ctx, at("attempt"), cockpit, stack, c.PID); err != nil {
		return nil, err
	}
	started, err := x.eng.Stack(cockpit, stack)
	if err != nil {
		return nil, err
	}
	if started.Value.Drain == nil || started.Value.Drain.Attempt == nil {
		return nil, fmt.Errorf("%s/%s: the attempt just started is not recorded", cockpit, stack)
	}
	attemptID := started.Value.Drain.Attempt.AttemptID
	var ports []int
	if l := r.Value.Lease; l != nil {
		for _, p := range l.Ports {
			ports = append(ports, p)
		}
	}
	others := map[int]string{}
	if owners, err := x.eng.Ports(); err == nil {
		for _, o := range owners {
			if o.Cockpit != cockpit || o.Stack != stack {
				others[o.Port] = o.Cockpit + "/stacks/" + o.Stack
			}
		}
	}
	exclude := ancestors(c.PID)
	exclude[x.self] = true
	targets, err := Find(ports, others, holderGroups(holders), exclude)
	if err != nil {
		return nil, err
	}
	stopped := Stop(targets, as, x.stopGrace(cockpit))
	var actingFor string
	if len(as) != 1 || as[0] != c.UID {
		uids := make([]string, len(as))
		for i, uid := range as {
			uids[i] = strconv.FormatUint(uint64(uid), 10)
		}
		actingFor = " (gc stops only what each of uids " + strings.Join(uids, ", ") + " may signal: the stack's creator, its cockpit's owner, its holders' and its drain's)"
	}
	outcome := engine.Outcome{Success: true, AttemptID: attemptID}
	for _, s := range stopped {
		if s.Result == "survived SIGKILL" {
			outcome.Success = false
		}
		if s.Result == "not signalled" && s.Errno != "" {
			who := fmt.Sprintf("process %d (%s, uid %d, %s)", s.PID, s.Command, s.UID, strings.Join(s.Why, ", "))
			if s.PID == 0 {
				who = fmt.Sprintf("a process the daemon cannot see (uid %d, %s)", s.UID, strings.Join(s.Why, ", "))
			}
			_ = x.eng.LogRefusal(at("attempt"), cockpit, stack, &engine.Refusal{Code: engine.PermissionDenied,
				Message: fmt.Sprintf("stop: %s is not one uid %d may signal: not signalled%s", who, s.DeniedTo, actingFor),
				Fix:     fmt.Sprintf("stop it as uid %d or root", s.UID)}, s.Errno, 0)
			continue
		}
		_ = x.eng.LogStopped(at("attempt"), cockpit, stack, "stop: process "+s.String())
	}
	return stopped, x.eng.PublishOutcome(ctx, at("outcome"), cockpit, stack, outcome)
}

// stopGrace is the cockpit's [stop] grace.
func (x *Executor) stopGrace(cockpit string) time.Duration {
	return lifecycleOf(x.eng, cockpit).StopGrace()
}

// lifecycleOf is the cockpit's [gc] and [stop], their defaults when it cannot be read.
func lifecycleOf(eng *engine.Engine, cockpit string) portdecl.Lifecycle {
	info, err := eng.Cockpit(cockpit)
	if err != nil {
		return portdecl.Lifecycle{}
	}
	cfg, err := portdecl.Parse([]byte(info.Config))
	if err != nil {
		return portdecl.Lifecycle{}
	}
	return cfg.Lifecycle
}

// holderGroups are the process groups of the holders with a process: the group of its process
// while it runs as recorded; once it is gone, the group it led (its pid) in the session it led,
// whose members outlive it (a dev server a closed terminal's job left behind). A holder whose pid
// now belongs to another process names no group.
func holderGroups(holders []engine.Holder) map[int]Group {
	groups := map[int]Group{}
	for _, h := range holders {
		if h.PID <= 0 {
			continue
		}
		st, running := readStat(h.PID)
		switch {
		case !running:
			groups[h.PID] = Group{Holder: h.Name, Session: h.PID}
		case strings.HasSuffix(h.ProcessStart, ":"+st.start):
			groups[st.pgrp] = Group{Holder: h.Name}
		}
	}
	return groups
}

// ancestors is pid and every process above it: the writer of a stop, and whatever waits for it
// (make, a shell, cockpitfs exec), which it must not end.
func ancestors(pid int) map[int]bool {
	out := map[int]bool{}
	for pid > 1 && !out[pid] {
		out[pid] = true
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			break
		}
		text := string(data)
		fields := strings.Fields(text[strings.LastIndexByte(text, ')')+1:])
		if len(fields) < 2 {
			break
		}
		if pid, err = strconv.Atoi(fields[1]); err != nil {
			break
		}
	}
	return out
}
