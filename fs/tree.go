package fs

import (
	"context"
	"slices"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
)

// The directories of SPEC §2, each a listing.

type rootListing struct{}

func (rootListing) namesAppearOnlyThroughOwnOps() {}

func (rootListing) entries(_ context.Context, d *dir) ([]entry, error) {
	f := d.fsys
	cockpits, err := f.eng.Cockpits()
	if err != nil {
		return nil, err
	}
	es := rootFiles(f)
	for _, c := range cockpits {
		es = append(es, cockpitEntry(f, c.Name))
	}
	return es, nil
}

// rootFiles are the root's own names; a cockpit cannot take them.
func rootFiles(f *FS) []entry {
	return []entry{
		{name: "README", node: f.newFile("README", "", "", f.readme, nil)},
		{name: "status", node: f.newFile("status", "", "", f.statusView(engine.StatusTable), nil)},
		{name: "status.json", node: f.newFile("status.json", "", "", f.statusView(engine.StatusJSON), nil)},
		{name: "ports", node: f.newDir("ports", "", "", portsListing{}), dir: true},
		{name: "gc", node: f.gcFile()},
	}
}

func cockpitEntry(f *FS, name string) entry {
	return entry{name: name, node: f.newDir(name, name, "", cockpitListing{}), dir: true}
}

func (rootListing) lookup(_ context.Context, d *dir, name string) (entry, bool, error) {
	for _, e := range rootFiles(d.fsys) {
		if e.name == name {
			return e, true, nil
		}
	}
	_, err := d.fsys.eng.Cockpit(name)
	return cockpitEntry(d.fsys, name), err == nil, err
}

func (rootListing) mkdir(ctx context.Context, d *dir, name string) syscall.Errno {
	c := caller(ctx, "mkdir", name)
	if err := d.fsys.eng.CreateCockpit(ctx, c, name); err != nil {
		return d.fsys.fail(c, "", "", err)
	}
	return 0
}

func (rootListing) rmdir(ctx context.Context, d *dir, name string) syscall.Errno {
	c := caller(ctx, "rmdir", name)
	if err := d.fsys.eng.RemoveCockpit(ctx, c, name); err != nil {
		return d.fsys.fail(c, name, "", err)
	}
	d.fsys.scratch.forgetCockpit(name)
	return 0
}

type portsListing struct{}

func (portsListing) entries(_ context.Context, d *dir) ([]entry, error) {
	f := d.fsys
	owners, err := f.eng.Ports()
	if err != nil {
		return nil, err
	}
	// The machine's other holders too: other daemons' leases, and whatever else holds a port.
	foreign, err := f.eng.ForeignHolds()
	if err != nil {
		return nil, err
	}
	ports := make([]int, 0, len(owners)+len(foreign))
	for _, o := range owners {
		ports = append(ports, o.Port)
	}
	for _, h := range foreign {
		ports = append(ports, h.Port)
	}
	slices.Sort(ports)
	ports = slices.Compact(ports)
	es := make([]entry, len(ports))
	for i, port := range ports {
		es[i] = entry{name: strconv.Itoa(port), node: f.newFile(d.child(strconv.Itoa(port)), "", "", f.portView(port), nil)}
	}
	return es, nil
}

// lookup finds one port by its key in the index, not by listing them all: `ls -l ports` looks up
// every name, which listing would make quadratic.
func (portsListing) lookup(_ context.Context, d *dir, name string) (entry, bool, error) {
	f := d.fsys
	port, err := strconv.Atoi(name)
	if err != nil || strconv.Itoa(port) != name {
		return entry{}, false, nil
	}
	_, leased, err := f.eng.PortOwner(port)
	if err != nil {
		return entry{}, false, err
	}
	if !leased {
		if _, held := f.eng.ForeignHold(port); !held {
			return entry{}, false, nil
		}
	}
	return entry{name: name, node: f.newFile(d.child(name), "", "", f.portView(port), nil)}, true, nil
}

type cockpitListing struct{}

func (cockpitListing) entries(ctx context.Context, d *dir) ([]entry, error) {
	f, c := d.fsys, d.cockpit
	if _, err := f.eng.Cockpit(c); err != nil {
		return nil, err
	}
	return append([]entry{
		// unkept: a rename of config aside (cp --backup) moves the kernel's name to the backup, and a
		// replacement (replace.go) hides config from one process alone.
		{name: "config", node: f.newFile(d.child("config"), c, "", f.configView(c), configWriter{}), unkept: true},
		{name: "events", node: f.eventsFile(d.child("events"), c, "")},
		{name: "stacks", node: f.newDir(d.child("stacks"), c, "", stacksListing{}), dir: true},
		{name: "wait", node: f.newWaitFile(d.child("wait"), c, ""), unlisted: true},
	}, scratchEntries(ctx, d)...), nil
}

