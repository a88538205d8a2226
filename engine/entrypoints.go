package engine

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cockpitfs/cockpitfs/engine/portdecl"
	"github.com/cockpitfs/cockpitfs/storage"
)

// Diagnostic codes the seeds' deriveEntrypoints reports beside a complete derivation: a value
// declared elsewhere for an entrypoint (an .env line, a provider's registered redirect) that
// differs from the derived URL. They refuse nothing, so they have no errno.
const (
	portLocalValueCorrected     Code = "PORT_LOCAL_VALUE_CORRECTED"
	portExternalRegistrationGap Code = "PORT_EXTERNAL_REGISTRATION_GAP"
)

// EntrypointResult is the seeds' deriveEntrypoints result: kind "complete" with every rendered
// entrypoint and the diagnostics of declared values, or kind "refusal" with why the current
// config's entrypoints cannot be derived on the lease's ports.
type EntrypointResult struct {
	Kind        string            `json:"kind"`
	Values      []entrypointValue `json:"values,omitempty"`
	Diagnostics []diagnostic      `json:"diagnostics"`
}

// entrypointValue is one rendered entrypoint, as the seeds' projection carries it.
type entrypointValue struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"`
	Port  string `json:"port"`
	Value string `json:"value"`
	// Proxied is the URL through the daemon's proxy (CockpitInfo.ProxiedURL), when it serves one:
	// not the reference's, so absent otherwise.
	Proxied string `json:"proxied,omitempty"`
}

// diagnostic is the seeds' diagnostic: severity error (a refusal), warning or info.
type diagnostic struct {
	Severity string `json:"severity"`
	Code     Code   `json:"code"`
	Message  string `json:"message"`
	Target   string `json:"target"`
	Fix      string `json:"fix,omitempty"`
}

// DeriveEntrypoints derives the stack's entrypoints as the seeds' deriveEntrypoints does: the
// default one of each leased port in the order the config declares its keys (order, a
// CockpitInfo's BaseOrder: the seeds' lease keeps its declaration's order), then each declared one, every declared one
// compared with the value recorded for it in values (declared-values). Nil without an active
// lease. Unlike Entrypoints, which renders env and entrypoints/ and leaves such an entrypoint
// out, a declared entrypoint on a port the lease does not hold refuses the derivation.
func (r Record) DeriveEntrypoints(declared []portdecl.Entrypoint, order []string, values map[string]string) *EntrypointResult {
	l := r.Value.Lease
	if !l.Active() {
		return nil
	}
	defaults := portdecl.Entrypoints(nil, l.Ports)
	rank := make(map[string]int, len(defaults))
	for i, key := range portdecl.OrderPorts(order, slices.Collect(maps.Keys(l.Ports))) {
		rank[key] = i
	}
	slices.SortFunc(defaults, func(a, b portdecl.Resolved) int { return cmp.Compare(rank[a.Port], rank[b.Port]) })
	result := &EntrypointResult{Kind: "complete", Diagnostics: []diagnostic{}}
	names := map[string]bool{}
	for _, d := range defaults {
		names[d.Name] = true
		result.Values = append(result.Values, entrypointValue{Name: d.Name, Kind: d.Kind, Port: d.Port, Value: d.URL})
	}
	refusal := func(message, target string) *EntrypointResult {
		return &EntrypointResult{Kind: "refusal", Diagnostics: []diagnostic{{
			Severity: "error", Code: PortFamilyOutOfRange, Message: message, Target: target,
			Fix: "drain the stack and claim it again under the current [ports], or restore the entrypoint's port key",
		}}}
	}
	for _, d := range declared {
		if names[d.Name] {
			return refusal("entrypoint declaration duplicates a rendered name", d.Name)
		}
		names[d.Name] = true
		port, leased := l.Ports[d.Port]
		if !leased {
			return refusal("entrypoint references a port absent from the accepted lease", d.Port)
		}
		e := d.On(port)
		result.Values = append(result.Values, entrypointValue{Name: e.Name, Kind: e.Kind, Port: e.Port, Value: e.URL})
		recorded, ok := values[d.Name]
		switch {
		case !ok || recorded == e.URL:
		case isLoopbackURL(recorded):
			result.Diagnostics = append(result.Diagnostics, diagnostic{Severity: "warning", Code: portLocalValueCorrected,
				Message: "stale loopback value was replaced from the accepted lease", Target: d.Name, Fix: "use " + e.URL})
		default:
			result.Diagnostics = append(result.Diagnostics, diagnostic{Severity: "info", Code: portExternalRegistrationGap,
				Message: "external registration cannot be updated by cockpit", Target: d.Name, Fix: "update the external registration to " + e.URL})
		}
	}
	return result
}

