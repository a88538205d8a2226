package engine

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/cockpitfs/cockpitfs/engine/liveness"
)

// machineStatus is the machine at a glance: every cockpit, its stacks, their leased ports, holders
// and drains, read in one snapshot, with each holder's liveness and command observed after it. It
// is what the root files status and status.json show (StatusFile).
type machineStatus struct {
	Cockpits []cockpitStatus `json:"cockpits"`
	// UpdatedAt is the latest change among them: the files' mtime.
	UpdatedAt string `json:"updatedAt"`
}

// cockpitStatus is one cockpit and its stacks, by name.
type cockpitStatus struct {
	Name   string        `json:"name"`
	UID    uint32        `json:"uid"`
	Stacks []stackStatus `json:"stacks"`
	// Damaged is why the cockpit's value cannot be read, when it cannot (no stack is shown).
	Damaged string `json:"damaged,omitempty"`
}

// stackStatus is one stack: its revision, active lease, holders and drain.
type stackStatus struct {
	Name     string         `json:"name"`
	Revision int64          `json:"revision"`
	Ports    map[string]int `json:"ports"` // the active lease's; null without one
	Holders  []holderStatus `json:"holders"`
	Drain    *drainStatus   `json:"drain"` // null without a reservation
	// Proxied are the stack's web entrypoints' URLs through the daemon's proxy, by entrypoint
	// name, while it holds a lease and the daemon serves a proxy.
	Proxied map[string]string `json:"proxied,omitempty"`
	// Damaged is why the stack's record cannot be read, when it cannot: the row shows nothing
	// else of it, and every other row is shown (a shared store's values are anyone's input).
	Damaged string `json:"damaged,omitempty"`
	cells   stackCells
	text    *stackText // its JSON, shared by the copies of one row (nil: encoded every time)
}

// holderStatus is one holder as its file reads, plus the command its process runs.
type holderStatus struct {
	Name     string `json:"name"`
	State    string `json:"state"` // live, dead, unknown, untracked
	PID      int    `json:"pid,omitempty"`
	Command  string `json:"command,omitempty"` // a live holder's process's name (see command)
	Checkout string `json:"checkout"`
	UID      uint32 `json:"uid"`
	// processStart is the start its pid was recorded with: what its liveness is judged by.
	processStart string
	checkoutCell string // Checkout as the table shows it
}

// drainStatus is a reserved drain: its purpose, how far it got and what runs now.
type drainStatus struct {
	Purpose   string `json:"purpose"`
	Completed int    `json:"completedActions"`
	Actions   int    `json:"actions"`
	// Attempt is the current action's attempt: active, failed, or "" before the first start.
	Attempt string `json:"attempt"`
	Stage   string `json:"stage,omitempty"`
	Target  string `json:"target,omitempty"`
}

func later(a, b string) string {
	if b > a {
		return b
	}
	return a
}

func (e *Engine) stackStatus(r Record, info CockpitInfo) stackStatus {
	s := stackStatus{Name: r.Stack, Revision: r.Revision, Holders: []holderStatus{}}
	if l := r.Value.Lease; l.Active() {
		s.Ports = l.Ports
	}
	if info.proxy != nil { // else no entrypoint has a proxied URL: derive none
		for _, ep := range r.Entrypoints(info.Entrypoints) {
			if u := info.ProxiedURL(r.Stack, ep.Name, ep.URL); u != "" {
				if s.Proxied == nil {
					s.Proxied = map[string]string{}
				}
				s.Proxied[ep.Name] = u
			}
		}
	}
	for _, h := range r.Value.Holders {
		// A pid's state is observed at each read (statusKeeper.observe).
		hs := holderStatus{Name: h.Name, PID: h.PID, Checkout: h.CheckoutPath, UID: h.UID, processStart: h.ProcessStart}
		if h.PID == 0 {
			hs.State = e.HolderState(h)
		}
		s.Holders = append(s.Holders, hs)
	}
	sort.Slice(s.Holders, func(i, j int) bool { return s.Holders[i].Name < s.Holders[j].Name })
	if d := r.Value.Drain; d != nil {
		ds := &drainStatus{Purpose: d.Purpose, Completed: d.CompletedActionCount, Actions: len(d.Actions)}
		if d.CompletedActionCount < len(d.Actions) {
			a := d.Actions[d.CompletedActionCount]
			ds.Stage, ds.Target = a.Stage, a.TargetID
		}
		if at := d.Attempt; at != nil {
			ds.Attempt = at.Status
		}
		s.Drain = ds
	}
	return s.withCells()
}

