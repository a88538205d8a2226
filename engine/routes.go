package engine

import (
	"cmp"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cockpitfs/cockpitfs/engine/listeners"
	"github.com/cockpitfs/cockpitfs/engine/portdecl"
)

// RouteState says whether a proxied name reaches a process, and if not, why.
type RouteState string

// The states of a route, each one a page the proxy shows (but Routed).
const (
	Routed          RouteState = "routed"
	RouteUnknown    RouteState = "unknown"   // no cockpit and stack by that name
	RouteAmbiguous  RouteState = "ambiguous" // the name reads as more than one entrypoint
	RouteNoLease    RouteState = "no-lease"  // the stack holds no ports
	RouteDraining   RouteState = "draining"  // a drain is reserved: the stack is stopping
	RouteNoEntry    RouteState = "no-entrypoint"
	RouteNotHTTP    RouteState = "not-http"    // the entrypoint's scheme is not http or https
	RouteNotServing RouteState = "not-serving" // nothing listens on the entrypoint's port
	RouteForeign    RouteState = "foreign"     // another user listens on the stack's port
	RouteUndecided  RouteState = "undecided"   // the listener check could not answer
)

// Route is where a proxied name leads, read afresh at each request: the stack's state now, and
// when Routed, the address its entrypoint's process listens on.
type Route struct {
	Cockpit    string     `json:"cockpit,omitempty"`
	Stack      string     `json:"stack,omitempty"`
	Entrypoint string     `json:"entrypoint,omitempty"`
	State      RouteState `json:"state"`
	Message    string     `json:"message"`
	Fix        string     `json:"fix,omitempty"`
	// Entrypoints are the stack's, each with its proxied name's first label, for a page to link.
	Entrypoints []string `json:"entrypoints,omitempty"`
	// Scheme and Upstream ("127.0.0.1:3000") are where a Routed request goes.
	Scheme   string `json:"-"`
	Upstream string `json:"-"`
	// Listeners are the inodes of the sockets listening there when the route was read: a
	// connection made to them reaches them alone (the proxy keeps connections by them).
	Listeners string `json:"-"`
}

// ProxyHost is the host name the proxy answers for a stack's entrypoint:
// <entrypoint>.<stack>.<cockpit>.localhost, lower-cased as browsers send it.
func ProxyHost(cockpit, stack, entrypoint string) string {
	return strings.ToLower(entrypoint + "." + stack + "." + cockpit + ".localhost")
}