// isLoopbackURL says value is a URL on this machine's loopback, as the seeds' isLoopback: a
// value cockpitfs itself would have written, so a stale one is simply replaced, where any other
// host is a registration someone must update by hand.
func isLoopbackURL(value string) bool {
	u, err := url.Parse(value)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// DeclaredValues is what declared-values holds: per entrypoint name, the value recorded for it
// outside cockpitfs, as written.
type DeclaredValues struct {
	Text      string            `json:"text"`
	Values    map[string]string `json:"values"`
	UpdatedAt string            `json:"updatedAt"`
}

const maxDeclaredValues = 1024 // the seeds' structured input limit

// parseDeclaredValues reads a declared-values document: one `<entrypoint name>=<value>` per line,
// blank lines and lines starting with '#' ignored; a name at most once.
func parseDeclaredValues(text []byte) (map[string]string, error) {
	const fix = "write one <entrypoint name>=<value> per line, the whole document at once"
	if !utf8.Valid(text) {
		return nil, refuse(StateRecordMalformed, "", fix, "declared values are not UTF-8")
	}
	if err := portdecl.CheckText(text); err != nil {
		return nil, refuse(StateRecordMalformed, "", fix, "declared values: %v", err)
	}
	values := map[string]string{}
	for i, line := range strings.Split(string(text), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		switch {
		case !ok || !ValidName(name):
			return nil, refuse(StateRecordMalformed, "", fix, "line %d: %q is not <entrypoint name>=<value>", i+1, line)
		case value == "" || strings.IndexFunc(value, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
			return nil, refuse(StateRecordMalformed, "", fix, "line %d: the value of %s is empty or holds white space", i+1, name)
		}
		if _, twice := values[name]; twice {
			return nil, refuse(StateRecordMalformed, "", fix, "line %d: %s is declared twice", i+1, name)
		}
		if len(values) == maxDeclaredValues {
			return nil, refuse(StateRecordMalformed, "", fix, "more than %d declared values", maxDeclaredValues)
		}
		values[name] = value
	}
	return values, nil
}

// DeclaredValues returns what the stack's declared-values holds (empty before any write).
func (e *Engine) DeclaredValues(cockpit, stack string) (DeclaredValues, error) {
	var dv DeclaredValues
	err := e.db.View(func(tx storage.Txn) error {
		if _, err := tx.Get(stackKey(cockpit, stack)); errors.Is(err, storage.ErrNotFound) {
			return refuse(NotFound, StackID(cockpit, stack), "", "stack %s does not exist", stack)
		} else if err != nil {
			return err
		}
		_, err := getJSON(tx, declaredValuesKey(cockpit, stack), &dv)
		return err
	})
	return dv, err
}

// mayDeclareValues says whether c may write the declared values of r's stack: the cockpit's
// owner and the stack's holders' uids may, since each of them runs the stack.
func mayDeclareValues(c Caller, r Record, cockpitUID uint32) error {
	if !c.may(cockpitUID) && !slices.ContainsFunc(r.Value.Holders, func(h Holder) bool { return c.may(h.UID) }) {
		return c.denied("the declared values of stack "+r.Stack, cockpitUID)
	}
	return nil
}

// MayWriteDeclaredValues refuses, at open, a writer who may not write the stack's declared values.
func (e *Engine) MayWriteDeclaredValues(c Caller, cockpit, stack string) error {
	info, err := e.Cockpit(cockpit)
	if err != nil {
		return err
	}
	r, err := e.Stack(cockpit, stack)
	if err != nil {
		return err
	}
	return mayDeclareValues(c, r, info.UID)
}

// SetDeclaredValues replaces the stack's declared values with the document text.
func (e *Engine) SetDeclaredValues(ctx context.Context, c Caller, cockpit, stack string, text []byte) error {
	// Under the stack's lock: its events file gets the line, and the cockpit's wait wakes for it.
	return e.apply(ctx, c, stackKey(cockpit, stack), func(tx storage.Txn, now time.Time) (change, error) {
		m, r, err := e.loadStack(tx, cockpit, stack)
		if err != nil {
			return change{}, err
		}
		var dv DeclaredValues
		if _, err := getJSON(tx, declaredValuesKey(cockpit, stack), &dv); err != nil {
			return change{}, err
		}
		return setDeclaredValues(c, m, stack, r, dv, text, now)
	})
}

// setDeclaredValues is the step of SetDeclaredValues: dv are the stack's declared values now.
func setDeclaredValues(c Caller, m cockpitMeta, stack string, r Record, dv DeclaredValues, text []byte, now time.Time) (change, error) {
	if err := mayDeclareValues(c, r, m.UID); err != nil {
		return change{}, err
	}
	values, err := parseDeclaredValues(text)
	if err != nil {
		var rf *Refusal
		if errors.As(err, &rf) {
			rf.Target = r.SubjectID
		}
		return change{}, err
	}
	if dv.Text == string(text) {
		return change{}, errUnchanged
	}
	next := DeclaredValues{Text: string(text), Values: values, UpdatedAt: stamp(now)}
	return change{cockpit: m.Name, declared: &declaredChange{stack: stack, values: next}, line: stack, revision: r.Revision}, nil
}
