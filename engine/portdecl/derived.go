package portdecl

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Derived values ([env] NAME = "template", docs/env.md): a name the env file exports as written,
// its value rendered per stack from a template of literal text and placeholders for the stack's
// facts. The config is refused when a template names a fact the config does not declare or holds
// a literal byte an env reader would not read as written; what a placeholder renders is checked
// again at every render (CheckDerivedValue), and a line that fails is left out.

const (
	maxDerived         = 128
	maxTemplateBytes   = 256
	derivedPortPrefix  = "port."
	derivedURLPrefix   = "url."
	factCockpit        = "cockpit"
	factStack          = "stack"
	factCheckout       = "checkout"
	derivedPlaceholder = "{cockpit}, {stack}, {checkout}, {port.KEY} or {url.NAME}"
)

// Derived is one [env] derived value: Name exported as written, Template rendered per stack.
type Derived struct {
	Name     string `json:"name"`
	Template string `json:"template"`
}

// Facts are what a template's placeholders render: the cockpit's and the stack's names, the
// checkout's folder name (as engine.NameFor maps it; "" when no holder's checkout is known), the
// lease's ports by key and each declared entrypoint's URL by name.
type Facts struct {
	Cockpit, Stack, Checkout string
	Ports                    map[string]int
	URLs                     map[string]string
}

// templatePart is a literal (fact "") or a placeholder's fact ("stack", "port.HTTP" …).
type templatePart struct{ literal, fact string }

// parseTemplate splits a template into literals and placeholders, refusing a literal byte
// CheckDerivedValue would refuse and a '{' or '}' outside a placeholder.
func parseTemplate(template string) ([]templatePart, error) {
	if len(template) > maxTemplateBytes {
		return nil, fmt.Errorf("%q is %d bytes, more than %d", template, len(template), maxTemplateBytes)
	}
	var parts []templatePart
	rest := template
	for rest != "" {
		open := strings.IndexAny(rest, "{}")
		if open < 0 {
			open = len(rest)
		}
		if open > 0 {
			literal := rest[:open]
			if i := strings.IndexByte(literal, '~'); i >= 0 {
				return nil, fmt.Errorf("%q has \"~\", which shells read as a home directory: write %%7E", template)
			}
			if err := checkValueBytes(literal, len(template)-len(rest)); err != nil {
				return nil, fmt.Errorf("%q: %w", template, err)
			}
			parts = append(parts, templatePart{literal: literal})
			rest = rest[open:]
			continue
		}
		end := strings.IndexByte(rest, '}')
		if rest[0] == '}' || end < 0 {
			return nil, fmt.Errorf("%q has a '{' or '}' that is no placeholder (%s)", template, derivedPlaceholder)
		}
		fact := rest[1:end]
		if strings.ContainsAny(fact, "{") {
			return nil, fmt.Errorf("%q has a '{' inside a placeholder", template)
		}
		parts = append(parts, templatePart{fact: fact})
		rest = rest[end+1:]
	}
	return parts, nil
}

// checkTemplate refuses a template naming a fact the config does not declare: a port key not in
// bases, an entrypoint not declared. In a partial document one a later line may still declare is
// not judged.
func checkTemplate(template string, bases map[string]int, entrypoints []Entrypoint, later addable) error {
	parts, err := parseTemplate(template)
	if err != nil {
		return err
	}
	for _, p := range parts {
		switch {
		case p.fact == "" || p.fact == factCockpit || p.fact == factStack || p.fact == factCheckout:
		case strings.HasPrefix(p.fact, derivedPortPrefix):
			key := strings.TrimPrefix(p.fact, derivedPortPrefix)
			if _, ok := bases[key]; !ok && (later == nil || !ValidKey(key) || !later(key, "ports", "bases")) {
				return fmt.Errorf("{%s}: %q is not a key of [ports.bases]", p.fact, key)
			}
		case strings.HasPrefix(p.fact, derivedURLPrefix):
			name := strings.TrimPrefix(p.fact, derivedURLPrefix)
			if !slices.ContainsFunc(entrypoints, func(e Entrypoint) bool { return e.Name == name }) &&
				(later == nil || !validName(name) || !later("port", "entrypoints", name)) {
				return fmt.Errorf("{%s}: %q is not a declared entrypoint ([entrypoints.%s])", p.fact, name, quoteKey(name))
			}
		default:
			return fmt.Errorf("{%s} is not a placeholder (%s)", p.fact, derivedPlaceholder)
		}
	}
	return nil
}