type stacksListing struct{}

func (stacksListing) namesAppearOnlyThroughOwnOps() {}

func (stacksListing) entries(_ context.Context, d *dir) ([]entry, error) {
	f := d.fsys
	stacks, err := f.eng.Stacks(d.cockpit)
	if err != nil {
		return nil, err
	}
	es := make([]entry, len(stacks))
	for i, s := range stacks {
		es[i] = stackEntry(d, s)
	}
	return es, nil
}

func stackEntry(d *dir, stack string) entry {
	return entry{name: stack, node: d.fsys.newDir(d.child(stack), d.cockpit, stack, stackListing{}), dir: true}
}

func (stacksListing) lookup(_ context.Context, d *dir, name string) (entry, bool, error) {
	_, err := d.fsys.eng.Stack(d.cockpit, name)
	return stackEntry(d, name), err == nil, err
}

func (stacksListing) mkdir(ctx context.Context, d *dir, name string) syscall.Errno {
	c := caller(ctx, "mkdir", d.child(name))
	if err := d.fsys.eng.CreateStack(ctx, c, d.cockpit, name); err != nil {
		return d.fsys.fail(c, d.cockpit, "", err)
	}
	d.fsys.made.note(d.child(name), c.PID)
	return 0
}

func (stacksListing) rmdir(ctx context.Context, d *dir, name string) syscall.Errno {
	c := caller(ctx, "rmdir", d.child(name))
	// The stack's last lines (its drain's), for those following its events to read before the
	// file's end.
	events := d.child(name) + "/events"
	last, rendered := view{}, false
	if d.fsys.followers.following(events) {
		if v, err := d.fsys.eventsView(d.cockpit, name)(); err == nil {
			last, rendered = v, true
		}
	}
	if err := d.fsys.eng.RemoveStack(ctx, c, d.cockpit, name); err != nil {
		return d.fsys.fail(c, d.cockpit, "", err)
	}
	if rendered {
		d.fsys.followers.catchUp(events, last)
	}
	return 0
}

type stackListing struct{}

func (stackListing) entries(_ context.Context, d *dir) ([]entry, error) {
	f, c, s := d.fsys, d.cockpit, d.stack
	r, err := f.eng.Stack(c, s)
	if err != nil {
		return nil, err
	}
	view := func(name string, fn func(engine.Record) []byte) entry {
		return frozenEntry(d, name, f.stackView(c, s, name, fn))
	}
	es := []entry{
		{name: "holders", node: f.newDir(d.child("holders"), c, s, holdersListing{}), dir: true},
		{name: "ports", node: f.newDir(d.child("ports"), c, s, leasePortsListing{}), dir: true},
		{name: "entrypoints", node: f.newDir(d.child("entrypoints"), c, s, entrypointsListing{}), dir: true},
		{name: "drain", node: f.newDir(d.child("drain"), c, s, drainListing{}), dir: true},
		view("lease", renderLease),
		view("record", renderRecord),
		view("revision", renderRevision),
		{name: "events", node: f.eventsFile(d.child("events"), c, s)},
		{name: "health", node: f.newFile(d.child("health"), c, s, f.healthView(c, s), nil)},
		{name: "declared-values", node: f.newFile(d.child("declared-values"), c, s, f.declaredValuesView(c, s), declaredValuesWriter{})},
		{name: "wait", node: f.newWaitFile(d.child("wait"), c, s), unlisted: true},
	}
	if r.Value.Lease.Active() {
		es = append(es, frozenEntry(d, "env", f.configuredView(c, s, "env", renderEnv)),
			frozenEntry(d, "entrypoints.json", f.entrypointsJSONView(c, s)))
	}
	return es, nil
}

// frozenEntry is a read-only file of d's stack rendered by r from the record alone (see
// entry.frozen).
func frozenEntry(d *dir, name string, r render) entry {
	path := d.child(name)
	return entry{name: name, node: d.fsys.newFile(path, d.cockpit, d.stack, d.fsys.contentTimes.steady(path, r), nil), frozen: true}
}

type holdersListing struct{}

func (holdersListing) namesAppearOnlyThroughOwnOps() {}