// ResolveRoute reads where host (a request's host name without its port, ending in .localhost)
// leads. Names are matched without regard to case, as browsers lower-case them; a name a dot
// could split more than one way is resolved only when exactly one split names an existing
// cockpit, stack and entrypoint. Every state but Routed is an answer, not an error; the error is
// for a store that cannot be read.
//
// The stack's record, its lease and what listens are read afresh at every request. Which stacks
// exist is looked up in an index of names folded to lower case, rebuilt from the store when a
// name missing from it names a stack as the host spells it (so a new stack with a lower-case name
// is found at once; one with capitals within routeIndexMinAge) and at least every second (so a
// stack made since, whose name differs from another's only in case, is seen to be ambiguous
// within a second); a removed stack is gone at once, its record being read.
//
// requester is the uid of the process that asked, when known: among stacks the name could mean,
// the one stack that is theirs (they own its cockpit, made it or hold it) is theirs to reach, so
// another user's stack named like it in another case cannot take their name from them.
func (e *Engine) ResolveRoute(host string, requester *uint32) (Route, error) {
	name, ok := strings.CutSuffix(strings.ToLower(strings.TrimSuffix(host, ".")), ".localhost")
	// Three names of at most maxNameBytes and their dots: anything longer names no stack, and is
	// not split every way (a host of thousands of dots from any local user would cost the
	// daemon a store read per split).
	if ok && len(name) > 3*maxNameBytes+2 {
		return Route{State: RouteUnknown, Message: fmt.Sprintf("a host name of %d bytes is longer than any stack's", len(host)),
			Fix: "open http://<entrypoint>.<stack>.<cockpit>.localhost:<proxy port>/"}, nil
	}
	if !ok || name == "" {
		return Route{State: RouteUnknown, Message: fmt.Sprintf("%q is not a stack's name", host),
			Fix: "open http://<entrypoint>.<stack>.<cockpit>.localhost:<proxy port>/"}, nil
	}
	found, err := e.resolveIn(name, indexAsIs)
	if err == nil && len(found) == 0 {
		// A stack made since the index was built: one whose name is as the host spells it (lower
		// case) is read by that name, and found at once; another is found by a rebuild at most
		// every routeIndexMinAge.
		rebuild := indexIfOld
		if e.namedExactly(name) {
			rebuild = indexNow
		}
		found, err = e.resolveIn(name, rebuild)
	}
	if err != nil {
		return Route{}, err
	}
	switch {
	case len(found) == 0:
		return Route{State: RouteUnknown, Message: fmt.Sprintf("no stack is named by %q", host),
			Fix: "ls <mount>/<cockpit>/stacks shows the stacks; the name is <entrypoint>.<stack>.<cockpit>.localhost"}, nil
	case len(found) > 1:
		// Only one split can name an entrypoint the stack has; prefer it.
		var entry []Route
		for _, r := range found {
			if r.State != RouteNoEntry {
				entry = append(entry, r)
			}
		}
		if len(entry) == 1 {
			return entry[0], nil
		}
		if requester != nil {
			// First the stacks they made or hold, then those of their cockpits: another user's
			// stack made in their cockpit under a name in another case is not theirs to reach.
			for _, tier := range []func(CockpitInfo, Record, uint32) bool{madeOrHolds, hasStack} {
				var theirs []Route
				for _, r := range entry {
					if e.isTheirs(r, *requester, tier) {
						theirs = append(theirs, r)
					}
				}
				if len(theirs) == 1 {
					return theirs[0], nil
				}
				if len(theirs) > 1 {
					break
				}
			}
		}
		return Route{State: RouteAmbiguous, Message: fmt.Sprintf("%q names more than one stack's entrypoint (names differing only in case or dots), and not exactly one of them is yours", host),
			Fix: "rename one of the stacks or cockpits"}, nil
	}
	return found[0], nil
}

// resolveIn reads the route of every stack name (lower-cased, "<entrypoint>.<stack>.<cockpit>")
// may mean, by the route index (rebuilt first as rebuild says).
func (e *Engine) resolveIn(name string, rebuild indexRebuild) ([]Route, error) {
	idx, err := e.routes.get(e, rebuild)
	if err != nil {
		return nil, err
	}
	labels := strings.Split(name, ".")
	var found []Route
	for j := 2; j < len(labels); j++ { // the cockpit is labels[j:]
		for i := 1; i < j; i++ { // the entrypoint labels[:i], the stack labels[i:j]
			folded := strings.Join(labels[j:], ".") + "/" + strings.Join(labels[i:j], ".")
			for _, ref := range idx.stacks[folded] {
				c, err := e.Cockpit(ref.cockpit)
				if err == nil {
					var r Route
					r, err = e.route(c, ref.stack, strings.Join(labels[:i], "."))
					if err == nil {
						found = append(found, r)
						continue
					}
				}
				if AsRefusal(err).Code == NotFound {
					continue // removed since the index was built
				}
				return nil, err
			}
		}
	}
	return found, nil
}

// namedExactly says a stack exists whose cockpit and name are spelled in name
// ("<entrypoint>.<stack>.<cockpit>") as they are, split at some dots.
func (e *Engine) namedExactly(name string) bool {
	labels := strings.Split(name, ".")
	for j := 2; j < len(labels); j++ {
		cockpit := strings.Join(labels[j:], ".")
		if _, err := e.Cockpit(cockpit); err != nil {
			continue // the stacks of no cockpit are worth a read
		}
		for i := 1; i < j; i++ {
			if _, err := e.Stack(cockpit, strings.Join(labels[i:j], ".")); err == nil {
				return true
			}
		}
	}
	return false
}

// indexRebuild says when routeIndexes.get builds the index anew.
type indexRebuild int

const (
	indexAsIs  indexRebuild = iota // when older than routeIndexMaxAge
	indexIfOld                     // when older than routeIndexMinAge: a name was missing
	indexNow                       // a name was missing that the store has
)

// routeIndex is every stack by its cockpit's and its own name folded to lower case
// ("cockpit/stack"), as of built.
type routeIndex struct {
	built  time.Time
	stacks map[string][]stackRef
}

type stackRef struct{ cockpit, stack string }