// withCells is s with the cells the table shows of it, and a place for its JSON.
func (s stackStatus) withCells() stackStatus {
	s.text = &stackText{}
	s.cells = stackCells{revision: strconv.FormatInt(s.Revision, 10), ports: portsText(s.Ports), drain: drainText(s.Drain), proxied: proxiedText(s.Proxied)}
	for i := range s.Holders {
		s.Holders[i].checkoutCell = dash(s.Holders[i].Checkout)
	}
	return s
}

// maxCommand bounds the command a status row shows.
const maxCommand = 60

// command is what a status row shows as pid's command: its name as the kernel keeps it (comm), as
// ps shows it without -f; "" when unreadable. Not its command line: reading another process's
// argv takes that process's mmap lock, which its owner can hold for as long as they like (a fault
// on a file of a FUSE server they stopped holds it, an mmap queued behind that holds back every
// later reader: CVE-2018-1121's class), and a status read, under the status lock, must wait on no
// user's process (TestStatusPastAHolderWhoseMemoryStalls). The name is the task's own field: no read of the process's memory.
func command(pid int) string {
	s := liveness.Name(pid)
	if len([]rune(s)) > maxCommand { // a kernel thread's name may be longer than a process's
		s = string([]rune(s)[:maxCommand-1]) + "…"
	}
	return s
}

// Table renders the status as one aligned table, a row per holder (a stack without holders, and a
// cockpit without stacks, get one row too); "-" marks what there is none of. The columns are
// aligned as text/tabwriter aligns them (two spaces after the widest cell, widths in runes;
// TestStatusTableIsTabwriters), from the cells each row keeps, so a table of a thousand stacks
// formats no value again.
func (st machineStatus) Table() []byte {
	// The proxied URLs get a column only while the daemon serves a proxy.
	proxied := false
	rows := 1
	for _, c := range st.Cockpits {
		rows++
		for _, s := range c.Stacks {
			proxied = proxied || len(s.Proxied) > 0
			rows += len(s.Holders) + 1
		}
	}
	header := []string{"COCKPIT", "STACK", "REV", "PORTS", "HOLDER", "STATE", "PID", "COMMAND", "CHECKOUT", "DRAIN"}
	if proxied {
		header = append(header, "PROXIED")
	}
	cols := len(header)
	cells := make([]string, 0, rows*cols)
	cells = append(cells, header...)
	row := func(s *stackStatus, more ...string) {
		cells = append(cells, more...)
		if proxied {
			cells = append(cells, s.cells.proxied)
		}
	}
	for _, c := range st.Cockpits {
		if len(c.Stacks) == 0 {
			state := "-"
			if c.Damaged != "" {
				state = "damaged"
			}
			row(&stackStatus{cells: stackCells{proxied: "-"}}, c.Name, "-", "-", "-", "-", state, "-", "-", "-", "-")
		}
		for i := range c.Stacks {
			s := &c.Stacks[i]
			if s.Damaged != "" {
				row(s, c.Name, s.Name, "-", "-", "-", "damaged", "-", "-", "-", "-")
				continue
			}
			if len(s.Holders) == 0 {
				row(s, c.Name, s.Name, s.cells.revision, s.cells.ports, "-", "-", "-", "-", "-", s.cells.drain)
			}
			for _, h := range s.Holders {
				pid := "-"
				if h.PID != 0 {
					pid = strconv.Itoa(h.PID)
				}
				row(s, c.Name, s.Name, s.cells.revision, s.cells.ports, Printable(h.Name), h.State, pid, dash(h.Command), h.checkoutCell, s.cells.drain)
			}
		}
	}
	return alignCells(cells, cols)
}

// stackCells are a stack's cells of the table, as its row was derived.
type stackCells struct {
	revision, ports, drain, proxied string
}

