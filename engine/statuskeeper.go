package engine

import (
	"errors"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/cockpitfs/cockpitfs/storage"
)

// StatusFormat is one of the root files that show the machine at a glance.
type StatusFormat int

const (
	StatusTable StatusFormat = iota // status: one aligned table
	StatusJSON                      // status.json
	statusFormats
)

// StatusFile is the content of the root file format shows (status, status.json) and the latest
// change it shows (the file's mtime). The records are a snapshot of one moment; each holder's
// process (state, command) is observed now. The bytes are shared: they must not be modified.
func (e *Engine) StatusFile(format StatusFormat) (data []byte, updatedAt string, err error) {
	k := &e.status
	k.mu.Lock()
	defer k.mu.Unlock()
	st, err := k.current(e)
	if err != nil {
		return nil, "", err
	}
	if k.rendered[format] == nil {
		if format == StatusJSON {
			if k.rendered[format], err = st.JSON(); err != nil {
				k.rendered[format] = nil
				return nil, "", err
			}
		} else {
			k.rendered[format] = st.Table()
		}
	}
	return k.rendered[format], st.UpdatedAt, nil
}

// statusKeeper is the status kept from commits, as health's inventory is: every cockpit's
// metadata and each stack's row as its record has it (revision, lease, holders, drain), read
// whole at the first status read, then only the stacks and cockpits committed since
// (staleKeys), so a read costs what changed, not every stack on the machine. What a row shows of
// its holders' processes (state, command) is observed at every read, once per distinct process;
// each format's text is rendered again only when a row or an observation changed. Over a shared
// store (storage.Shared) other daemons' commits mark nothing here, so every read reads the
// records whole.
type statusKeeper struct {
	// stale are the stack and cockpit keys committed since the last read took them.
	stale staleKeys
	// mu orders status reads: each takes the stale keys and reads them in one View. It guards
	// the fields below and is held across that View, the observations and the rendering (LOCK
	// ORDERING 3).
	mu       sync.Mutex
	loaded   bool
	proxy    *proxyBase // where the proxy served when the rows' proxied URLs were derived
	cockpits map[string]*keptCockpit
	// st is the status as the rows make it, with the last read's observations of the holders'
	// processes; nil once a stack or cockpit came or went. patched are the rows (by stack key)
	// committed since it was made, each of a stack it shows, not yet in it.
	st      *machineStatus
	patched map[string]keptRow
	// probes are the holders of st with a pid, and observed what the last read observed of them.
	probes   []holderProbe
	observed []probeResult
	// rendered is st's text in each format; nil until asked for since st last changed.
	rendered [statusFormats][]byte
}

// keptCockpit is a cockpit's metadata and its stacks' rows, by stack key; or, when its value
// cannot be read, why (damaged), and no rows.
type keptCockpit struct {
	meta    cockpitMeta
	rows    map[string]keptRow
	damaged string
}

// keptRow is one stack's row: its holders' state is "" where a pid is to be observed.
type keptRow struct {
	status    stackStatus
	updatedAt string
	err       error // why the store cannot be read: the status cannot be shown
}

// holderProbe is a holder of st whose process each read observes.
type holderProbe struct {
	shown  *holderStatus // where st shows it
	holder Holder
}

type probeResult struct{ state, command string }

func (k *statusKeeper) commitBegins(key string) {
	if statusKey(key) {
		k.stale.commitBegins(key)
	}
}

func (k *statusKeeper) commitOrdered(string, *commitOutcome) {}

func (k *statusKeeper) commitEnds(key string, o *commitOutcome) {
	if statusKey(key) {
		k.stale.commitEnds(key, o)
	}
}

// statusKey says whether a commit under key's lock may change what status shows: a stack's
// commits (its record, and its cockpit's count of stacks) and a cockpit's (its config, its
// creation and removal).
func statusKey(key string) bool {
	return strings.HasPrefix(key, allStacksPrefix) || strings.HasPrefix(key, cockpitsPrefix)
}

// current brings the rows up to date in one View, observes the holders' processes, and returns
// the status; mu is held.
func (k *statusKeeper) current(e *Engine) (*machineStatus, error) {
	stale := k.stale.take() // before the View: see staleKeys.take
	proxy := e.proxyBase.Load()
	switch {
	case e.shared || !k.loaded || proxy != k.proxy:
		k.loaded = false
		if err := e.db.View(func(tx storage.Txn) error { return k.load(e, tx, proxy) }); err != nil {
			return nil, err
		}
	case len(stale) > 0:
		if err := e.db.View(func(tx storage.Txn) error { return k.refresh(e, tx, stale) }); err != nil {
			for key := range stale { // this View may have applied only some: read them again next time
				k.stale.mark(key)
			}
			return nil, err
		}
	}
	k.patch()
	if k.st == nil {
		if err := k.assemble(); err != nil {
			return nil, err
		}
	}
	k.observe(e)
	return k.st, nil
}