func (holdersListing) entries(_ context.Context, d *dir) ([]entry, error) {
	r, err := d.fsys.eng.Stack(d.cockpit, d.stack)
	if err != nil {
		return nil, err
	}
	es := make([]entry, len(r.Value.Holders))
	for i, h := range r.Value.Holders {
		es[i] = holderEntry(d, h.Name)
	}
	sort.Slice(es, func(i, j int) bool { return es[i].name < es[j].name })
	return es, nil
}

func (holdersListing) lookup(_ context.Context, d *dir, name string) (entry, bool, error) {
	r, err := d.fsys.eng.Stack(d.cockpit, d.stack)
	if err != nil {
		return entry{}, false, err
	}
	if _, ok := r.Value.Holder(name); !ok {
		return entry{}, false, nil // a claim's create looks its name up first
	}
	return holderEntry(d, name), true, nil
}

func holderEntry(d *dir, name string) entry {
	f := d.fsys
	node := f.newFile(d.child(name), d.cockpit, d.stack, f.holderView(d.cockpit, d.stack, name, nil), holderWriter{name: name})
	return entry{name: name, node: node, unkept: true}
}

// knowsCreated is a creator that knows the entry its create made without reading it back.
type knowsCreated interface {
	created(d *dir, name string) entry
}

func (holdersListing) created(d *dir, name string) entry { return holderEntry(d, name) }

// create claims the stack for a new holder (§4). The create's open shows the holder in the state
// the claim just observed its process in, rather than probing it again.
func (holdersListing) create(ctx context.Context, d *dir, name string, _ uint32) (render, error) {
	if editorScratch(name) && !engine.ValidName(name) {
		return nil, errUndefined // an editor's swap or lock file beside a holder it edits: no claim, no line
	}
	claimed, err := d.fsys.eng.ClaimObserved(ctx, caller(ctx, "create", d.child(name)), d.cockpit, d.stack, name, nil)
	if err != nil || claimed == nil {
		return nil, err
	}
	return d.fsys.holderView(d.cockpit, d.stack, name, claimed), nil
}

// unlink releases the holder's claim (§4).
func (holdersListing) unlink(ctx context.Context, d *dir, name string) syscall.Errno {
	c := caller(ctx, "unlink", d.child(name))
	if err := d.fsys.eng.Release(context.WithValue(ctx, unlinkedName{}, name), c, d.cockpit, d.stack, name); err != nil {
		return d.fsys.fail(c, d.cockpit, d.stack, err)
	}
	return 0
}

type leasePortsListing struct{}

func (leasePortsListing) entries(_ context.Context, d *dir) ([]entry, error) {
	f := d.fsys
	r, err := f.eng.Stack(d.cockpit, d.stack)
	if err != nil || !r.Value.Lease.Active() {
		return nil, err
	}
	var es []entry
	for key := range r.Value.Lease.Ports {
		es = append(es, leasePortEntry(d, key))
	}
	sort.Slice(es, func(i, j int) bool { return es[i].name < es[j].name })
	return es, nil
}

func (leasePortsListing) lookup(_ context.Context, d *dir, key string) (entry, bool, error) {
	r, err := d.fsys.eng.Stack(d.cockpit, d.stack)
	if err != nil {
		return entry{}, false, err
	}
	if !r.Value.Lease.Active() {
		return entry{}, false, nil
	}
	_, ok := r.Value.Lease.Ports[key]
	return leasePortEntry(d, key), ok, nil
}

func leasePortEntry(d *dir, key string) entry {
	return frozenEntry(d, key, d.fsys.leasePortView(d.cockpit, d.stack, key))
}

type entrypointsListing struct{}

func (entrypointsListing) entries(_ context.Context, d *dir) ([]entry, error) {
	f := d.fsys
	r, err := f.eng.Stack(d.cockpit, d.stack)
	if err != nil {
		return nil, err
	}
	info, err := f.eng.Cockpit(d.cockpit)
	if err != nil {
		return nil, err
	}
	var es []entry
	for _, e := range r.Entrypoints(info.Entrypoints) {
		es = append(es, frozenEntry(d, e.Name, f.entrypointView(d.cockpit, d.stack, e.Name)))
	}
	return es, nil
}

// cockpitOwner is what directories inside a cockpit show as owner and time.
func (f *FS) cockpitOwner(cockpit string) (time.Time, uint32, bool) {
	if cockpit == "" {
		return time.Time{}, 0, false
	}
	info, err := f.eng.Cockpit(cockpit)
	if err != nil {
		return time.Time{}, 0, false
	}
	t, _ := engine.ParseStamp(info.CreatedAt)
	return t, info.UID, true
}
