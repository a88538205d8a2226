package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/cockpitfs/cockpitfs/storage"
)

// Status is the machine at a glance: every cockpit, its stacks, their leased ports, holders and
// drains, read in one snapshot, with each holder's liveness and command observed after it. It is
// what the root files status and status.json show.
type Status struct {
	Cockpits []cockpitStatus `json:"cockpits"`
	// UpdatedAt is the latest change among them: the files' mtime.
	UpdatedAt string `json:"updatedAt"`
}

// cockpitStatus is one cockpit and its stacks, by name.
type cockpitStatus struct {
	Name   string        `json:"name"`
	UID    uint32        `json:"uid"`
	Stacks []stackStatus `json:"stacks"`
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
}

// holderStatus is one holder as its file reads, plus the command its process runs.
type holderStatus struct {
	Name     string `json:"name"`
	State    string `json:"state"` // live, dead, unknown, untracked
	PID      int    `json:"pid,omitempty"`
	Command  string `json:"command,omitempty"` // a live holder's command line
	Checkout string `json:"checkout"`
	UID      uint32 `json:"uid"`
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

// Status reads every cockpit and stack in one snapshot.
func (e *Engine) Status() (Status, error) {
	var st Status
	err := e.db.View(func(tx storage.Txn) error {
		st = Status{}
		var metas []cockpitMeta
		if err := tx.Scan(cockpitsPrefix, func(_ string, v []byte) error {
			var m cockpitMeta
			if err := json.Unmarshal(v, &m); err != nil {
				return err
			}
			metas = append(metas, m)
			return nil
		}); err != nil {
			return err
		}
		for _, m := range metas {
			st.UpdatedAt = later(st.UpdatedAt, m.UpdatedAt)
			c := cockpitStatus{Name: m.Name, UID: m.UID, Stacks: []stackStatus{}}
			info := m.info()
			info.proxy = e.proxyBase.Load()
			var keys []string
			heads := map[string][]byte{}
			if err := tx.Scan(stacksPrefix(m.Name), func(k string, v []byte) error {
				keys, heads[k] = append(keys, k), v
				return nil
			}); err != nil {
				return err
			}
			records, failed, err := e.recordsOf(tx, cockpitHoldersPrefix(m.Name), heads)
			if err != nil {
				return err
			}
			for _, k := range keys {
				r := records[k]
				if err := failed[k]; err != nil {
					return err
				}
				st.UpdatedAt = later(st.UpdatedAt, r.UpdatedAt)
				c.Stacks = append(c.Stacks, e.stackStatus(r.Record, info))
			}
			st.Cockpits = append(st.Cockpits, c)
		}
		return nil
	})
	if err != nil {
		return Status{}, err
	}
	if st.Cockpits == nil {
		st.Cockpits = []cockpitStatus{}
	}
	// Observed after the snapshot, outside the transaction, as every probe is.
	for _, c := range st.Cockpits {
		for _, s := range c.Stacks {
			for i := range s.Holders {
				h := &s.Holders[i]
				if h.State == "live" {
					h.Command = commandLine(h.PID)
				}
			}
		}
	}
	return st, nil
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
		s.Holders = append(s.Holders, holderStatus{Name: h.Name, State: e.HolderState(h), PID: h.PID, Checkout: h.CheckoutPath, UID: h.UID})
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
	return s
}

// maxCommandLine bounds the command line a status row shows.
const maxCommandLine = 60

// commandLine is pid's command line, its arguments joined by spaces; "" when unreadable.
func commandLine(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(strings.ReplaceAll(string(bytes.TrimRight(data, "\x00")), "\x00", " "))
	if len([]rune(s)) > maxCommandLine {
		s = string([]rune(s)[:maxCommandLine-1]) + "…"
	}
	return s
}

// Table renders the status as one aligned table, a row per holder (a stack without holders, and a
// cockpit without stacks, get one row too); "-" marks what there is none of.
func (st Status) Table() ([]byte, error) {
	var b bytes.Buffer
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	// The proxied URLs get a column only while the daemon serves a proxy.
	proxied := false
	for _, c := range st.Cockpits {
		for _, s := range c.Stacks {
			proxied = proxied || len(s.Proxied) > 0
		}
	}
	header, tail := "", func(stackStatus) string { return "" }
	if proxied {
		header, tail = "\tPROXIED", func(s stackStatus) string { return "\t" + proxiedText(s.Proxied) }
	}
	fmt.Fprintln(w, "COCKPIT\tSTACK\tREV\tPORTS\tHOLDER\tSTATE\tPID\tCOMMAND\tCHECKOUT\tDRAIN"+header)
	for _, c := range st.Cockpits {
		if len(c.Stacks) == 0 {
			fmt.Fprintf(w, "%s\t-\t-\t-\t-\t-\t-\t-\t-\t-%s\n", c.Name, tail(stackStatus{}))
		}
		for _, s := range c.Stacks {
			ports, drain := portsText(s.Ports), drainText(s.Drain)
			if len(s.Holders) == 0 {
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t-\t-\t-\t-\t-\t%s%s\n", c.Name, s.Name, s.Revision, ports, drain, tail(s))
			}
			for _, h := range s.Holders {
				pid := "-"
				if h.PID != 0 {
					pid = fmt.Sprint(h.PID)
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s%s\n", c.Name, s.Name, s.Revision, ports,
					h.Name, h.State, pid, dash(h.Command), dash(h.Checkout), drain, tail(s))
			}
		}
	}
	err := w.Flush()
	return b.Bytes(), err
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

// JSON renders the status for scripts, as PrintableJSON.
func (st Status) JSON() ([]byte, error) {
	data, err := json.MarshalIndent(st, "", "  ")
	return append(PrintableJSON(data), '\n'), err
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