// load reads every cockpit and stack.
func (k *statusKeeper) load(e *Engine, tx storage.Txn, proxy *proxyBase) error {
	k.cockpits, k.st, k.proxy, k.patched = map[string]*keptCockpit{}, nil, proxy, map[string]keptRow{}
	var kept []*keptCockpit
	if err := tx.Scan(cockpitsPrefix, func(key string, raw []byte) error {
		if kc := decodeKept(e, key, raw); kc != nil {
			kept = append(kept, kc)
		}
		return nil
	}); err != nil {
		return err
	}
	for _, kc := range kept {
		if kc.damaged == "" {
			if err := k.loadRows(e, tx, kc); err != nil {
				return err
			}
		}
		k.cockpits[kc.meta.Name] = kc
	}
	k.loaded = true
	return nil
}

// loadRows reads every stack of kc's cockpit, decoding only the records not decoded before.
func (k *statusKeeper) loadRows(e *Engine, tx storage.Txn, kc *keptCockpit) error {
	heads := map[string][]byte{}
	if err := tx.Scan(stacksPrefix(kc.meta.Name), func(key string, raw []byte) error {
		if _, stack := splitStackKey(key); ValidName(stack) { // as Stacks lists them
			heads[key] = raw
		}
		return nil
	}); err != nil {
		return err
	}
	records, failed, err := e.recordsOf(tx, cockpitHoldersPrefix(kc.meta.Name), heads)
	if err != nil {
		return err
	}
	kc.rows = make(map[string]keptRow, len(heads))
	info := k.info(kc.meta)
	for key := range heads {
		kc.rows[key] = e.keptRow(key, records[key], failed[key], info)
	}
	return nil
}

func (k *statusKeeper) info(m cockpitMeta) CockpitInfo {
	info := m.info()
	info.proxy = k.proxy
	return info
}

// decodeKept is the cockpit of key as status keeps it: a damaged one (a shared store's values are
// anyone's input) is shown as such beside every other; nil for a key no cockpit may have.
func decodeKept(e *Engine, key string, raw []byte) *keptCockpit {
	m, damage, ok := e.cockpits.listed(key, raw)
	switch {
	case !ok:
		return nil
	case damage != nil:
		return &keptCockpit{meta: m, damaged: damage.Error()}
	}
	return &keptCockpit{meta: m}
}

// keptRow is the row of the stack of key: a record that does not decode is a damaged row.
func (e *Engine) keptRow(key string, r cachedRecord, err error, info CockpitInfo) keptRow {
	if isMalformed(err) {
		_, stack := splitStackKey(key)
		return keptRow{status: stackStatus{Name: stack, Holders: []holderStatus{}, Damaged: err.Error()}.withCells()}
	}
	if err != nil {
		return keptRow{err: err}
	}
	return keptRow{status: e.stackStatus(r.Record, info), updatedAt: r.UpdatedAt}
}

// refresh reads the stale keys again: each cockpit a stale key is in, then each stale stack.
func (k *statusKeeper) refresh(e *Engine, tx storage.Txn, stale map[string]bool) error {
	cockpits := map[string]bool{}
	for key := range stale {
		if strings.HasPrefix(key, cockpitsPrefix) {
			cockpits[key[len(cockpitsPrefix):]] = true
		} else {
			cockpit, _ := splitStackKey(key)
			cockpits[cockpit] = true
		}
	}
	reread := map[string]bool{} // cockpits whose every row was read again
	for name := range cockpits {
		key := cockpitKey(name)
		raw, err := tx.Get(key)
		if errors.Is(err, storage.ErrNotFound) {
			if _, ok := k.cockpits[name]; ok {
				delete(k.cockpits, name)
				k.changed()
			}
			continue
		}
		if err != nil {
			return err
		}
		fresh := decodeKept(e, key, raw)
		if fresh == nil {
			continue // not a name a cockpit may have
		}
		m, kc := fresh.meta, k.cockpits[name]
		switch {
		case fresh.damaged != "" || kc != nil && kc.damaged != "":
			// Damaged, or damaged no more: shown anew either way.
			if fresh.damaged == "" {
				if err := k.loadRows(e, tx, fresh); err != nil {
					return err
				}
			}
			k.cockpits[name], reread[name] = fresh, true
			k.changed()
			continue
		case kc == nil || kc.meta.Config != m.Config:
			// New, or its declaration changed: every row is derived again (its proxied URLs).
			kc = &keptCockpit{meta: m}
			if err := k.loadRows(e, tx, kc); err != nil {
				return err
			}
			k.cockpits[name], reread[name] = kc, true
			k.changed()
		case kc.meta.UID != m.UID || kc.meta.UpdatedAt != m.UpdatedAt || kc.meta.Stacks != m.Stacks:
			k.changed()
		}
		kc.meta = m
	}
	for key := range stale {
		if !strings.HasPrefix(key, allStacksPrefix) {
			continue
		}
		cockpit, stack := splitStackKey(key)
		kc := k.cockpits[cockpit]
		if kc == nil || reread[cockpit] || kc.damaged != "" || !ValidName(stack) {
			continue // a damaged cockpit shows no stack; a key no stack may have is none
		}
		raw, err := tx.Get(key)
		old, had := kc.rows[key]
		switch {
		case errors.Is(err, storage.ErrNotFound):
			delete(kc.rows, key)
			if had {
				k.changed()
			}
		case err != nil:
			return err
		default:
			r, err := e.recordOf(tx, key, raw)
			if err != nil && !isMalformed(err) {
				return err
			}
			row := e.keptRow(key, r, err, k.info(kc.meta))
			kc.rows[key] = row
			if !had || row.err != nil || old.err != nil || row.status.Damaged != "" || old.status.Damaged != "" || row.updatedAt < old.updatedAt {
				k.changed() // a row added, or an order or latest change a patch would not keep
			} else {
				k.patched[key] = row
			}
		}
	}
	return nil
}

