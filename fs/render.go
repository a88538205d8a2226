package fs

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/portlock"
)

// Renderers of the read side of SPEC §2: each reads one snapshot and formats it.

func notFound(format string, args ...any) error {
	return &engine.Refusal{Code: engine.NotFound, Message: fmt.Sprintf(format, args...)}
}

// stamp is the time a record's stamp names. The last one parsed is kept: every file of a stack
// carries its record's updatedAt, and parsing it strictly cost more than rendering most of them.
func stamp(s string) time.Time {
	if last := lastStamp.Load(); last != nil && last.text == s {
		return last.time
	}
	t, _ := engine.ParseStamp(s)
	lastStamp.Store(&parsedStamp{s, t})
	return t
}

type parsedStamp struct {
	text string
	time time.Time
}

var lastStamp atomic.Pointer[parsedStamp]

func (f *FS) readme() (view, error) {
	return view{data: []byte(readmeText), mtime: f.started, uid: f.uid}, nil
}

// statusView is the root file format shows (engine.StatusFile), per open: holders' liveness is
// observed at each.
func (f *FS) statusView(format engine.StatusFormat) render {
	return func() (view, error) {
		data, updatedAt, err := f.eng.StatusFile(format)
		if err != nil {
			return view{}, err
		}
		mtime := f.started
		if updatedAt != "" {
			mtime = stamp(updatedAt)
		}
		return view{data: data, mtime: mtime, uid: f.uid}, nil
	}
}

func (f *FS) portView(port int) render {
	return func() (view, error) {
		o, leased, err := f.eng.PortOwner(port)
		if err != nil {
			return view{}, err
		}
		if leased {
			r, err := f.eng.Stack(o.Cockpit, o.Stack)
			if err != nil {
				return view{}, err
			}
			line := fmt.Sprintf("cockpit=%s stack=%s key=%s offset=%d\n", o.Cockpit, o.Stack, o.Key, o.Offset)
			if h, ok := f.eng.ForeignHold(port); ok {
				// Leased here but held elsewhere: taken by another daemon while this one was
				// down, never shared.
				line += "conflict: " + foreignLine(h)
			}
			return view{data: []byte(line), mtime: stamp(r.UpdatedAt), uid: f.uid}, nil
		}
		if h, ok := f.eng.ForeignHold(port); ok {
			return view{data: []byte(foreignLine(h)), mtime: f.started, uid: h.UID}, nil
		}
		return view{}, notFound("port %d is not leased", port)
	}
}

func (f *FS) configView(cockpit string) render {
	return func() (view, error) {
		info, err := f.eng.Cockpit(cockpit)
		if err != nil {
			return view{}, err
		}
		return view{data: []byte(info.Config), mtime: stamp(info.UpdatedAt), uid: info.UID}, nil
	}
}

// eventsFile is the events file of (cockpit, stack): opens follow it as it grows.
func (f *FS) eventsFile(path, cockpit, stack string) *file {
	events := f.newFile(path, cockpit, stack, f.eventsView(cockpit, stack), nil)
	events.follows = true
	return events
}

func (f *FS) eventsView(cockpit, stack string) render {
	return func() (view, error) {
		info, err := f.eng.Cockpit(cockpit)
		if err != nil {
			return view{}, err
		}
		mtime := stamp(info.UpdatedAt)
		var revision int64
		if stack != "" {
			r, err := f.eng.Stack(cockpit, stack)
			if err != nil {
				return view{}, err
			}
			mtime, revision = stamp(r.UpdatedAt), r.Revision
		}
		data, start, seqs, err := f.eng.EventsWindow(cockpit, stack)
		if err != nil {
			return view{}, err
		}
		// Refusals append lines without changing the record, so the newest line dates the file.
		if t := lastEventTime(data); t.After(mtime) {
			mtime = t
		}
		return view{data: data, mtime: mtime, uid: info.UID, revision: revision, start: start, seqs: seqs}, nil
	}
}

func lastEventTime(data []byte) time.Time {
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	var e struct {
		At string `json:"at"`
	}
	if len(lines) == 0 || json.Unmarshal(lines[len(lines)-1], &e) != nil {
		return time.Time{}
	}
	return stamp(e.At)
}

// stackView renders a file of the stack from its record; fn returning nil means the file does
// not exist in that record.
func (f *FS) stackView(cockpit, stack, name string, fn func(engine.Record) []byte) render {
	return func() (view, error) {
		r, err := f.eng.Stack(cockpit, stack)
		if err != nil {
			return view{}, err
		}
		data := fn(r)
		if data == nil {
			return view{}, notFound("%s does not exist now", name)
		}
		return view{data: data, mtime: stamp(r.UpdatedAt), uid: f.stackUID(r), revision: r.Revision}, nil
	}
}

// stackUID is who owns a stack's files (the engine's rule), the daemon's user when it cannot
// be told.
func (f *FS) stackUID(r engine.Record) uint32 {
	if uid, ok := f.eng.StackOwner(r); ok {
		return uid
	}
	return f.uid
}

