package portdecl

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/BurntSushi/toml"
)

const (
	// MaxDocumentBytes is the largest config document Parse accepts.
	MaxDocumentBytes = 64 << 10
	// maxDeclaredEntrypoints is the seeds' structured input budget for entrypoint declarations.
	maxDeclaredEntrypoints = 1024
	maxNameBytes           = 128
	defaultScheme          = "http"
	defaultHostname        = "127.0.0.1"
	// DefaultKind is the kind of every default entrypoint and of a declared one that names none,
	// as the seeds' deriveEntrypoints renders the defaults.
	DefaultKind = "entrypoint"
	// ipv6Loopback is how the IPv6 loopback is kept in Entrypoint.Hostname: bracketed, as a URL
	// needs it, so "<scheme>://<hostname>:<port><path>" is a URL with no special case.
	ipv6Loopback = "[::1]"
)

// Entrypoint is a declared entrypoint: a URL on one of the leased ports.
type Entrypoint struct {
	Name     string `json:"name"`
	Port     string `json:"port"`     // a key of Bases
	Path     string `json:"path"`     // starts with "/"
	Scheme   string `json:"scheme"`   // any URL scheme: "http" (default), "https", "postgres", "redis" …
	Hostname string `json:"hostname"` // a loopback name or address, default "127.0.0.1"; IPv6 as "[::1]"
	// Kind says what the URL is for (the seeds' entrypoint kind): "" (a config accepted before
	// kinds existed) reads as DefaultKind.
	Kind string `json:"kind,omitempty"`
	// Proxied asks for the entrypoint's URL through the daemon's web proxy
	// (http://<name>.<stack>.<cockpit>.localhost:<port><path>) wherever a URL is exported — env,
	// entrypoints/<name>, {url.NAME} — when the daemon serves one (mount --proxy). http or https only.
	Proxied bool `json:"proxied,omitempty"`
}

// Config is an accepted config document.
type Config struct {
	Declaration Declaration
	Entrypoints []Entrypoint // the declared ones, sorted by Name
	// EnvPrefix ([env] prefix) starts every name the env file exports: "APP_" makes DB=5432
	// APP_DB=5432, so a cockpit's names never meet a tool's.
	EnvPrefix string `json:",omitempty"`
	// BaseOrder is the keys of [ports.bases] in the document's order, the order the seeds lease
	// them in and list their default entrypoints in (a JavaScript object keeps its keys' order).
	BaseOrder []string `json:",omitempty"`
	// Derived are the [env] table's other keys, by name: names exported as written, with values
	// rendered per stack from a template (see Derived).
	Derived []Derived `json:",omitempty"`
	// Lifecycle is [gc] and [stop]: when a stale stack is drained, how long a stop waits.
	Lifecycle Lifecycle `json:",omitzero"`
}