// routeIndexes keeps the current routeIndex.
type routeIndexes struct {
	mu  sync.Mutex // held across a rebuild, so concurrent requests share one
	cur *routeIndex
}

// Bounds of the route index's age: rebuilt when older than routeIndexMaxAge, and when a name is
// missing from it only once older than routeIndexMinAge (a client asking names that do not exist
// costs one store scan per interval, not one per request).
const (
	routeIndexMaxAge = time.Second
	routeIndexMinAge = 50 * time.Millisecond
)

func (x *routeIndexes) get(e *Engine, rebuild indexRebuild) (*routeIndex, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.cur != nil && rebuild != indexNow {
		age := time.Since(x.cur.built)
		if age < routeIndexMinAge || rebuild == indexAsIs && age < routeIndexMaxAge {
			return x.cur, nil
		}
	}
	idx := &routeIndex{built: time.Now(), stacks: map[string][]stackRef{}}
	cockpits, err := e.Cockpits()
	if err != nil {
		return nil, err
	}
	for _, c := range cockpits {
		stacks, err := e.Stacks(c.Name)
		if err != nil && AsRefusal(err).Code != NotFound && !c.Damaged && !isMalformed(err) {
			return nil, err
		}
		for _, s := range stacks {
			key := strings.ToLower(c.Name) + "/" + strings.ToLower(s)
			idx.stacks[key] = append(idx.stacks[key], stackRef{c.Name, s})
		}
	}
	x.cur = idx
	return idx, nil
}

// route reads entrypoint (lower-cased) of stack now.
func (e *Engine) route(c CockpitInfo, stack, entrypoint string) (Route, error) {
	r, err := e.Stack(c.Name, stack)
	if err != nil {
		return Route{}, err
	}
	rt := Route{Cockpit: c.Name, Stack: stack, Entrypoint: entrypoint}
	stackPath := c.Name + "/stacks/" + stack
	if !r.Value.Lease.Active() {
		rt.State, rt.Message = RouteNoLease, fmt.Sprintf("stack %s holds no ports: nothing of it runs", stackPath)
		rt.Fix = "claim it (touch " + stackPath + "/holders/<you>) and start its servers"
		return rt, nil
	}
	if d := r.Value.Drain; d != nil {
		rt.State, rt.Message = RouteDraining, fmt.Sprintf("stack %s is draining (%s): it is being stopped", stackPath, d.Purpose)
		rt.Fix = "wait for the drain to end (cat " + stackPath + "/drain/status), then claim the stack again"
		return rt, nil
	}
	var target *portdecl.Resolved
	all := r.Entrypoints(c.Entrypoints)
	for i, ep := range all {
		rt.Entrypoints = append(rt.Entrypoints, strings.ToLower(ep.Name))
		if strings.ToLower(ep.Name) == entrypoint {
			target = &all[i]
		}
	}
	if target == nil {
		rt.State, rt.Message = RouteNoEntry, fmt.Sprintf("stack %s has no entrypoint %q", stackPath, entrypoint)
		rt.Fix = "use one of its entrypoints: " + strings.Join(rt.Entrypoints, ", ")
		return rt, nil
	}
	rt.Entrypoint = target.Name
	u, err := url.Parse(target.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		rt.State, rt.Message = RouteNotHTTP, fmt.Sprintf("entrypoint %s of %s is %s, not a web page", target.Name, stackPath, target.URL)
		rt.Fix = "connect to " + target.URL + " directly"
		return rt, nil
	}
	port := r.Value.Lease.Ports[target.Port]
	owners, err := listeners.Owners([]int{port})
	if err != nil {
		rt.State, rt.Message = RouteUndecided, fmt.Sprintf("cannot tell what listens on port %d: %v", port, err)
		rt.Fix = "retry; the kernel's socket diagnostics did not answer"
		return rt, nil
	}
	socks := owners[port]
	if len(socks) == 0 {
		rt.State, rt.Message = RouteNotServing, fmt.Sprintf("nothing listens on port %d, entrypoint %s of %s", port, target.Name, stackPath)
		rt.Fix = "start the stack's server on $" + target.Port + " (" + target.URL + ")"
		return rt, nil
	}
	inodes := make([]string, 0, len(socks))
	for _, s := range socks {
		if !e.mayServe(c, r, s.UID) {
			rt.State, rt.Message = RouteForeign, fmt.Sprintf("port %d of %s is listened on by uid %d, who neither holds the stack nor owns it", port, stackPath, s.UID)
			rt.Fix = "stop that process; only the stack's holders' servers are proxied"
			return rt, nil
		}
		inodes = append(inodes, strconv.FormatUint(uint64(s.Inode), 10))
	}
	slices.Sort(inodes)
	rt.State, rt.Message = Routed, "routed to "+target.URL
	rt.Scheme, rt.Upstream, rt.Listeners = u.Scheme, u.Host, strings.Join(inodes, ",")
	return rt, nil
}