// holderView renders holder name, probing its process for its state; claimed, when given, is the
// claim that added it, whose observation is the state while the holder is still as it recorded it.
func (f *FS) holderView(cockpit, stack, name string, claimed *engine.Claimed) render {
	return func() (view, error) {
		if claimed != nil && f.eng.Shared() {
			// The holder as the claim committed it: over a shared store reading it back would
			// cost a round trip to etcd for what this daemon has just written.
			h := claimed.Holder
			return view{data: renderHolder(h, claimed.State), mtime: stamp(h.ClaimedAt), uid: h.UID, revision: claimed.Revision}, nil
		}
		r, err := f.eng.Stack(cockpit, stack)
		if err != nil {
			return view{}, err
		}
		h, ok := r.Value.Holder(name)
		if !ok {
			return view{}, notFound("holder %s does not exist", name)
		}
		var state string
		if claimed != nil && claimed.Holder == h {
			state = claimed.State
		} else {
			state = f.eng.HolderState(h)
		}
		return view{data: renderHolder(h, state), mtime: stamp(h.ClaimedAt), uid: h.UID, revision: r.Revision}, nil
	}
}

// renderHolder is a holder file's content, appended without fmt (the created holder's open renders
// one at every claim; TestRenderHolderIsFmts), each value engine.Printable: a checkout path with a
// newline or ESC in it stays one line, which no terminal acts on.
func renderHolder(h engine.Holder, state string) []byte {
	b := make([]byte, 0, 256+len(h.CheckoutPath))
	for _, f := range [...]struct{ key, value string }{{"name=", h.Name}, {"\nid=", h.HolderID}, {"\ncheckout=", h.CheckoutID},
		{"\ncheckout_path=", engine.Printable(h.CheckoutPath)}, {"\nclaimed_at=", h.ClaimedAt}} {
		b = append(append(b, f.key...), f.value...)
	}
	if h.PID == 0 {
		b = append(b, "\npid=none"...)
	} else {
		b = strconv.AppendInt(append(b, "\npid="...), int64(h.PID), 10)
	}
	if h.ProcessStart != "" {
		b = append(append(b, "\nprocess_start="...), h.ProcessStart...)
	}
	b = append(append(append(b, "\nstate="...), state...), "\nuid="...)
	return append(strconv.AppendUint(b, uint64(h.UID), 10), '\n')
}

func (f *FS) leasePortView(cockpit, stack, key string) render {
	return f.stackView(cockpit, stack, "ports/"+key, func(r engine.Record) []byte {
		if !r.Value.Lease.Active() {
			return nil
		}
		port, ok := r.Value.Lease.Ports[key]
		if !ok {
			return nil
		}
		return []byte(strconv.Itoa(port) + "\n")
	})
}

func (f *FS) entrypointView(cockpit, stack, name string) render {
	return f.configuredView(cockpit, stack, "entrypoints/"+name, func(r engine.Record, info engine.CockpitInfo) []byte {
		for _, e := range r.EntrypointsFor(info) {
			if e.Name == name {
				return []byte(e.URL + "\n")
			}
		}
		return nil
	})
}

// configuredView renders a file of the stack from its record and its cockpit's current config
// (env, entrypoints): it changes with either, so its mtime is the later of the two.
func (f *FS) configuredView(cockpit, stack, name string, fn func(engine.Record, engine.CockpitInfo) []byte) render {
	return func() (view, error) {
		info, err := f.eng.Cockpit(cockpit)
		if err != nil {
			return view{}, err
		}
		v, err := f.stackView(cockpit, stack, name, func(r engine.Record) []byte { return fn(r, info) })()
		if t := stamp(info.UpdatedAt); err == nil && t.After(v.mtime) {
			v.mtime = t
		}
		return v, err
	}
}

// entrypointsJSONView renders entrypoints.json: the seeds' deriveEntrypoints result for the
// stack's lease, the current config and the stack's declared values, with the mtime of the
// latest of the three.
func (f *FS) entrypointsJSONView(cockpit, stack string) render {
	return func() (view, error) {
		dv, err := f.eng.DeclaredValues(cockpit, stack)
		if err != nil {
			return view{}, err
		}
		v, err := f.configuredView(cockpit, stack, "entrypoints.json", func(r engine.Record, info engine.CockpitInfo) []byte {
			result := r.DeriveEntrypoints(info.Entrypoints, info.BaseOrder, dv.Values)
			if result == nil {
				return nil
			}
			for i, v := range result.Values { // beside each URL, the proxy's for it when it serves
				result.Values[i].Proxied = info.ProxiedURL(stack, v.Name, v.Value)
			}
			data, _ := json.Marshal(result)
			return append(data, '\n')
		})()
		if t := stamp(dv.UpdatedAt); err == nil && t.After(v.mtime) {
			v.mtime = t
		}
		return v, err
	}
}

