package engine

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Parsers of the drain control files (SPEC §7). Every refusal here is STATE_RECORD_MALFORMED.

const defaultValidForMs = 120000

// DrainRequest is a parsed write to drain/request.
type DrainRequest struct {
	Purpose  string   // sleep | down | reset
	Targets  []string // reclaim targets as written (not including the stack)
	Holder   string   // holder NAME; "" = the stack's only holder
	Revision *int64   // nil = the revision when the file was opened (the fs passes it as openedAt)
	ValidFor int64    // ms, 1..300000, 0 = default 120000
	// From the JSON form only (the seeds' request fields); "" = derived:
	ConfigSha256, PlanDigest, OperationBasis, Generation string

	// given is the plan a JSON request states; the reservation must derive exactly it.
	given *givenPlan
}

// givenPlan is what a JSON request names by identity rather than by name.
type givenPlan struct {
	StackID     string
	HolderID    string
	RequesterID string // the seeds' requesterId: a reservation needs it to be the holder
	TargetIDs   []string
	Actions     []drainAction
}

// requesterID is the identity of the holder the request names, "" when it names none.
func (q DrainRequest) requesterID() string {
	switch {
	case q.given != nil:
		return q.given.HolderID
	case q.Holder != "":
		return holderID(q.Holder)
	default:
		return ""
	}
}

// holderName names the holder the request names, for a message.
func (q DrainRequest) holderName() string {
	if q.Holder != "" {
		return q.Holder
	}
	return q.requesterID()
}

// samePlan reports whether q asks for the work d reserved: the same reclaim targets and, where q
// states them, the same validity and the same plan fields (all of them for a JSON request, the
// seeds' sameDrainRequest but for the revision, which the caller checks).
func (q DrainRequest) samePlan(d *Drain) bool {
	if g := q.given; g != nil {
		return g.StackID == d.StackID && g.RequesterID == d.RequesterID && q.ConfigSha256 == d.ConfigSha256 && q.PlanDigest == d.PlanDigest &&
			q.OperationBasis == d.OperationBasis && q.Generation == d.Generation &&
			equalStrings(g.TargetIDs, d.TargetIDs) && canonicalJSON(g.Actions) == canonicalJSON(d.Actions)
	}
	if !equalStrings(sortedCopy(q.Targets), reclaimTargets(d)) {
		return false
	}
	for _, a := range d.Actions {
		if q.ValidFor != 0 && a.ValidForMs != q.ValidFor {
			return false
		}
	}
	return true
}

func (q DrainRequest) validForMs() int64 {
	if q.ValidFor == 0 {
		return defaultValidForMs
	}
	return q.ValidFor
}

const requestFix = "write `sleep`, or `down|reset [target ...]` with optional holder=<name> revision=<n> valid_for=<ms> target=<target>"

func malformedRequest(format string, args ...any) error {
	return refuse(StateRecordMalformed, "drain/request", requestFix, format, args...)
}

// ParseDrainRequest parses `sleep`, `down volume:db volume:cache`,
// `reset target=volume:db holder=me revision=12 valid_for=60000`, or a JSON object with the
// seeds' request fields.
func ParseDrainRequest(text string) (DrainRequest, error) {
	trimmed := strings.TrimSpace(text)
	if trimmed != "" && strings.ContainsRune(`{["`, rune(trimmed[0])) {
		return parseDrainRequestJSON([]byte(trimmed))
	}
	tokens := strings.Fields(text)
	if len(tokens) == 0 {
		return DrainRequest{}, malformedRequest("the request is empty")
	}
	q := DrainRequest{Purpose: tokens[0]}
	if !validPurpose(q.Purpose) {
		return DrainRequest{}, malformedRequest("purpose %q is not sleep, down or reset", q.Purpose)
	}
	seen := map[string]bool{}
	for _, token := range tokens[1:] {
		key, value, ok := strings.Cut(token, "=")
		if !ok {
			key, value = "target", token
		}
		if key != "target" && seen[key] {
			return DrainRequest{}, malformedRequest("%s= is given twice", key)
		}
		seen[key] = true
		switch key {
		case "target":
			q.Targets = append(q.Targets, value)
		case "holder":
			if !ValidName(value) {
				return DrainRequest{}, malformedRequest("holder name %q is invalid", value)
			}
			q.Holder = value
		case "revision":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 0 || strconv.FormatInt(n, 10) != value {
				return DrainRequest{}, malformedRequest("revision %q is not a non-negative integer", value)
			}
			q.Revision = &n
		case "valid_for":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 1 || n > maxValidForMs || strconv.FormatInt(n, 10) != value {
				return DrainRequest{}, malformedRequest("valid_for %q is not 1-%d milliseconds", value, maxValidForMs)
			}
			q.ValidFor = n
		default:
			return DrainRequest{}, malformedRequest("unknown key %q", key)
		}
	}
	if err := checkReclaimTargets(q.Purpose, q.Targets); err != nil {
		return DrainRequest{}, err
	}
	return q, nil
}

