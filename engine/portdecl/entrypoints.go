package portdecl

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
)

// Resolved is an entrypoint with its port filled in.
type Resolved struct {
	Name, URL string
	Kind      string // DefaultKind for a default one
	Port      string // the port key
	// Default: the entrypoint every port key gets (entrypoints/<key>), which env does not export:
	// a <KEY>_URL nobody declared would clobber what conventional tools read (DATABASE_URL).
	Default bool
	// Proxied: the config asks for this entrypoint's URL through the daemon's proxy.
	Proxied bool
}

// Entrypoints derives every entrypoint for a lease's ports: one default per port key, named
// lower-case with '_' -> '-' (HTTP_ADMIN -> http-admin), "http://127.0.0.1:<port>/"; then each
// declared entrypoint as "<scheme>://<hostname>:<port><path>". Sorted by name.
//
// The declared entrypoints come from the current config while ports come from a lease that may
// have been taken under an earlier declaration, so a declared entrypoint whose port key is not
// leased, or whose name is a default one of these ports, is left out rather than rendered wrong.
func Entrypoints(declared []Entrypoint, ports map[string]int) []Resolved {
	resolved := make([]Resolved, 0, len(ports)+len(declared))
	defaults := make(map[string]bool, len(ports))
	for key, port := range ports {
		name := defaultEntrypointName(key)
		defaults[name] = true
		resolved = append(resolved, Resolved{Name: name, URL: "http://" + defaultHostname + ":" + strconv.Itoa(port) + "/", Kind: DefaultKind, Port: key, Default: true})
	}
	for _, entrypoint := range declared {
		port, leased := ports[entrypoint.Port]
		if !leased || defaults[entrypoint.Name] {
			continue
		}
		resolved = append(resolved, entrypoint.On(port))
	}
	slices.SortStableFunc(resolved, func(a, b Resolved) int { return cmp.Compare(a.Name, b.Name) })
	return resolved
}

// On is e resolved on port.
func (e Entrypoint) On(port int) Resolved {
	scheme := cmp.Or(e.Scheme, defaultScheme)
	hostname := cmp.Or(e.Hostname, defaultHostname)
	if hostname == "::1" {
		hostname = ipv6Loopback
	}
	return Resolved{
		Name:    e.Name,
		URL:     scheme + "://" + hostname + ":" + strconv.Itoa(port) + e.Path,
		Kind:    cmp.Or(e.Kind, DefaultKind),
		Port:    e.Port,
		Proxied: e.Proxied,
	}
}

// EnvName is the env variable for an entrypoint: the name upper-cased, '-' -> '_', plus "_URL"
// (web -> WEB_URL, http-admin -> HTTP_ADMIN_URL).
func EnvName(entrypoint string) string {
	return strings.ReplaceAll(strings.ToUpper(entrypoint), "-", "_") + "_URL"
}
