package portdecl

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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
}

// Config is an accepted config document.
type Config struct {
	Declaration Declaration
	Entrypoints []Entrypoint // the declared ones, sorted by Name
	// EnvPrefix ([env] prefix) starts every name the env file exports: "APP_" makes DB=5432
	// APP_DB=5432, so a cockpit's names never meet a tool's.
	EnvPrefix string `json:",omitempty"`
}

// Parse parses and validates a config document (SPEC §3). Every error is a message naming what
// is wrong and where (`ports.bases.HTTP: 70000 is outside 1-65535`), for the engine to refuse
// with (PORT_FAMILY_OUT_OF_RANGE, EINVAL). Unknown tables and keys are errors, and keys match
// exactly (the TOML decoder would match struct fields case-insensitively, so the document is
// walked as plain tables instead). Beyond SPEC §3, every env variable the config implies (KEY
// per port key, <NAME>_URL per entrypoint) must be distinct, so the env file never sets one twice.
func Parse(text []byte) (Config, error) {
	if len(text) > MaxDocumentBytes {
		return Config{}, fmt.Errorf("config: the document is %d bytes, more than %d", len(text), MaxDocumentBytes)
	}
	if err := checkNesting(text); err != nil {
		return Config{}, err
	}
	var document map[string]any
	if _, err := toml.Decode(string(text), &document); err != nil {
		return Config{}, fmt.Errorf("config: %v", err)
	}
	if err := onlyKeys(document, "", "entrypoints", "env", "ports"); err != nil {
		return Config{}, err
	}
	rawPorts, ok := document["ports"]
	if !ok {
		return Config{}, fmt.Errorf("config: no [ports] table")
	}
	declaration, err := parsePorts(rawPorts)
	if err != nil {
		return Config{}, err
	}
	if err := declaration.Validate(); err != nil {
		return Config{}, err
	}
	rawEntrypoints, ok := document["entrypoints"]
	if !ok {
		rawEntrypoints = map[string]any{}
	}
	entrypoints, err := parseEntrypoints(rawEntrypoints, declaration.Bases)
	if err != nil {
		return Config{}, err
	}
	prefix, err := parseEnv(document["env"])
	if err != nil {
		return Config{}, err
	}
	return Config{Declaration: declaration, Entrypoints: entrypoints, EnvPrefix: prefix}, nil
}

// parseEnv reads the optional [env] table: prefix, upper-case letters, digits and '_', not
// starting with a digit, at most 64 bytes.
func parseEnv(raw any) (string, error) {
	if raw == nil {
		return "", nil
	}
	env, err := table(raw, "env")
	if err != nil {
		return "", err
	}
	if err := onlyKeys(env, "env.", "prefix"); err != nil {
		return "", err
	}
	if _, given := env["prefix"]; !given {
		return "", nil
	}
	prefix, err := text(env, "prefix", "env.prefix")
	if err != nil {
		return "", err
	}
	valid := prefix != "" && len(prefix) <= 64 && (prefix[0] < '0' || prefix[0] > '9')
	for _, c := range prefix {
		valid = valid && (c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_')
	}
	if !valid {
		return "", fmt.Errorf("env.prefix: %q is not 1-64 bytes of [A-Z0-9_] starting with a letter or '_'", prefix)
	}
	return prefix, nil
}

func parsePorts(raw any) (Declaration, error) {
	ports, err := table(raw, "ports")
	if err != nil {
		return Declaration{}, err
	}
	if err := onlyKeys(ports, "ports.", "bases", "count", "step"); err != nil {
		return Declaration{}, err
	}
	step, err := integer(ports, "step", "ports.step")
	if err != nil {
		return Declaration{}, err
	}
	count, err := integer(ports, "count", "ports.count")
	if err != nil {
		return Declaration{}, err
	}
	bases := map[string]int{}
	if rawBases, ok := ports["bases"]; ok {
		baseTable, err := table(rawBases, "ports.bases")
		if err != nil {
			return Declaration{}, err
		}
		for _, key := range slices.Sorted(maps.Keys(baseTable)) {
			base, err := integer(baseTable, key, "ports.bases."+quoteKey(key))
			if err != nil {
				return Declaration{}, err
			}
			bases[key] = base
		}
	}
	return Declaration{Step: step, Count: count, Bases: bases}, nil
}

func parseEntrypoints(raw any, bases map[string]int) ([]Entrypoint, error) {
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
		entrypoint, err := parseEntrypoint(name, tables[name], where, bases)
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

func parseEntrypoint(name string, raw any, where string, bases map[string]int) (Entrypoint, error) {
	fields, err := table(raw, where)
	if err != nil {
		return Entrypoint{}, err
	}
	if err := onlyKeys(fields, where+".", "hostname", "kind", "path", "port", "scheme"); err != nil {
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
	if entrypoint.Port, err = text(fields, "port", where+".port"); err != nil {
		return Entrypoint{}, err
	}
	if _, declared := bases[entrypoint.Port]; !declared {
		return Entrypoint{}, fmt.Errorf("%s.port: %q is not a key of [ports.bases]", where, entrypoint.Port)
	}
	if entrypoint.Path, err = text(fields, "path", where+".path"); err != nil {
		return Entrypoint{}, err
	}
	if !strings.HasPrefix(entrypoint.Path, "/") {
		return Entrypoint{}, fmt.Errorf("%s.path: %q does not start with \"/\"", where, entrypoint.Path)
	}
	// The path ends up in a URL line and an env file line.
	if i := strings.IndexFunc(entrypoint.Path, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || r == utf8.RuneError
	}); i >= 0 {
		return Entrypoint{}, fmt.Errorf("%s.path: %q has white space or a control character at byte %d", where, entrypoint.Path, i)
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
		return 0, fmt.Errorf("%s: required", where)
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
		return "", fmt.Errorf("%s: required", where)
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