func validPurpose(p string) bool { return p == "sleep" || p == "down" || p == "reset" }

// checkReclaimTargets: 1-512 bytes, no NUL, distinct, none for sleep, and room for the stack's own
// target within the record's limit.
func checkReclaimTargets(purpose string, targets []string) error {
	if purpose == "sleep" && len(targets) > 0 {
		return malformedRequest("sleep only stops the runtime; it takes no targets (use down or reset)")
	}
	if len(targets) >= maxHolders {
		return malformedRequest("%d targets exceed %d", len(targets), maxHolders-1)
	}
	seen := map[string]bool{}
	for _, t := range targets {
		switch {
		case t == "" || len(t) > maxTargetBytes:
			return malformedRequest("target of %d bytes is not 1-%d bytes", len(t), maxTargetBytes)
		case strings.ContainsRune(t, 0):
			return malformedRequest("target %q contains NUL", t)
		case seen[t]:
			return malformedRequest("target %q is named twice", t)
		}
		if err := checkTargetName(t); err != nil {
			return err
		}
		seen[t] = true
	}
	return nil
}

// checkTargetName refuses a target an executor would take outside what it reclaims: what names
// the resource (after a kind such as "volume:", or the whole target) is a relative path — not
// absolute, no "." or ".." component, no empty one, not starting with "-" (an option to a
// command) — and the target is printable UTF-8, no control byte (docs/spec.md §7).
func checkTargetName(t string) error {
	if !utf8.ValidString(t) || strings.ContainsFunc(t, unicode.IsControl) {
		return malformedRequest("target %q has a control character or is not UTF-8", t)
	}
	name := t
	if kind, rest, ok := strings.Cut(t, ":"); ok && kind != "" {
		name = rest
	}
	if strings.HasPrefix(name, "-") {
		return malformedRequest("target %q starts its name with \"-\", which a command would read as an option", t)
	}
	for _, part := range strings.Split(name, "/") {
		if part == "" || part == "." || part == ".." {
			return malformedRequest("target %q names no relative path below the executor's own (no leading \"/\", no empty, \".\" or \"..\" component)", t)
		}
	}
	return nil
}

// requestJSONKeys are the seeds' drain request fields, all required, no others.
var requestJSONKeys = []string{"purpose", "stackId", "holderId", "requesterId", "configSha256", "planDigest",
	"operationBasis", "generation", "targetIds", "actions", "expectedCoordinationRevision"}

// parseDrainRequestJSON reads the seeds' request. Its plan is checked against the stack when the
// reservation derives its own: the names behind the identities are only known there.
func parseDrainRequestJSON(data []byte) (DrainRequest, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil || fields == nil {
		return DrainRequest{}, malformedRequest("the JSON request is not one object")
	}
	for _, k := range requestJSONKeys {
		if _, ok := fields[k]; !ok {
			return DrainRequest{}, malformedRequest("the JSON request lacks %q", k)
		}
	}
	if len(fields) != len(requestJSONKeys) {
		return DrainRequest{}, malformedRequest("the JSON request has fields besides %s", strings.Join(requestJSONKeys, ", "))
	}
	var j drainPlan
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return DrainRequest{}, malformedRequest("the JSON request is malformed: %v", err)
	}
	switch {
	case !validPurpose(j.Purpose):
		return DrainRequest{}, malformedRequest("purpose %q is not sleep, down or reset", j.Purpose)
	case !isStackID(j.StackID):
		return DrainRequest{}, malformedRequest("stackId %q is not a stack identity", j.StackID)
	case !isHolderID(j.HolderID) || !isHolderID(j.RequesterID):
		return DrainRequest{}, malformedRequest("holderId and requesterId must be holder identities")
	case !isSHA256Hex(j.ConfigSha256) || !isSHA256Hex(j.PlanDigest) ||
		!isSHA256Hex(j.OperationBasis) || !isSHA256Hex(j.Generation):
		return DrainRequest{}, malformedRequest("configSha256, planDigest, operationBasis and generation must be sha256 hex")
	case j.ExpectedCoordinationRevision < 0:
		return DrainRequest{}, malformedRequest("expectedCoordinationRevision %d is negative", j.ExpectedCoordinationRevision)
	case len(j.Actions) == 0 || j.Actions[0].ValidForMs < 1 || j.Actions[0].ValidForMs > maxValidForMs:
		return DrainRequest{}, malformedRequest("actions must start with a runtime-stop valid for 1-%d ms", maxValidForMs)
	}
	var reclaim []string
	for _, t := range j.TargetIDs {
		if t != j.StackID {
			reclaim = append(reclaim, t)
		}
	}
	if err := checkReclaimTargets(j.Purpose, reclaim); err != nil {
		return DrainRequest{}, err
	}
	revision := j.ExpectedCoordinationRevision
	return DrainRequest{
		Purpose:        j.Purpose,
		Targets:        reclaim,
		Revision:       &revision,
		ValidFor:       j.Actions[0].ValidForMs,
		ConfigSha256:   j.ConfigSha256,
		PlanDigest:     j.PlanDigest,
		OperationBasis: j.OperationBasis,
		Generation:     j.Generation,
		given:          &givenPlan{StackID: j.StackID, HolderID: j.HolderID, RequesterID: j.RequesterID, TargetIDs: j.TargetIDs, Actions: j.Actions},
	}, nil
}