// parseDerived reads the derived values of the [env] table (every key but prefix), sorted by
// name. Each name is exported as written, so it must be one CheckExported accepts and set no
// variable a port key or entrypoint of the config sets (under prefix; not judged until
// prefixFinal, when a prefix may still follow in a partial document).
func parseDerived(env map[string]any, prefix string, prefixFinal bool, bases map[string]int, entrypoints []Entrypoint, later addable) ([]Derived, error) {
	names := slices.Sorted(maps.Keys(env))
	names = slices.DeleteFunc(names, func(n string) bool { return n == "prefix" })
	if len(names) > maxDerived {
		return nil, fmt.Errorf("env: %d derived values, more than %d", len(names), maxDerived)
	}
	taken := map[string]string{}
	for key := range bases {
		taken[prefix+key] = "port key " + key
	}
	for _, e := range entrypoints {
		taken[prefix+EnvName(e.Name)] = "entrypoint " + e.Name
	}
	var derived []Derived
	for _, name := range names {
		where := "env." + quoteKey(name)
		if err := CheckExported(name); err != nil {
			return nil, fmt.Errorf("%s: the env file would export %w", where, err)
		}
		if other, ok := taken[name]; ok && prefixFinal {
			return nil, fmt.Errorf("%s: %s sets %s too", where, other, name)
		}
		template, err := text(env, name, where)
		if err != nil {
			return nil, err
		}
		if err := checkTemplate(template, bases, entrypoints, later); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		derived = append(derived, Derived{Name: name, Template: template})
	}
	return derived, nil
}

// Render is the value d's template renders to from facts, ok false when it names a fact the
// stack lacks (a port its lease does not hold, an entrypoint no longer declared, an unknown
// checkout) or renders a value CheckDerivedValue refuses: the env file leaves such a line out.
func (d Derived) Render(f Facts) (string, bool) {
	parts, err := parseTemplate(d.Template)
	if err != nil {
		return "", false
	}
	var b strings.Builder
	for _, p := range parts {
		var value string
		switch {
		case p.fact == "":
			value = p.literal
		case p.fact == factCockpit:
			value = f.Cockpit
		case p.fact == factStack:
			value = f.Stack
		case p.fact == factCheckout:
			value = f.Checkout
		case strings.HasPrefix(p.fact, derivedPortPrefix):
			port, ok := f.Ports[strings.TrimPrefix(p.fact, derivedPortPrefix)]
			if !ok {
				return "", false
			}
			value = strconv.Itoa(port)
		case strings.HasPrefix(p.fact, derivedURLPrefix):
			value = f.URLs[strings.TrimPrefix(p.fact, derivedURLPrefix)]
		}
		if value == "" && p.fact != "" {
			return "", false
		}
		b.WriteString(value)
	}
	if CheckDerivedValue(b.String()) != nil {
		return "", false
	}
	return b.String(), true
}

// CheckDerivedValue refuses a derived value an env reader would not read as written: it is
// ASCII letters, digits, - . _ / : @ + , = * ?, % with two hex digits, and ~ only where no shell
// reads a home directory (not first, not after ':' or '='). See checkPath for why.
func CheckDerivedValue(value string) error {
	for i := 0; i < len(value); i++ {
		if value[i] == '~' && (i == 0 || value[i-1] == ':' || value[i-1] == '=') {
			return fmt.Errorf("%q has \"~\" at byte %d, which shells read as a home directory", value, i)
		}
	}
	return checkValueBytes(value, 0)
}

// checkValueBytes refuses a byte outside checkPath's set (~ aside, judged by the caller), naming
// its place as at bytes into what value is part of.
func checkValueBytes(value string, at int) error {
	for i := 0; i < len(value); i++ {
		c := value[i]
		switch {
		case c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9':
		case strings.IndexByte("-._~/:@+,=*?", c) >= 0:
		case c == '%' && i+2 < len(value) && isHex(value[i+1]) && isHex(value[i+2]):
		default:
			what := fmt.Sprintf("byte 0x%02x", c)
			if c > ' ' && c < 0x7f {
				what = fmt.Sprintf("%q", string(c))
			}
			return fmt.Errorf("%s at byte %d: a value is ASCII letters, digits, - . _ / : @ + , = * ? and %%XX (percent-encode the rest)", what, at+i)
		}
	}
	return nil
}