// alignCells writes cells, cols to a line, each but a line's last padded to its column's widest
// cell and two spaces more, as text/tabwriter does with padding 2 and ' '.
func alignCells(cells []string, cols int) []byte {
	widths := make([]int, cols)
	runes := make([]int32, len(cells)) // each cell's width, counted once
	size := 0
	for i, c := range cells {
		n := utf8.RuneCountInString(c)
		runes[i] = int32(n)
		widths[i%cols] = max(widths[i%cols], n)
		size += len(c)
	}
	line := 0
	for _, w := range widths[:cols-1] {
		line += w + 2
	}
	spaces := []byte(strings.Repeat(" ", slices.Max(widths)+2))
	out := make([]byte, 0, size+len(cells)/cols*(line+1))
	for i, c := range cells {
		out = append(out, c...)
		if col := i % cols; col < cols-1 {
			out = append(out, spaces[:widths[col]+2-int(runes[i])]...)
		} else {
			out = append(out, '\n')
		}
	}
	return out
}

// proxiedText is the proxied URLs in entrypoint order, joined by commas.
func proxiedText(urls map[string]string) string {
	return cellOf(urls, func(_, url string) string { return Printable(url) })
}

// cellOf is one cell of m's entries in key order, each as cell renders it, joined by commas; "-"
// for none.
func cellOf[V any](m map[string]V, cell func(key string, v V) string) string {
	if len(m) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, cell(k, m[k]))
	}
	return strings.Join(parts, ",")
}

// JSON renders the status for scripts: encoding/json's indented bytes, as PrintableJSON, put
// together from each stack's own (TestStatusJSONIsEncodingJSONs), so a status of a thousand
// stacks encodes only those whose row changed since.
func (st machineStatus) JSON() ([]byte, error) {
	b := []byte("{\n  \"cockpits\": [")
	for i, c := range st.Cockpits {
		if i > 0 {
			b = append(b, ',')
		}
		name, err := json.Marshal(c.Name)
		if err != nil {
			return nil, err
		}
		b = append(append(b, "\n    {\n      \"name\": "...), PrintableJSON(name)...)
		b = strconv.AppendUint(append(b, ",\n      \"uid\": "...), uint64(c.UID), 10)
		b = append(b, ",\n      \"stacks\": ["...)
		for j := range c.Stacks {
			if j > 0 {
				b = append(b, ',')
			}
			text, err := c.Stacks[j].jsonText()
			if err != nil {
				return nil, err
			}
			b = append(append(b, "\n        "...), text...)
		}
		if len(c.Stacks) > 0 {
			b = append(b, "\n      "...)
		}
		b = append(b, ']')
		if c.Damaged != "" {
			why, err := json.Marshal(c.Damaged)
			if err != nil {
				return nil, err
			}
			b = append(append(b, ",\n      \"damaged\": "...), PrintableJSON(why)...)
		}
		b = append(b, "\n    }"...)
	}
	if len(st.Cockpits) > 0 {
		b = append(b, "\n  "...)
	}
	updated, err := json.Marshal(st.UpdatedAt)
	if err != nil {
		return nil, err
	}
	b = append(append(b, "],\n  \"updatedAt\": "...), PrintableJSON(updated)...)
	return append(b, "\n}\n"...), nil
}

// stackText is a stack's JSON as status.json indents it, once encoded.
type stackText struct{ json []byte }

// jsonText is s as status.json shows it, at its depth there: encoded once for a row whose holders
// have no process to observe, at every rendering for the others (their state may change with no
// commit).
func (s *stackStatus) jsonText() ([]byte, error) {
	if s.text != nil && s.text.json != nil {
		return s.text.json, nil
	}
	data, err := json.MarshalIndent(s, "        ", "  ")
	if err != nil {
		return nil, err
	}
	data = PrintableJSON(data)
	observed := false
	for _, h := range s.Holders {
		observed = observed || h.PID != 0
	}
	if s.text != nil && !observed {
		s.text.json = data
	}
	return data, nil
}

// dash is s as a cell shows it (Printable: one line, no tab, nothing a terminal acts on), "-"
// for none.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return Printable(s)
}

// portsText is KEY=port pairs in key order, joined by commas.
func portsText(ports map[string]int) string {
	return cellOf(ports, func(k string, port int) string { return fmt.Sprintf("%s=%d", k, port) })
}

// drainText is e.g. "down 1/3 reclaim volume:cache (active)".
func drainText(d *drainStatus) string {
	if d == nil {
		return "-"
	}
	s := fmt.Sprintf("%s %d/%d", d.Purpose, d.Completed, d.Actions)
	if d.Stage != "" {
		target := d.Target
		if strings.HasPrefix(target, "stack:") {
			target = "stack"
		}
		s += " " + d.Stage + " " + target
	}
	if d.Attempt != "" {
		s += " (" + d.Attempt + ")"
	}
	return Printable(s)
}