// mayServe says a listener running as uid may be proxied to as the stack: root (a container
// runtime's port proxy), the cockpit's owner, the stack's creator, or one of its holders'. Anyone
// else on a shared machine could otherwise bind a stack's leased port first and be handed its
// cookies under its name.
func (e *Engine) mayServe(c CockpitInfo, r Record, uid uint32) bool {
	return uid == 0 || hasStack(c, r, uid)
}

// hasStack says uid owns the stack's cockpit, made the stack or holds it.
func hasStack(c CockpitInfo, r Record, uid uint32) bool {
	return uid == c.UID || madeOrHolds(c, r, uid)
}

// madeOrHolds says uid made the stack or holds it.
func madeOrHolds(_ CockpitInfo, r Record, uid uint32) bool {
	if r.Creator != nil && *r.Creator == uid {
		return true
	}
	return slices.ContainsFunc(r.Value.Holders, func(h Holder) bool { return h.UID == uid })
}

// isTheirs says the stack rt leads to is uid's as is says; false once it is gone.
func (e *Engine) isTheirs(rt Route, uid uint32, is func(CockpitInfo, Record, uint32) bool) bool {
	c, err := e.Cockpit(rt.Cockpit)
	if err != nil {
		return false
	}
	r, err := e.Stack(rt.Cockpit, rt.Stack)
	return err == nil && is(c, r, uid)
}

// ProxiedEntrypoint is one web entrypoint of a stack with a lease: what the proxy's index lists.
// Path is its URL's path, as the stack's proxied URL in status ends.
type ProxiedEntrypoint struct{ Cockpit, Stack, Entrypoint, Path string }

// ProxiedEntrypoints lists the http and https entrypoints of every stack with a lease, by cockpit
// and stack.
func (e *Engine) ProxiedEntrypoints() ([]ProxiedEntrypoint, error) {
	cockpits, err := e.Cockpits()
	if err != nil {
		return nil, err
	}
	var out []ProxiedEntrypoint
	for _, c := range cockpits {
		stacks, err := e.Stacks(c.Name)
		if c.Damaged || isMalformed(err) {
			continue // its own files say what is wrong; every other cockpit's entrypoints are served
		}
		if err != nil {
			return nil, err
		}
		for _, s := range stacks {
			r, err := e.Stack(c.Name, s)
			if err != nil {
				continue // removed since the listing
			}
			for _, ep := range r.Entrypoints(c.Entrypoints) {
				if u, err := url.Parse(ep.URL); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
					out = append(out, ProxiedEntrypoint{c.Name, s, ep.Name, cmp.Or(u.EscapedPath(), "/")})
				}
			}
		}
	}
	return out, nil
}

// ServeProxy tells the engine the daemon serves the proxy at scheme on loopback port, so the
// files that show an entrypoint's URL show its proxied one beside it.
func (e *Engine) ServeProxy(scheme string, port int) {
	e.proxyBase.Store(&proxyBase{scheme: scheme, port: port})
}

// proxyBase is where the daemon's proxy serves.
type proxyBase struct {
	scheme string
	port   int
}

// ProxiedURL is the URL through the daemon's proxy of the stack's entrypoint whose own URL is
// portURL (its path kept): "" when the daemon serves no proxy or portURL is not http or https.
func (info CockpitInfo) ProxiedURL(stack, entrypoint, portURL string) string {
	b := info.proxy
	if b == nil {
		return ""
	}
	u, err := url.Parse(portURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return ""
	}
	return fmt.Sprintf("%s://%s:%d%s", b.scheme, ProxyHost(info.Name, stack, entrypoint), b.port, cmp.Or(u.EscapedPath(), "/"))
}