// OrderPorts orders port keys as order (a Config's BaseOrder) declares them; keys it does not
// name (a lease taken under an earlier declaration, a config accepted before the order was kept)
// follow, sorted.
func OrderPorts(order, keys []string) []string {
	rank := make(map[string]int, len(order))
	for i, key := range order {
		rank[key] = i
	}
	out := slices.Clone(keys)
	slices.SortFunc(out, func(a, b string) int {
		ra, oka := rank[a]
		rb, okb := rank[b]
		switch {
		case oka && okb:
			return cmp.Compare(ra, rb)
		case oka != okb:
			if oka {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return out
}

// Parse parses and validates a config document (SPEC §3). Every error is a message naming what
// is wrong and where (`ports.bases.HTTP: 70000 is outside 1-65535`), for the engine to refuse
// with (PORT_FAMILY_OUT_OF_RANGE, EINVAL). Unknown tables and keys are errors, and keys match
// exactly (the TOML decoder would match struct fields case-insensitively, so the document is
// walked as plain tables instead). Beyond SPEC §3, every env variable the config implies (KEY
// per port key, <NAME>_URL per entrypoint) must be distinct, so the env file never sets one twice.
func Parse(text []byte) (Config, error) { return parse(text, false) }

// ParsePrefix judges the beginning of a document still being written, up to the end of a line
// (bash's printf writes a line per write(2)): it refuses only what no further line can fix — a
// syntax error in a complete line, an unknown key, a value out of range, a duplicate — with the
// message Parse would give, and something missing once TOML lets no later line add it (count
// missing from a [ports] another header followed). What may still follow is not judged: a
// missing [ports], or a step, count, base, entrypoint port or path a later line may still add,
// a multi-line string or array still open.
func ParsePrefix(text []byte) error {
	_, err := parse(text, true)
	return err
}

// parse is Parse, or ParsePrefix when partial is set.
func parse(text []byte, partial bool) (Config, error) {
	var later addable // nil: a whole document gains nothing
	if partial {
		later = func(key string, table ...string) bool { return stillAddable(text, key, table...) }
	}
	if len(text) > MaxDocumentBytes {
		return Config{}, fmt.Errorf("config: the document is %d bytes, more than %d", len(text), MaxDocumentBytes)
	}
	if err := CheckText(text); err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if err := checkNesting(text); err != nil {
		return Config{}, err
	}
	var document map[string]any
	meta, err := toml.Decode(string(text), &document)
	if err != nil {
		if partial && endsOpen(text, err) {
			return Config{}, nil
		}
		return Config{}, fmt.Errorf("config: %v", err)
	}
	if err := onlyKeys(document, "", "entrypoints", "env", "gc", "ports", "stop"); err != nil {
		return Config{}, err
	}
	var declaration Declaration
	if rawPorts, ok := document["ports"]; ok {
		var given known
		var err error
		if declaration, given, err = parsePorts(rawPorts, later); err != nil {
			return Config{}, err
		}
		if err := declaration.validate(given); err != nil {
			return Config{}, err
		}
	} else if !partial {
		return Config{}, missing("config: no [ports] table")
	}
	rawEntrypoints, ok := document["entrypoints"]
	if !ok {
		rawEntrypoints = map[string]any{}
	}
	entrypoints, err := parseEntrypoints(rawEntrypoints, declaration.Bases, later)
	if err != nil {
		return Config{}, err
	}
	env, prefix, err := parseEnv(document["env"])
	if err != nil {
		return Config{}, err
	}
	// A prefix may still follow in a partial document, and would change every name.
	prefixFinal := later == nil || prefix != "" || !later("prefix", "env")
	derived, err := parseDerived(env, prefix, prefixFinal, declaration.Bases, entrypoints, later)
	if err != nil {
		return Config{}, err
	}
	if prefixFinal {
		if err := checkExported(prefix, declaration.Bases, entrypoints); err != nil {
			return Config{}, err
		}
	}
	lifecycle, err := parseLifecycle(document)
	if err != nil {
		return Config{}, err
	}
	var order []string
	for _, key := range meta.Keys() {
		if len(key) == 3 && key[0] == "ports" && key[1] == "bases" {
			order = append(order, key[2])
		}
	}
	return Config{Declaration: declaration, Entrypoints: entrypoints, EnvPrefix: prefix, BaseOrder: order, Derived: derived, Lifecycle: lifecycle}, nil
}

// checkExported refuses a config whose env file would export a name CheckExported refuses.
func checkExported(prefix string, bases map[string]int, entrypoints []Entrypoint) error {
	for _, key := range slices.Sorted(maps.Keys(bases)) {
		if err := CheckExported(prefix + key); err != nil {
			return fmt.Errorf("ports.bases.%s: the env file would export %w", key, err)
		}
	}
	for _, e := range entrypoints {
		if err := CheckExported(prefix + EnvName(e.Name)); err != nil {
			return fmt.Errorf("entrypoints.%s: the env file would export %w", quoteKey(e.Name), err)
		}
	}
	return nil
}

// CheckText refuses a document another user's `cat` shows as it was written (a config,
// declared values) when it holds a control character a terminal acts on: anything but tab and
// newline, a carriage return only before a newline. TOML refuses most of them; C1 controls
// (U+0080-U+009F) it lets through in comments. Nor may it hold a bidirectional embedding,
// override or isolate (U+202A-U+202E, U+2066-U+2069): they reorder what is shown, so a comment
// could show one value where another is (CVE-2021-42574, "Trojan Source").
func CheckText(text []byte) error {
	for i, r := range string(text) {
		if unicode.IsControl(r) && r != '\t' && r != '\n' && !(r == '\r' && i+1 < len(text) && text[i+1] == '\n') {
			line := 1 + bytes.Count(text[:i], []byte{'\n'})
			return fmt.Errorf("line %d: control character %U, which a terminal reading the document would act on", line, r)
		}
		if r >= 0x202A && r <= 0x202E || r >= 0x2066 && r <= 0x2069 {
			line := 1 + bytes.Count(text[:i], []byte{'\n'})
			return fmt.Errorf("line %d: bidirectional control character %U, which reorders the text a reader is shown", line, r)
		}
	}
	return nil
}

// parseEnv reads the optional [env] table: the table itself (nil without one), and its prefix,
// upper-case letters, digits and '_', not starting with a digit, at most 64 bytes. Its other
// keys are derived values (parseDerived).
func parseEnv(raw any) (map[string]any, string, error) {
	if raw == nil {
		return nil, "", nil
	}
	env, err := table(raw, "env")
	if err != nil {
		return nil, "", err
	}
	if _, given := env["prefix"]; !given {
		return env, "", nil
	}
	prefix, err := text(env, "prefix", "env.prefix")
	if err != nil {
		return nil, "", err
	}
	valid := prefix != "" && len(prefix) <= 64 && (prefix[0] < '0' || prefix[0] > '9')
	for _, c := range prefix {
		valid = valid && (c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_')
	}
	if !valid {
		return nil, "", fmt.Errorf("env.prefix: %q is not 1-64 bytes of [A-Z0-9_] starting with a letter or '_'", prefix)
	}
	return env, prefix, nil
}

// parsePorts reads the [ports] table and says which of its parts are given: a prefix of a
// document may lack step or count, and its bases may grow, where TOML lets a later line add them.
func parsePorts(raw any, later addable) (Declaration, known, error) {
	given := known{step: true, count: true, bases: true}
	ports, err := table(raw, "ports")
	if err != nil {
		return Declaration{}, given, err
	}
	if err := onlyKeys(ports, "ports.", "bases", "count", "step"); err != nil {
		return Declaration{}, given, err
	}
	step, err := integer(ports, "step", "ports.step")
	if later != nil && isMissing(err) && later("step", "ports") {
		given.step, err = false, nil
	}
	if err != nil {
		return Declaration{}, given, err
	}
	count, err := integer(ports, "count", "ports.count")
	if later != nil && isMissing(err) && later("count", "ports") {
		given.count, err = false, nil
	}
	if err != nil {
		return Declaration{}, given, err
	}
	bases := map[string]int{}
	if rawBases, ok := ports["bases"]; ok {
		baseTable, err := table(rawBases, "ports.bases")
		if err != nil {
			return Declaration{}, given, err
		}
		for _, key := range slices.Sorted(maps.Keys(baseTable)) {
			base, err := integer(baseTable, key, "ports.bases."+quoteKey(key))
			if err != nil {
				return Declaration{}, given, err
			}
			bases[key] = base
		}
	}
	// Empty bases may still gain one (probed only then: each probe parses the document again).
	given.bases = len(bases) > 0 || later == nil || !later("A", "ports", "bases")
	return Declaration{Step: step, Count: count, Bases: bases}, given, nil
}

func parseEntrypoints(raw any, bases map[string]int, later addable) ([]Entrypoint, error) {
	tables, err := table(raw, "entrypoints")
	if err != nil {
		return nil, err
	}
	if len(tables) > maxDeclaredEntrypoints {
		return nil, fmt.Errorf("entrypoints: %d declared, more than %d", len(tables), maxDeclaredEntrypoints)
	}
	// The env file holds "KEY=port" per port key and "<NAME>_URL=url" per entrypoint; two lines
	// for one variable would let the later silently win, so every variable must be unique.
	variables := make(map[string]string, len(bases)*2+len(tables))
	for key := range bases {
		variables[key] = "port key " + key
	}
	defaults := make(map[string]string, len(bases))
	for _, key := range slices.Sorted(maps.Keys(bases)) {
		name := defaultEntrypointName(key)
		defaults[name] = key
		if other, taken := variables[EnvName(name)]; taken {
			return nil, fmt.Errorf("ports.bases.%s: its default entrypoint %s sets %s, which %s sets too",
				key, name, EnvName(name), other)
		}
		variables[EnvName(name)] = "default entrypoint " + name
	}
	var entrypoints []Entrypoint
	for _, name := range slices.Sorted(maps.Keys(tables)) {
		where := "entrypoints." + quoteKey(name)
		if !validName(name) {
			return nil, fmt.Errorf("%s: a name is 1-128 bytes of [A-Za-z0-9._-], not starting with '.' or '-'", where)
		}
		entrypoint, err := parseEntrypoint(name, tables[name], where, bases, later)
		if err != nil {
			return nil, err
		}
		if key, isDefault := defaults[name]; isDefault {
			return nil, fmt.Errorf("%s: the name is taken by the default entrypoint of port %s", where, key)
		}
		if other, taken := variables[EnvName(name)]; taken {
			return nil, fmt.Errorf("%s: it sets %s, which %s sets too", where, EnvName(name), other)
		}
		variables[EnvName(name)] = "entrypoint " + name
		entrypoints = append(entrypoints, entrypoint)
	}
	return entrypoints, nil
}

// parseEntrypoint reads one entrypoint. In a partial document (a prefix), a port or path not
// given yet may still follow, and so may the base its port names, if TOML lets them.
func parseEntrypoint(name string, raw any, where string, bases map[string]int, later addable) (Entrypoint, error) {
	fields, err := table(raw, where)
	if err != nil {
		return Entrypoint{}, err
	}
	if err := onlyKeys(fields, where+".", "hostname", "kind", "path", "port", "proxied", "scheme"); err != nil {
		return Entrypoint{}, err
	}
	entrypoint := Entrypoint{Name: name, Scheme: defaultScheme, Hostname: defaultHostname, Kind: DefaultKind}
	if _, given := fields["kind"]; given {
		kind, err := text(fields, "kind", where+".kind")
		if err != nil {
			return Entrypoint{}, err
		}
		if !validKind(kind) {
			return Entrypoint{}, fmt.Errorf("%s.kind: %q is not a kind (1-32 bytes: a lower-case letter, then lower-case letters, digits or '-': entrypoint, oauth-callback, webhook …)", where, kind)
		}
		entrypoint.Kind = kind
	}
	entrypoint.Port, err = text(fields, "port", where+".port")
	// A base may still be declared later in a partial document, but never under a name that is
	// no port key (a lower-case "http", say).
	if _, declared := bases[entrypoint.Port]; err == nil && !declared &&
		(later == nil || !ValidKey(entrypoint.Port) || !later(entrypoint.Port, "ports", "bases")) {
		err = fmt.Errorf("%s.port: %q is not a key of [ports.bases]", where, entrypoint.Port)
	}
	if err != nil && !(later != nil && isMissing(err) && later("port", "entrypoints", name)) {
		return Entrypoint{}, err
	}
	entrypoint.Path, err = text(fields, "path", where+".path")
	if later != nil && isMissing(err) && later("path", "entrypoints", name) {
		entrypoint.Path, err = "/", nil
	}
	if err != nil {
		return Entrypoint{}, err
	}
	if !strings.HasPrefix(entrypoint.Path, "/") {
		return Entrypoint{}, fmt.Errorf("%s.path: %q does not start with \"/\"", where, entrypoint.Path)
	}
	// The path ends up in a URL line and an env file line that other users' shells read.
	if err := checkPath(entrypoint.Path); err != nil {
		return Entrypoint{}, fmt.Errorf("%s.path: %w", where, err)
	}
	if _, given := fields["scheme"]; given {
		scheme, err := text(fields, "scheme", where+".scheme")
		if err != nil {
			return Entrypoint{}, err
		}
		if !validScheme(scheme) {
			return Entrypoint{}, fmt.Errorf("%s.scheme: %q is not a URL scheme (a lower-case letter, then letters, digits, '+', '-' or '.': http, https, postgres, redis, amqp …)", where, scheme)
		}
		entrypoint.Scheme = scheme
	}
	if _, given := fields["hostname"]; given {
		hostname, err := text(fields, "hostname", where+".hostname")
		if err != nil {
			return Entrypoint{}, err
		}
		if entrypoint.Hostname, err = loopbackHostname(hostname); err != nil {
			return Entrypoint{}, fmt.Errorf("%s.hostname: %w", where, err)
		}
	}
	if v, given := fields["proxied"]; given {
		proxied, ok := v.(bool)
		if !ok {
			return Entrypoint{}, fmt.Errorf("%s.proxied: %v is not true or false", where, v)
		}
		if proxied && entrypoint.Scheme != "http" && entrypoint.Scheme != "https" {
			return Entrypoint{}, fmt.Errorf("%s.proxied: only an http or https entrypoint can be proxied, not %s", where, entrypoint.Scheme)
		}
		entrypoint.Proxied = proxied
	}
	return entrypoint, nil
}

// loopbackHostname accepts "localhost", an IPv4 address in 127.0.0.0/8, "::1" or "[::1]", and
// returns it as it goes in a URL.
func loopbackHostname(hostname string) (string, error) {
	switch hostname {
	case "localhost":
		return hostname, nil
	case "::1", ipv6Loopback:
		return ipv6Loopback, nil
	}
	if addr, err := netip.ParseAddr(hostname); err == nil && addr.Is4() && addr.IsLoopback() {
		return hostname, nil
	}
	return "", fmt.Errorf("%q is not a loopback name or address (localhost, 127.0.0.0/8, ::1)", hostname)
}

// validName is the tree's name rule (SPEC §2): 1-128 bytes of [A-Za-z0-9._-], not starting with
// '.' or '-'.
func validName(name string) bool {
	if name == "" || len(name) > maxNameBytes || name[0] == '.' || name[0] == '-' {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// onlyKeys refuses the first key of t, in sorted order, that is not one of allowed.
func onlyKeys(t map[string]any, prefix string, allowed ...string) error {
	for _, key := range slices.Sorted(maps.Keys(t)) {
		if !slices.Contains(allowed, key) {
			return fmt.Errorf("%s%s: unknown key (expected one of %s)", prefix, quoteKey(key), strings.Join(allowed, ", "))
		}
	}
	return nil
}

func table(raw any, where string) (map[string]any, error) {
	t, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: must be a table, got %s", where, typeName(raw))
	}
	return t, nil
}

func integer(t map[string]any, key, where string) (int, error) {
	raw, ok := t[key]
	if !ok {
		return 0, missing(where + ": required")
	}
	n, ok := raw.(int64)
	if !ok {
		return 0, fmt.Errorf("%s: must be an integer, got %s", where, typeName(raw))
	}
	return int(n), nil
}

func text(t map[string]any, key, where string) (string, error) {
	raw, ok := t[key]
	if !ok {
		return "", missing(where + ": required")
	}
	s, ok := raw.(string)
	if !ok {
		return "", fmt.Errorf("%s: must be a string, got %s", where, typeName(raw))
	}
	return s, nil
}

// typeName names a decoded TOML value's type the way the TOML spec does.
func typeName(v any) string {
	switch v := v.(type) {
	case int64:
		return fmt.Sprintf("integer %d", v)
	case float64:
		return fmt.Sprintf("float %v", v)
	case string:
		return fmt.Sprintf("string %q", v)
	case bool:
		return fmt.Sprintf("boolean %t", v)
	case time.Time:
		return "a date or time"
	case map[string]any:
		return "a table"
	case []any, []map[string]any:
		return "an array"
	default:
		return fmt.Sprintf("%T", v)
	}
}

// validKind says s is an entrypoint kind: a lower-case word with '-', at most 32 bytes. The
// seeds check kinds against a list of their own that is not in the reference, so any such word
// is accepted.
func validKind(s string) bool {
	if s == "" || len(s) > 32 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// validScheme says s is a URL scheme as RFC 3986 spells one, in lower case and at most 32 bytes.
func validScheme(s string) bool {
	if s == "" || len(s) > 32 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// missingError is something a document lacks: a prefix of it may still be followed by it.
type missingError string

func (e missingError) Error() string { return string(e) }

func missing(message string) error { return missingError(message) }

func isMissing(err error) bool {
	var m missingError
	return errors.As(err, &m)
}

// endsOpen says the decoder's err on a prefix of a document is where the text ends (a multi-line
// string, array or inline table still open), so more lines may complete it: with one more
// newline, the error moves with the end. An error in a complete line stays where it is.
func endsOpen(text []byte, err error) bool {
	var first, again toml.ParseError
	var document map[string]any
	_, errAgain := toml.Decode(string(text)+"\n", &document)
	if !errors.As(err, &first) || !errors.As(errAgain, &again) {
		return errAgain == nil
	}
	return again.Position.Start != first.Position.Start
}

// addable says a later line of a partial document may still add key to the table at path
// (see stillAddable); nil for a whole document.
type addable func(key string, table ...string) bool

// maxProbedPrefix bounds the prefixes stillAddable probes: each probe parses the prefix again.
// A longer prefix is taken to gain anything.
const maxProbedPrefix = 4 << 10

// stillAddable says a line after text (a prefix of a document that decodes) can still give the
// table at path the key, with a scalar value. TOML adds to a table only in the section being
// written (a dotted key from there) or under a header not used yet: each way is tried by decoding
// text with one more line. A table whose header was followed by another one, say, is complete.
func stillAddable(text []byte, key string, table ...string) bool {
	if len(text) > maxProbedPrefix {
		return true
	}
	full := append(append([]string(nil), table...), key)
	var probes []string
	// The likeliest first: the key in the section being written.
	for i := len(full) - 1; i >= 0; i-- {
		probes = append(probes, dotted(full[i:])+" = 1\n")
	}
	for i := 1; i < len(full); i++ {
		probes = append(probes, "["+dotted(full[:i])+"]\n"+dotted(full[i:])+" = 1\n")
	}
	base := string(text)
	if !strings.HasSuffix(base, "\n") {
		base += "\n"
	}
	for _, probe := range probes {
		var document map[string]any
		if _, err := toml.Decode(base+probe, &document); err == nil && holds(document, full) {
			return true
		}
	}
	return false
}

// dotted is a TOML dotted key of names that need no escaping (validated names and keys).
func dotted(names []string) string {
	return `"` + strings.Join(names, `"."`) + `"`
}

// holds says document has a value at path.
func holds(document map[string]any, path []string) bool {
	for _, name := range path[:len(path)-1] {
		next, ok := document[name].(map[string]any)
		if !ok {
			return false
		}
		document = next
	}
	_, ok := document[path[len(path)-1]]
	return ok
}