// ParseAttemptCommand parses `start [pid=<n>|none]`: executorPID is -1 for the default (the
// writer), 0 for none.
func ParseAttemptCommand(text string) (executorPID int, err error) {
	const fix = "write `start`, `start pid=<executor pid>` or `start pid=none`"
	tokens := strings.Fields(text)
	if len(tokens) == 0 || tokens[0] != "start" || len(tokens) > 2 {
		return 0, refuse(StateRecordMalformed, "drain/attempt", fix, "attempt command %q is not start [pid=<n>|none]", text)
	}
	if len(tokens) == 1 {
		return -1, nil
	}
	value, ok := strings.CutPrefix(tokens[1], "pid=")
	if !ok {
		return 0, refuse(StateRecordMalformed, "drain/attempt", fix, "unknown attempt attribute %q", tokens[1])
	}
	pid, ok := parsePID(value)
	if !ok {
		return 0, refuse(StateRecordMalformed, "drain/attempt", fix, "pid %q is not a process id", value)
	}
	return pid, nil
}

// Outcome is a drain/outcome write: `success|failure [attempt=<attemptId>] [planned=<revision>]`.
type Outcome struct {
	Success bool
	// AttemptID "" names whichever attempt is active.
	AttemptID string
	// Planned is the revision of the planning record (drain/planning) the executor acted on, nil
	// when not given. Given, the outcome applies only to the reclaim planned from that record.
	Planned *int64
}

// ParseOutcomeCommand parses an outcome write; each attribute at most once, in any order.
func ParseOutcomeCommand(text string) (Outcome, error) {
	const fix = "write `success` or `failure`, optionally with attempt=<attemptId> and planned=<planning revision>"
	var o Outcome
	tokens := strings.Fields(text)
	if len(tokens) == 0 || tokens[0] != "success" && tokens[0] != "failure" || len(tokens) > 3 {
		return o, refuse(StateRecordMalformed, "drain/outcome", fix, "outcome command %q is not success|failure [attempt=<id>] [planned=<revision>]", text)
	}
	o.Success = tokens[0] == "success"
	seen := map[string]bool{}
	for _, token := range tokens[1:] {
		key, value, _ := strings.Cut(token, "=")
		if seen[key] {
			return o, refuse(StateRecordMalformed, "drain/outcome", fix, "outcome attribute %q is repeated", key)
		}
		seen[key] = true
		switch key {
		case "attempt":
			if !isSHA256Hex(value) {
				return o, refuse(StateRecordMalformed, "drain/outcome", fix, "outcome attribute %q is not attempt=<64 hex>", token)
			}
			o.AttemptID = value
		case "planned":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 0 || strconv.FormatInt(n, 10) != value {
				return o, refuse(StateRecordMalformed, "drain/outcome", fix, "outcome attribute %q is not planned=<revision>", token)
			}
			o.Planned = &n
		default:
			return o, refuse(StateRecordMalformed, "drain/outcome", fix, "unknown outcome attribute %q", token)
		}
	}
	return o, nil
}

// ParseRepairCommand parses `terminated`, the only repair there is.
func ParseRepairCommand(text string) error {
	if tokens := strings.Fields(text); len(tokens) != 1 || tokens[0] != "terminated" {
		return refuse(StateRecordMalformed, "drain/repair", "write `terminated`", "repair command %q is not terminated", text)
	}
	return nil
}
