package fs

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"

	"github.com/cockpitfs/cockpitfs/engine"
)

// drainListing is a stack's drain/: four control files; unlinking request cancels.
type drainListing struct{}

// drainFile is one control file of drain/: what a read shows and the command a write applies.
type drainFile struct {
	name  string
	show  func(engine.Record) []byte
	apply func(ctx context.Context, f *file, h *handle, c engine.Caller, text string) error
}

var drainFiles = []drainFile{
	{name: "attempt", show: showAttempt, apply: startAttempt},
	{name: "outcome", show: showNothing, apply: publishOutcome},
	{name: "repair", show: showNothing, apply: repairAttempt},
	{name: "request", show: showRequest, apply: reserveDrain},
}

func (drainListing) entries(_ context.Context, d *dir) ([]entry, error) {
	if _, err := d.fsys.eng.Stack(d.cockpit, d.stack); err != nil {
		return nil, err
	}
	es := make([]entry, len(drainFiles), len(drainFiles)+1)
	for i, df := range drainFiles {
		es[i] = entry{name: df.name, node: d.fsys.newFile(d.child(df.name), d.cockpit, d.stack,
			d.fsys.stackView(d.cockpit, d.stack, "drain/"+df.name, df.show), drainWriter{df})}
	}
	planning := entry{name: "planning", node: d.fsys.newFile(d.child("planning"), d.cockpit, d.stack,
		d.fsys.stackView(d.cockpit, d.stack, "drain/planning", showPlanning), nil)}
	return append(es, planning), nil
}

func (drainListing) unlink(ctx context.Context, d *dir, name string) syscall.Errno {
	c := caller(ctx, "unlink", d.child(name))
	if name != "request" {
		return d.fsys.undefined(ctx, "unlink", d.child(name), d.cockpit, d.stack)
	}
	if err := d.fsys.eng.CancelDrain(ctx, c, d.cockpit, d.stack); err != nil {
		return d.fsys.fail(c, d.cockpit, d.stack, err)
	}
	return 0
}

func jsonLine(v any) []byte {
	data, _ := json.Marshal(v)
	return append(engine.PrintableJSON(data), '\n')
}

func showRequest(r engine.Record) []byte {
	if r.Value.Drain == nil {
		return []byte{}
	}
	return jsonLine(r.Value.Drain)
}

func showAttempt(r engine.Record) []byte {
	if r.Value.Drain == nil || r.Value.Drain.Attempt == nil {
		return []byte{}
	}
	// A failed reclaim also says what is done, what failed and what is left.
	return jsonLine(struct {
		*engine.Attempt
		Recovery *engine.ReclaimRecovery `json:"recovery,omitempty"`
	}{r.Value.Drain.Attempt, engine.FailedReclaimRecovery(r.Value.Drain)})
}

// showPlanning is the record the active reclaim was planned from (the seeds' reclaimDrainStep
// planningRecord), as record shows records; empty while no reclaim attempt is active.
func showPlanning(r engine.Record) []byte {
	p, ok := r.PlanningRecord()
	if !ok {
		return []byte{}
	}
	return renderRecord(p)
}

func showNothing(engine.Record) []byte { return []byte{} }

// drainWriter applies drain commands, each whole lines (see pendingCommand).
type drainWriter struct{ drainFile }

func (w drainWriter) write(ctx context.Context, f *file, h *handle, data []byte, _ int64) error {
	text, whole, err := pendingCommand(h, data)
	if err != nil || !whole {
		return err
	}
	return w.command(ctx, f, h, text)
}

func (w drainWriter) command(ctx context.Context, f *file, h *handle, text string) error {
	return w.apply(ctx, f, h, caller(ctx, "write", f.path), text)
}

func reserveDrain(ctx context.Context, f *file, h *handle, c engine.Caller, text string) error {
	req, err := engine.ParseDrainRequest(text)
	if err != nil {
		return err
	}
	return f.fsys.eng.ReserveDrain(ctx, c, f.cockpit, f.stack, req, h.view.revision)
}

func startAttempt(ctx context.Context, f *file, _ *handle, c engine.Caller, text string) error {
	if strings.TrimSpace(text) == "stop" {
		// The daemon runs the runtime-stop action itself (docs/drains.md, "The stop step").
		_, err := f.fsys.exec.StopAttempt(ctx, c, f.cockpit, f.stack)
		return err
	}
	pid, err := engine.ParseAttemptCommand(text)
	if err != nil {
		return err
	}
	return f.fsys.eng.StartAttempt(ctx, c, f.cockpit, f.stack, pid)
}

func publishOutcome(ctx context.Context, f *file, _ *handle, c engine.Caller, text string) error {
	o, err := engine.ParseOutcomeCommand(text)
	if err != nil {
		return err
	}
	return f.fsys.eng.PublishOutcome(ctx, c, f.cockpit, f.stack, o)
}

func repairAttempt(ctx context.Context, f *file, _ *handle, c engine.Caller, text string) error {
	if err := engine.ParseRepairCommand(text); err != nil {
		return err
	}
	return f.fsys.eng.Repair(ctx, c, f.cockpit, f.stack)
}
