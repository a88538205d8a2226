package engine

import (
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
)

// Record is the coordination record of one stack, as the seeds define it (format
// cockpit-state/v1, kind coordination), extended with the names a filesystem shows.
type Record struct {
	Format    string `json:"format"`
	Kind      string `json:"kind"`
	CockpitID string `json:"cockpitId"`
	SubjectID string `json:"subjectId"`
	Revision  int64  `json:"revision"`
	UpdatedAt string `json:"updatedAt"`
	Value     Value  `json:"value"`
	Cockpit   string `json:"cockpit"`
	Stack     string `json:"stack"`
	// Creator is the uid that made the stack, who (with root) may remove it; nil in a record
	// written before creators were kept: such a stack is its cockpit's owner's (see creator).
	Creator *uint32 `json:"creator,omitempty"`
	// Mode is the stack directory's permission bits as its creator set them (chmod): who else
	// may join it (see mayJoin); nil is StackModeClosed.
	Mode *uint32 `json:"mode,omitempty"`
	// GID is the stack's group, its creator's gid when it was made: with g+w its members may
	// join it. nil in a record written before groups were kept: no group.
	GID *uint32 `json:"gid,omitempty"`
}

// Value is what a transition changes.
type Value struct {
	Holders            []Holder `json:"holders"`
	Lease              *Lease   `json:"lease"`
	LastReleasedHolder *string  `json:"lastReleasedHolder"`
	Drain              *Drain   `json:"drain"`
}

// Holder is one claim on a stack. Name, CheckoutPath and UID extend the seeds' holder.
type Holder struct {
	HolderID     string `json:"holderId"`
	CheckoutID   string `json:"checkoutId"`
	ClaimedAt    string `json:"claimedAt"`
	PID          int    `json:"pid,omitempty"`
	ProcessStart string `json:"processStart,omitempty"`
	Name         string `json:"name"`
	CheckoutPath string `json:"checkoutPath"`
	UID          uint32 `json:"uid"`
}

// Lease is a stack's port family, as the seeds' lease record: its entrypoints are not part of it
// but derived from the cockpit's current config (Record.Entrypoints).
type Lease struct {
	Offset      int                  `json:"offset"`
	Ports       map[string]int       `json:"ports"`
	Released    bool                 `json:"released"`
	Declaration portdecl.Declaration `json:"declaration"`
	// UID is the uid whose claim took the lease, which it counts against (Engine.BoundLeases);
	// nil in a lease taken before leases were counted, which counts against no one.
	UID *uint32 `json:"uid,omitempty"`
}

// Active reports whether l holds its ports.
func (l *Lease) Active() bool { return l != nil && !l.Released }

const (
	recordFormat = "cockpit-state/v1"
	recordKind   = "coordination"
	stampLayout  = "2006-01-02T15:04:05.000Z"
	// maxHolders bounds a stack's holders (the seeds' structured input limit).
	maxHolders = 1024
	// MaxStacks bounds a cockpit's stacks: the seeds' inventory reads at most this many records
	// of a namespace (the same structured input limit).
	MaxStacks = 1024
	// maxRecordBytes bounds a record's JSON. The seeds bound records too
	// (SERIALIZED_RECORD_BYTE_LIMIT), but their value is not in the reference; this one leaves
	// room for MaxHolders holders with ordinary checkout paths (≈364 KB).
	maxRecordBytes = 1 << 20
)

// stamp renders t as the records' canonical timestamp.
func stamp(t time.Time) string {
	sec, nsec := t.Unix(), t.Nanosecond() // the wall clock's, which is what is written
	if last := lastStamp.Load(); last != nil && last.sec == sec && last.nsec == nsec {
		return last.s
	}
	s := formatStamp(t.UTC())
	lastStamp.Store(&stamped{sec, nsec, s})
	return s
}