// declaredValuesView renders declared-values: the document last accepted (empty before), owned
// by the cockpit's owner, dated when it was written (the cockpit's creation before).
func (f *FS) declaredValuesView(cockpit, stack string) render {
	return func() (view, error) {
		info, err := f.eng.Cockpit(cockpit)
		if err != nil {
			return view{}, err
		}
		dv, err := f.eng.DeclaredValues(cockpit, stack)
		if err != nil {
			return view{}, err
		}
		at := cmp.Or(dv.UpdatedAt, info.CreatedAt)
		return view{data: []byte(dv.Text), mtime: stamp(at), uid: info.UID}, nil
	}
}

func renderEnv(r engine.Record, info engine.CockpitInfo) []byte {
	env := r.EnvFor(info)
	if env == nil {
		return nil
	}
	var b bytes.Buffer
	for _, v := range env {
		fmt.Fprintf(&b, "%s=%s\n", v.Name, v.Value)
	}
	return b.Bytes()
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func renderLease(r engine.Record) []byte {
	l := r.Value.Lease
	if l == nil {
		return []byte{}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "offset=%d\nstep=%d\ncount=%d\nreleased=%t\n", l.Offset, l.Declaration.Step, l.Declaration.Count, l.Released)
	for _, k := range sortedKeys(l.Ports) {
		fmt.Fprintf(&b, "%s=%d\n", k, l.Ports[k])
	}
	return b.Bytes()
}

// renderRecord is the record as JSON, engine.PrintableJSON: a checkout path's C1 control
// reaches no terminal.
func renderRecord(r engine.Record) []byte {
	data, _ := json.MarshalIndent(r, "", "  ")
	return append(engine.PrintableJSON(data), '\n')
}

func renderRevision(r engine.Record) []byte {
	return []byte(strconv.FormatInt(r.Revision, 10) + "\n")
}

const readmeText = `cockpitfs: coordinate copies of a development environment through plain files.

  mkdir <cockpit>                          a namespace per project
  cat > <cockpit>/config                   the port declaration (TOML: [ports] step, count, [ports.bases])
  mkdir <cockpit>/stacks/<stack>           a stack (one worktree's environment)
  touch <cockpit>/stacks/<stack>/holders/<me>   claim it: leases a port family
  cat <cockpit>/stacks/<stack>/env         KEY=port lines for docker compose --env-file
  rm <cockpit>/stacks/<stack>/holders/<me> release a co-tenant's claim
  echo down > <cockpit>/stacks/<stack>/drain/request   stop the stack (then drain/attempt, drain/outcome)
  echo stop > <cockpit>/stacks/<stack>/drain/attempt   the daemon stops what the stack runs, as you may
  cat gc                                   stale stacks (holders dead, checkouts gone); echo run > gc drains them
  ls ports/                                every port leased on this machine
  cat status                               every cockpit, stack, port, holder and drain (status.json: JSON)
  cat <cockpit>/events                     why something was refused (code, message, fix)
`

// foreignLine describes a port another process holds: another daemon's lease (which daemon, uid,
// data directory and lease, as it answers), or a process that is not cockpitfs.
func foreignLine(h portlock.Holder) string {
	pid, uid := "unknown", "unknown"
	if h.Known {
		pid, uid = strconv.Itoa(h.PID), strconv.FormatUint(uint64(h.UID), 10)
	}
	if h.Identity == nil {
		return fmt.Sprintf("daemon=none pid=%s uid=%s\n", pid, uid)
	}
	id := h.Identity
	return fmt.Sprintf("daemon=other pid=%s uid=%s data=%s mount=%s cockpit=%s stack=%s key=%s\n", pid, uid, portlock.Quoted(id.Data), portlock.Quoted(id.Mount), id.Cockpit, id.Stack, id.Key)
}

// contentTimes keep a record-derived file's mtime while its content stays the same. Such a file
// takes its time from the record's last change, and most changes of a record (a co-tenant's
// claim or release) leave env, lease, ports and entrypoints as they were: their mtime is the time
// of the change that produced their content (spec §2), so make and editors see no change that is
// not one. Kept in memory, per path, by a hash of the content: after a restart a file's time is
// its record's last change until its content changes again.
type contentTimes struct {
	mu sync.Mutex
	by map[string]contentTime
}

type contentTime struct {
	sum   uint64
	mtime time.Time
}

// contentTimesKept bounds the paths remembered: past it they start again, each file showing its
// record's time once more.
const contentTimesKept = 1 << 16

// steady is r with the mtime its content first had.
func (c *contentTimes) steady(path string, r render) render {
	return func() (view, error) {
		v, err := r()
		if err != nil {
			return v, err
		}
		h := fnv.New64a()
		h.Write(v.data)
		sum := h.Sum64()
		c.mu.Lock()
		defer c.mu.Unlock()
		if kept, ok := c.by[path]; ok && kept.sum == sum {
			v.mtime = kept.mtime
			return v, nil
		}
		if c.by == nil || len(c.by) >= contentTimesKept {
			c.by = map[string]contentTime{}
		}
		c.by[path] = contentTime{sum: sum, mtime: v.mtime}
		return v, nil
	}
}
