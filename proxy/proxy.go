// Package proxy serves every stack's web entrypoints under names a browser keeps apart:
// http://<entrypoint>.<stack>.<cockpit>.localhost:<port>/ is proxied to the process listening on
// that entrypoint's leased port. Browsers resolve *.localhost to loopback themselves (RFC 6761),
// so each stack gets its own origin — its own cookies, storage and OAuth redirect URL — with no
// DNS set-up. Every request reads the stack afresh: a stack without a lease, draining, or with
// nothing (or someone else) listening on its port gets a page saying so, never a stale process.
package proxy

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"html/template"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
)

// Server is the proxy: an http.Handler over an engine.
type Server struct {
	eng   *engine.Engine
	proxy *httputil.ReverseProxy
	// inFlight counts each uid's requests being proxied (see maxInFlightPerUID).
	inFlight *UIDCounts
}

// UIDCounts counts what each uid holds at once (connections, requests under way) against a bound
// per uid and one for them all (0: none), root and the daemon's own uid aside: they are held to
// none and not counted.
type UIDCounts struct {
	perUID, total int
	own           uint32
	mu            sync.Mutex
	held          int
	by            map[uint32]int
}

// NewUIDCounts bounds each uid to perUID and all of them to total, root and own aside.
func NewUIDCounts(perUID, total int, own uint32) *UIDCounts {
	return &UIDCounts{perUID: perUID, total: total, own: own, by: map[uint32]int{}}
}

// Take counts one more for uid, or says which bound it would pass: "uid" or "total".
func (c *UIDCounts) Take(uid uint32) (passed string) {
	if uid == 0 || uid == c.own {
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.perUID > 0 && c.by[uid] >= c.perUID {
		return "uid"
	}
	if c.total > 0 && c.held >= c.total {
		return "total"
	}
	c.held++
	c.by[uid]++
	return ""
}

// Give counts one less for uid, which Take counted.
func (c *UIDCounts) Give(uid uint32) {
	if uid == 0 || uid == c.own {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held--
	if c.by[uid]--; c.by[uid] == 0 {
		delete(c.by, uid)
	}
}

// maxInFlightPerUID bounds the requests of one uid (root's and the daemon's own user's aside) the
// proxy passes on at once: each holds a connection to the stack's server, a descriptor of the
// daemon's, for as long as that server takes to answer. The connections a uid holds to the proxy
// are bounded too (cmd/cockpitfs), but one HTTP/2 connection carries 250 requests: 100 of them
// from one user, to a server of theirs that never answers, took 17,000 descriptors.
const maxInFlightPerUID = 256

// routeKey carries a request's resolved route from ServeHTTP to the rewrite.
type routeKey struct{}

// requesterKey carries the uid of the process at a connection's other end (see WithRequester).
type requesterKey struct{}

// WithRequester is ctx saying uid's process made the connection its requests come on: a name
// that could mean more than one stack leads to the one that is theirs (engine.ResolveRoute).
func WithRequester(ctx context.Context, uid uint32) context.Context {
	return context.WithValue(ctx, requesterKey{}, uid)
}

// New is a proxy over eng's stacks, served by a daemon of uid own.
func New(eng *engine.Engine, own uint32) *Server {
	s := &Server{eng: eng, inFlight: NewUIDCounts(maxInFlightPerUID, 0, own)}
	s.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			rt := pr.In.Context().Value(routeKey{}).(engine.Route)
			pr.Out.URL.Scheme, pr.Out.URL.Host = rt.Scheme, rt.Upstream
			// The browser's host stays the request's Host, as dev servers that check it
			// (Vite's allowedHosts, Rails' hosts, Django's ALLOWED_HOSTS) and OAuth libraries
			// building redirect URLs expect of a reverse proxy; X-Forwarded-* say the rest.
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		// Streaming responses (server-sent events, long polls, a dev server's reload channel)
		// go through as they are written.
		FlushInterval: -1,
		Transport:     &upstreams{by: map[string]*upstream{}},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			rt := r.Context().Value(routeKey{}).(engine.Route)
			rt.State = engine.RouteNotServing
			rt.Message = fmt.Sprintf("the stack's server on %s did not answer: %v", rt.Upstream, err)
			rt.Fix = "start (or restart) the stack's server, then reload"
			writePage(w, r, rt)
		},
		ErrorLog: log.New(discard{}, "", 0),
	}
	return s
}

// upstreams are the proxy's connections to the stacks' servers, kept apart by the listening
// sockets the route found (engine.Route.Listeners): a request reuses a connection only while the
// socket that accepted it still listens. Kept by address alone, a connection went to whoever
// listened when it was made: a user whose server let the port go, its connections kept, received
// the next stack's requests, its cookies with them.
type upstreams struct {
	mu    sync.Mutex
	by    map[string]*upstream
	swept time.Time
}

type upstream struct {
	t    *http.Transport
	used time.Time
}

// upstreamIdle is how long a connection to a stack's server is kept unused, and a set of
// listeners' transport once none of its requests came.
const upstreamIdle = 30 * time.Second

func (u *upstreams) RoundTrip(r *http.Request) (*http.Response, error) {
	rt := r.Context().Value(routeKey{}).(engine.Route)
	return u.transport(rt.Listeners).RoundTrip(r)
}