// formatStamp is t.Format(stampLayout) for a UTC t, written out digit by digit: Format
// interprets its layout on every call, a few microseconds on a claim's path when cold. A year
// outside 0–9999 goes to Format, which writes it as the layout's four digits cannot.
func formatStamp(t time.Time) string {
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.Format(stampLayout)
	}
	hour, minute, second := t.Clock()
	var b [len(stampLayout)]byte
	put := func(at, n, width int) {
		for i := at + width - 1; i >= at; i-- {
			b[i] = byte('0' + n%10)
			n /= 10
		}
	}
	put(0, year, 4)
	put(5, int(month), 2)
	put(8, day, 2)
	put(11, hour, 2)
	put(14, minute, 2)
	put(17, second, 2)
	put(20, t.Nanosecond()/int(time.Millisecond), 3)
	b[4], b[7], b[10], b[13], b[16], b[19], b[23] = '-', '-', 'T', ':', ':', '.', 'Z'
	return string(b[:])
}

// lastStamp is the last time stamped: a commit stamps its one now for the record, the holder it
// adds and its events line (TestStampIsFormats).
var lastStamp atomic.Pointer[stamped]

type stamped struct {
	sec  int64
	nsec int
	s    string
}

// ParseStamp reads a canonical timestamp; ok is false for anything else. It is time.Parse of
// stampLayout whose result formats back to s (TestParseStampIsTimeParses), without either: a
// claim reads several stamps.
func ParseStamp(s string) (time.Time, bool) {
	if len(s) != len(stampLayout) || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[19] != '.' || s[23] != 'Z' {
		return time.Time{}, false
	}
	var f [7]int // year, month, day, hour, minute, second, millisecond
	for i, span := range [...][2]int{{0, 4}, {5, 7}, {8, 10}, {11, 13}, {14, 16}, {17, 19}, {20, 23}} {
		for _, c := range []byte(s[span[0]:span[1]]) {
			if c < '0' || c > '9' {
				return time.Time{}, false
			}
			f[i] = f[i]*10 + int(c-'0')
		}
	}
	month := time.Month(f[1])
	if month < time.January || month > time.December || f[2] < 1 || f[2] > daysIn(month, f[0]) || f[3] > 23 || f[4] > 59 || f[5] > 59 {
		return time.Time{}, false
	}
	return time.Date(f[0], month, f[2], f[3], f[4], f[5], f[6]*int(time.Millisecond), time.UTC), true
}

// daysIn is the number of days of month in year (proleptic Gregorian, as time counts them).
func daysIn(month time.Month, year int) int {
	if month == time.February && year%4 == 0 && (year%100 != 0 || year%400 == 0) {
		return 29
	}
	return [...]int{31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}[month-1]
}

func newRecord(cockpit, stack string, creator, gid uint32, now time.Time) Record {
	return Record{
		Creator:   &creator,
		GID:       &gid,
		Format:    recordFormat,
		Kind:      recordKind,
		CockpitID: cockpitID(cockpit),
		SubjectID: StackID(cockpit, stack),
		UpdatedAt: stamp(now),
		Value:     Value{Holders: []Holder{}},
		Cockpit:   cockpit,
		Stack:     stack,
	}
}

// next is the record a transition to v commits: the following revision, stamped now, or at the
// record's own stamp when the clock stepped back past it: updatedAt is every file's st_mtime, and
// make takes a file whose mtime went back for up to date.
func (r Record) next(v Value, now time.Time) Record {
	n := r
	n.Revision++
	n.UpdatedAt = r.stampAfter(now)
	n.Value = v
	return n
}

// stampAfter is now as a record stamp, never before r's updatedAt.
func (r Record) stampAfter(now time.Time) string {
	if at := stamp(now); at > r.UpdatedAt || !isStamp(r.UpdatedAt) {
		return at
	}
	return r.UpdatedAt
}

// Holder returns the holder with the given name.
func (v Value) Holder(name string) (Holder, bool) { return v.holderByID(holderID(name)) }

// holderByID returns the holder with the given id.
func (v Value) holderByID(id string) (Holder, bool) {
	for _, h := range v.Holders {
		if h.HolderID == id {
			return h, true
		}
	}
	return Holder{}, false
}

func (v Value) withoutHolders(ids map[string]bool) []Holder {
	kept := make([]Holder, 0, len(v.Holders))
	for _, h := range v.Holders {
		if !ids[h.HolderID] {
			kept = append(kept, h)
		}
	}
	return kept
}

