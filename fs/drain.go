package fs

import (
	"context"
	"encoding/json"
	"syscall"

	"github.com/cockpitfs/cockpitfs/engine"
)

// drainListing is a stack's drain/: four control files; unlinking request cancels.
type drainListing struct{}

var drainFiles = []string{"attempt", "outcome", "repair", "request"}

func (drainListing) entries(_ context.Context, d *dir) ([]entry, error) {
	if _, err := d.fsys.eng.Stack(d.cockpit, d.stack); err != nil {
		return nil, err
	}
	es := make([]entry, len(drainFiles))
	for i, name := range drainFiles {
		es[i] = entry{name: name, node: d.fsys.newFile(d.child(name), d.cockpit, d.stack,
			d.fsys.stackView(d.cockpit, d.stack, "drain/"+name, drainRenderers[name]), drainWriter{name: name})}
	}
	return es, nil
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
	return append(data, '\n')
}

var drainRenderers = map[string]func(engine.Record) []byte{
	"request": func(r engine.Record) []byte {
		if r.Value.Drain == nil {
			return []byte{}
		}
		return jsonLine(r.Value.Drain)
	},
	"attempt": func(r engine.Record) []byte {
		if r.Value.Drain == nil || r.Value.Drain.Attempt == nil {
			return []byte{}
		}
		return jsonLine(r.Value.Drain.Attempt)
	},
	"outcome": func(engine.Record) []byte { return []byte{} },
	"repair":  func(engine.Record) []byte { return []byte{} },
}

// drainWriter applies one drain command per write(2).
type drainWriter struct{ name string }

func (w drainWriter) write(ctx context.Context, f *file, h *handle, data []byte, _ int64) error {
	if len(data) > maxCommand {
		return tooLarge(len(data))
	}
	c := caller(ctx, "write", f.path)
	eng, text := f.fsys.eng, string(data)
	switch w.name {
	case "request":
		req, err := engine.ParseDrainRequest(text)
		if err != nil {
			return err
		}
		return eng.ReserveDrain(ctx, c, f.cockpit, f.stack, req, h.view.revision)
	case "attempt":
		pid, err := engine.ParseAttemptCommand(text)
		if err != nil {
			return err
		}
		return eng.StartAttempt(ctx, c, f.cockpit, f.stack, pid)
	case "outcome":
		success, attempt, err := engine.ParseOutcomeCommand(text)
		if err != nil {
			return err
		}
		return eng.PublishOutcome(ctx, c, f.cockpit, f.stack, success, attempt)
	default:
		if err := engine.ParseRepairCommand(text); err != nil {
			return err
		}
		return eng.Repair(ctx, c, f.cockpit, f.stack)
	}
}