// transport is the one of the listeners key; those unused for upstreamIdle go.
func (u *upstreams) transport(key string) *http.Transport {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	if now.Sub(u.swept) > upstreamIdle {
		u.swept = now
		for k, up := range u.by {
			if now.Sub(up.used) > upstreamIdle {
				up.t.CloseIdleConnections()
				delete(u.by, k)
			}
		}
	}
	up := u.by[key]
	if up == nil {
		up = &upstream{t: &http.Transport{
			Proxy:                 nil, // never an HTTP_PROXY from the daemon's environment
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   16,
			IdleConnTimeout:       upstreamIdle,
			ResponseHeaderTimeout: 0, // a dev server may think for as long as it likes
			// The upstream is a loopback process whose uid the route checked; dev servers
			// serving HTTPS do so with certificates nobody signed.
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // see above
		}}
		u.by[key] = up
	}
	up.used = now
	return up.t
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// ServeHTTP routes r by its Host.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "localhost" || host == "127.0.0.1" || host == "::1" {
		s.index(w, r)
		return
	}
	var requester *uint32
	uid, known := r.Context().Value(requesterKey{}).(uint32)
	if known {
		requester = &uid
	}
	rt, err := s.eng.ResolveRoute(host, requester)
	if err != nil {
		rt = engine.Route{State: engine.RouteUndecided, Message: "the store cannot be read: " + err.Error(), Fix: "see the daemon's log"}
	}
	if rt.State != engine.Routed {
		writePage(w, r, rt)
		return
	}
	if known {
		if s.inFlight.Take(uid) != "" {
			rt.State, rt.Message = RouteBusy, fmt.Sprintf("uid %d has %d requests under way through the proxy, its most", uid, maxInFlightPerUID)
			rt.Fix = "wait for some to be answered"
			writePage(w, r, rt)
			return
		}
		defer s.inFlight.Give(uid)
	}
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, rt)))
}

// RouteBusy is a request refused because its uid has maxInFlightPerUID under way.
const RouteBusy engine.RouteState = "busy"

// status is the HTTP status each state answers with.
func status(st engine.RouteState) int {
	switch st {
	case engine.RouteUnknown, engine.RouteNoEntry:
		return http.StatusNotFound
	case engine.RouteAmbiguous:
		return http.StatusConflict
	case engine.RouteForeign, engine.RouteNotHTTP:
		return http.StatusBadGateway
	case RouteBusy:
		return http.StatusTooManyRequests
	}
	return http.StatusServiceUnavailable // no lease, draining, not serving, undecided: try later
}

// writePage answers a request the proxy does not route: a small HTML page for a browser (one that
// reloads itself while the stack may come back), the route as JSON for anything else.
func writePage(w http.ResponseWriter, r *http.Request, rt engine.Route) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Cockpitfs-State", string(rt.State))
	code := status(rt.State)
	if !wantsHTML(r) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(rt)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if code == http.StatusServiceUnavailable {
		w.Header().Set("Refresh", "2") // back on its own once the stack serves again
	}
	w.WriteHeader(code)
	page.Execute(w, rt)
}

// wantsHTML: a browser's navigation asks for text/html; curl, fetch() and scripts do not.
func wantsHTML(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/html")
}

var page = template.Must(template.New("page").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>{{if .Stack}}{{.Stack}}: {{end}}{{.State}}</title>
<style>body{font:16px system-ui,sans-serif;max-width:42em;margin:4em auto;padding:0 1em}code{background:#eee;padding:0 .2em}</style>
</head><body>
<h1>{{if .Stack}}{{.Stack}} <small>({{.Cockpit}})</small>{{else}}No stack here{{end}}</h1>
<p id="state" data-state="{{.State}}"><strong>{{.State}}</strong>: {{.Message}}</p>
{{if .Fix}}<p>What to do: {{.Fix}}</p>{{end}}
<p><small>cockpitfs proxy</small></p>
</body></html>
`))

// index lists every stack's proxied entrypoints, for http://localhost:<port>/.
func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	routes, err := s.eng.ProxiedEntrypoints()
	if err != nil {
		writePage(w, r, engine.Route{State: engine.RouteUndecided, Message: "the store cannot be read: " + err.Error()})
		return
	}
	port := ""
	if _, p, err := net.SplitHostPort(r.Host); err == nil {
		port = ":" + p
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	type link struct {
		Stack      string `json:"stack"`
		Cockpit    string `json:"cockpit"`
		Entrypoint string `json:"entrypoint"`
		URL        string `json:"url"`
	}
	var links []link
	for _, e := range routes {
		links = append(links, link{e.Stack, e.Cockpit, e.Entrypoint, scheme + "://" + engine.ProxyHost(e.Cockpit, e.Stack, e.Entrypoint) + port + e.Path})
	}
	w.Header().Set("Cache-Control", "no-store")
	if !wantsHTML(r) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(links)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	index.Execute(w, links)
}

var index = template.Must(template.New("index").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>cockpitfs stacks</title>
<style>body{font:16px system-ui,sans-serif;max-width:42em;margin:4em auto;padding:0 1em}</style>
</head><body><h1>Stacks</h1>
{{if .}}<ul>{{range .}}<li><a href="{{.URL}}">{{.URL}}</a></li>{{end}}</ul>{{else}}<p>No stack holds a lease.</p>{{end}}
</body></html>
`))