func sortHolders(hs []Holder) {
	slices.SortFunc(hs, func(a, b Holder) int { return strings.Compare(a.HolderID, b.HolderID) })
}

// Entrypoints are the stack's URLs: a default one per port of its active lease, and each
// entrypoint the cockpit's current config declares on a port the lease holds, derived anew at
// every read as the seeds' deriveEntrypoints does, so editing one shows on a running stack while
// its ports stay the lease's. None without an active lease.
func (r Record) Entrypoints(declared []portdecl.Entrypoint) []portdecl.Resolved {
	l := r.Value.Lease
	if !l.Active() {
		return nil
	}
	return portdecl.Entrypoints(declared, l.Ports)
}

// EntrypointsFor is Entrypoints under the cockpit's current config, each one the config asks to
// be proxied given its proxied URL when the daemon serves the proxy: the URL env, entrypoints/<name>
// and {url.NAME} show.
func (r Record) EntrypointsFor(info CockpitInfo) []portdecl.Resolved {
	all := r.Entrypoints(info.Entrypoints)
	for i, e := range all {
		if e.Proxied {
			if u := info.ProxiedURL(r.Stack, e.Name, e.URL); u != "" {
				all[i].URL = u
			}
		}
	}
	return all
}

// EnvVar is one line of a stack's environment.
type EnvVar struct{ Name, Value string }

// EnvFor is the env the stack exports under its cockpit's current config: Env of its declared
// entrypoints, every name starting with the config's [env] prefix, then each [env] derived value
// by name as its template renders on the stack's facts (one that cannot render is left out). A
// line another user's shell would not read as written, or that names what their programs read
// (portdecl.CheckExported, CheckValue), is left out: a config accepted before those rules may
// declare one.
func (r Record) EnvFor(info CockpitInfo) []EnvVar {
	env := r.env(info)
	kept := env[:0]
	for _, v := range env {
		v.Name = info.EnvPrefix + v.Name
		if portdecl.CheckExported(v.Name) == nil && portdecl.CheckValue(v.Value) == nil {
			kept = append(kept, v)
		}
	}
	if !r.Value.Lease.Active() || len(info.Derived) == 0 {
		return kept // nil without a lease, as env
	}
	facts := r.facts(info)
	for _, d := range info.Derived {
		if value, ok := d.Render(facts); ok && portdecl.CheckExported(d.Name) == nil {
			kept = append(kept, EnvVar{d.Name, value})
		}
	}
	return kept
}

// facts are what the stack's derived values render from: its names, its lease's ports, its
// declared entrypoints' URLs, and the folder name of the checkout of its earliest holder whose
// checkout is known, as NameFor maps it ("" when none is).
func (r Record) facts(info CockpitInfo) portdecl.Facts {
	f := portdecl.Facts{Cockpit: r.Cockpit, Stack: r.Stack, Ports: r.Value.Lease.Ports, URLs: map[string]string{}}
	for _, e := range r.EntrypointsFor(info) {
		if !e.Default {
			f.URLs[e.Name] = e.URL
		}
	}
	var first *Holder
	for i, h := range r.Value.Holders {
		if h.CheckoutPath != "" && (first == nil || h.ClaimedAt < first.ClaimedAt) {
			first = &r.Value.Holders[i]
		}
	}
	if first != nil {
		f.Checkout = NameFor(filepath.Base(first.CheckoutPath))
	}
	return f
}

// env is the stack's environment while it holds a lease: each port by key in key order, then
// each declared entrypoint's URL as <NAME>_URL. Nil without an active lease.
func (r Record) env(info CockpitInfo) []EnvVar {
	l := r.Value.Lease
	if !l.Active() {
		return nil
	}
	env := make([]EnvVar, 0, len(l.Ports))
	for _, k := range sortedPortKeys(l.Ports) {
		env = append(env, EnvVar{k, strconv.Itoa(l.Ports[k])})
	}
	for _, e := range r.EntrypointsFor(info) {
		if !e.Default { // only what the config declared: see portdecl.Resolved
			env = append(env, EnvVar{portdecl.EnvName(e.Name), e.URL})
		}
	}
	return env
}

func sortedPortKeys(ports map[string]int) []string {
	keys := make([]string, 0, len(ports))
	for k := range ports {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