// changed has the next read assemble the status from the rows again.
func (k *statusKeeper) changed() {
	k.st = nil
	k.rendered = [statusFormats][]byte{}
}

// patch puts the rows committed since st was assembled in their places, when no stack or
// cockpit came or went meanwhile: a commit on one stack costs its row, not an assembly of all.
func (k *statusKeeper) patch() {
	if k.st == nil {
		clear(k.patched)
		return
	}
	for key, row := range k.patched {
		cockpit, stack := splitStackKey(key)
		cs := k.st.Cockpits
		i := sort.Search(len(cs), func(i int) bool { return cs[i].Name >= cockpit })
		if i == len(cs) || cs[i].Name != cockpit {
			k.changed() // not shown: assembled anew (refresh marks every row it adds as such)
			clear(k.patched)
			return
		}
		ss := cs[i].Stacks
		j := sort.Search(len(ss), func(j int) bool { return ss[j].Name >= stack })
		if j == len(ss) || ss[j].Name != stack {
			k.changed()
			clear(k.patched)
			return
		}
		s := row.status
		s.Holders = slices.Clone(s.Holders)
		ss[j] = s
		k.st.UpdatedAt = later(k.st.UpdatedAt, row.updatedAt)
	}
	if len(k.patched) > 0 {
		clear(k.patched)
		k.probeHolders()
		k.rendered = [statusFormats][]byte{}
	}
}

// assemble makes st of the rows, cockpits and stacks in name order, as one scan of the store
// would find them, and the probes of its holders with a pid.
func (k *statusKeeper) assemble() error {
	st := &machineStatus{Cockpits: make([]cockpitStatus, 0, len(k.cockpits))}
	for _, name := range sortedKeys(k.cockpits) {
		kc := k.cockpits[name]
		st.UpdatedAt = later(st.UpdatedAt, kc.meta.UpdatedAt)
		c := cockpitStatus{Name: name, UID: kc.meta.UID, Stacks: make([]stackStatus, 0, len(kc.rows)), Damaged: kc.damaged}
		for _, key := range sortedKeys(kc.rows) {
			row := kc.rows[key]
			if row.err != nil {
				return row.err
			}
			st.UpdatedAt = later(st.UpdatedAt, row.updatedAt)
			s := row.status
			// The row's holders stay as read: each read writes its observations into a copy.
			s.Holders = slices.Clone(s.Holders)
			c.Stacks = append(c.Stacks, s)
		}
		st.Cockpits = append(st.Cockpits, c)
	}
	k.st, k.rendered = st, [statusFormats][]byte{}
	k.probeHolders()
	return nil
}

// probeHolders lists st's holders with a pid, whose processes the next read observes.
func (k *statusKeeper) probeHolders() {
	k.probes, k.observed = k.probes[:0], nil
	for _, c := range k.st.Cockpits {
		for _, s := range c.Stacks {
			for i := range s.Holders {
				if h := &s.Holders[i]; h.PID != 0 {
					k.probes = append(k.probes, holderProbe{shown: h, holder: Holder{PID: h.PID, ProcessStart: h.processStart}})
				}
			}
		}
	}
}

// observe judges each probed holder's process, each distinct process once, and writes what
// changed into st; the renderings go when anything did.
func (k *statusKeeper) observe(e *Engine) {
	type process struct {
		pid   int
		start string
	}
	states, commands := map[process]string{}, map[int]string{}
	results := make([]probeResult, len(k.probes))
	for i, p := range k.probes {
		key := process{p.holder.PID, p.holder.ProcessStart}
		state, ok := states[key]
		if !ok {
			state = e.HolderState(p.holder)
			states[key] = state
		}
		results[i].state = state
		if state == "live" {
			cmd, ok := commands[key.pid]
			if !ok {
				cmd = command(key.pid)
				commands[key.pid] = cmd
			}
			results[i].command = cmd
		}
	}
	if k.observed != nil && slices.Equal(results, k.observed) {
		return
	}
	for i, p := range k.probes {
		p.shown.State, p.shown.Command = results[i].state, results[i].command
	}
	k.observed, k.rendered = results, [statusFormats][]byte{}
}
