package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/cockpitfs/cockpitfs/engine"
	"github.com/cockpitfs/cockpitfs/engine/listeners"
	"github.com/cockpitfs/cockpitfs/engine/portlock"
	"github.com/cockpitfs/cockpitfs/proxy"
)

// startProxy serves the stacks' web proxy on st.proxyPort of 127.0.0.1 (and ::1 where the machine
// has IPv6: browsers try it first for *.localhost). Only loopback: a stack's dev server is no more
// reachable from the network through the proxy than it is on its own port. The port is first held
// machine-wide as a leased port is, so no daemon's new lease takes it, and refused if a lease in
// this store has it. stop shuts the proxy down, ending its connections.
func startProxy(eng *engine.Engine, st storeChoice, mnt string) (stop func(), err error) {
	port := st.proxyPort
	if owner, leased, err := eng.PortOwner(port); err != nil {
		return nil, err
	} else if leased {
		return nil, fmt.Errorf("--proxy %d: the port is leased to %s/%s; choose another port, or drain that stack", port, owner.Cockpit, owner.Stack)
	}
	var hold *portlock.Hold
	if st.etcd == nil { // a team's daemons hold no machine-wide ports (openServed)
		hold, err = portlock.Machine.Take(port, portlock.Identity{PID: os.Getpid(), UID: uint32(os.Getuid()), Data: st.data, Mount: mnt, Key: "proxy", Port: port})
		if errors.Is(err, portlock.ErrHeld) {
			who := "another process"
			if h, ok, _ := portlock.Machine.Ask(port); ok {
				who = h.String()
			}
			return nil, fmt.Errorf("--proxy %d: the port is held by %s; choose another port", port, who)
		}
		if err != nil {
			return nil, err
		}
	}
	release := func() {
		if hold != nil {
			hold.Release()
		}
	}
	// A connection idle past IdleTimeout is closed: each is one of the daemon's descriptors.
	srv := &http.Server{Handler: proxy.New(eng, uint32(os.Getuid())), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute, ErrorLog: log.New(proxyLog{}, "", 0),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if t, ok := c.(interface{ NetConn() net.Conn }); ok { // a TLS connection
				c = t.NetConn()
			}
			// unknownPeer too: its requests under way are bounded together, and no stack is its.
			if b, ok := c.(*boundedConn); ok {
				return proxy.WithRequester(ctx, b.uid)
			}
			return ctx
		}}
	scheme := "http"
	if st.proxyHTTPS {
		ca, err := proxy.LoadCA(st.data)
		if err != nil {
			release()
			return nil, fmt.Errorf("--proxy-https: %w", err)
		}
		srv.TLSConfig, scheme = ca.TLSConfig(), "https"
	}
	var lns []net.Listener
	for _, host := range []string{"127.0.0.1", "::1"} {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil && host == "::1" && !ipv6Loopback() {
			continue // no IPv6 on this machine: browsers then use 127.0.0.1
		}
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			release()
			return nil, fmt.Errorf("--proxy %d: %w", port, err)
		}
		lns = append(lns, ln)
	}
	conns := &proxyConns{counts: proxy.NewUIDCounts(proxyConnsPerUID, proxyConnsTotal, uint32(os.Getuid())), logged: map[uint32]time.Time{}}
	for i, ln := range lns {
		lns[i] = &boundedListener{Listener: ln, conns: conns}
	}
	tlsOn := srv.TLSConfig != nil // read once: Serve sets a TLSConfig of its own for HTTP/2
	for _, ln := range lns {
		go func() {
			var err error
			if tlsOn {
				err = srv.ServeTLS(ln, "", "")
			} else {
				err = srv.Serve(ln)
			}
			if !errors.Is(err, http.ErrServerClosed) {
				log.Printf("proxy: %v", err)
			}
		}()
	}
	eng.ServeProxy(scheme, port)
	infof("proxying the stacks' web entrypoints at %s://<entrypoint>.<stack>.<cockpit>.localhost:%d/", scheme, port)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close() // websockets and streams do not end by themselves
		}
		release()
	}, nil
}

// ipv6Loopback says the machine has ::1 at all (a kernel booted with ipv6.disable has none).
func ipv6Loopback() bool {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// proxyLog keeps net/http's per-connection chatter (a browser's aborted TLS handshake against a CA
// it does not trust yet) at debug level; a handler's panic is always logged.
type proxyLog struct{}

func (proxyLog) Write(p []byte) (int, error) {
	if logLevel >= logDebug || bytes.Contains(p, []byte("panic")) {
		log.Printf("proxy: %s", p)
	}
	return len(p), nil
}

// proxyConnsPerUID bounds the connections to the proxy one uid holds at once, and
// proxyConnsTotal all such uids' together, root's and the daemon's own user's aside (as every
// per-uid bound): each is a descriptor of the daemon's, whose commits need some too. Unbounded,
// one user's 20,000 idle connections took every descriptor the daemon may have, and a checkpoint
// that could not open the data directory stopped the store for everybody. A browser holds at most
// 256 in all (Chromium's pool); a connection past the bound is closed as soon as it is accepted.
const (
	proxyConnsPerUID = 256
	proxyConnsTotal  = 2048
)

// proxyConns counts the proxy's open connections, per uid of the process at their other end
// (sock_diag; a connection whose uid cannot be told counts under unknownPeer).
type proxyConns struct {
	counts *proxy.UIDCounts
	mu     sync.Mutex
	// logged is when each uid's refusal (unknownPeer's: the total's) was last logged: once a
	// minute at most, since a user may reach the bound at will (2,874 lines in 10 s otherwise).
	logged map[uint32]time.Time
}

const unknownPeer = ^uint32(0)

func (p *proxyConns) take(uid uint32) bool {
	switch p.counts.Take(uid) {
	case "uid":
		p.refused(uid, fmt.Sprintf("uid %d holds %d connections to the proxy, its most", uid, proxyConnsPerUID))
		return false
	case "total":
		p.refused(unknownPeer, fmt.Sprintf("the proxy holds %d connections, its most", proxyConnsTotal))
		return false
	}
	return true
}

// refused logs why a connection was closed, once a minute at most for who it counts against.
func (p *proxyConns) refused(who uint32, why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if now.Sub(p.logged[who]) < time.Minute {
		return
	}
	p.logged[who] = now
	log.Printf("proxy: %s; closing its new ones until one ends (logged once a minute at most)", why)
	for uid, at := range p.logged {
		if now.Sub(at) >= time.Minute {
			delete(p.logged, uid)
		}
	}
}

// boundedListener accepts the connections proxyConns has room for, and closes the others.
type boundedListener struct {
	net.Listener
	conns *proxyConns
}

func (l *boundedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid := unknownPeer
		local, lok := c.LocalAddr().(*net.TCPAddr)
		remote, rok := c.RemoteAddr().(*net.TCPAddr)
		if lok && rok {
			if u, err := listeners.PeerUID(local.AddrPort(), remote.AddrPort()); err == nil {
				uid = u
			}
		}
		if !l.conns.take(uid) {
			c.Close()
			continue
		}
		return &boundedConn{Conn: c, uid: uid, release: sync.OnceFunc(func() { l.conns.counts.Give(uid) })}, nil
	}
}

// boundedConn gives its room back when closed, by the server or by a hijacker (a WebSocket).
type boundedConn struct {
	net.Conn
	uid     uint32 // of the process at its other end (unknownPeer: not known)
	release func()
}

func (c *boundedConn) Close() error {
	c.release()
	return c.Conn.Close()
}
