package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const benchProxyPort = 7399

// 6d. the proxy (issue 38): a GET of a small page through the proxy, by its stack's name, beside
// the same GET straight to the stack's port, both over kept-alive connections as a browser makes
// them (paired); then the daemon's RSS with 1,000 stacks leased, before and after each of their
// routes is asked once (what the proxy itself keeps), and the same proxied GET among the 1,000.
func BenchmarkProxy(b *testing.B) {
	d := newDaemon(fmt.Sprintf("proxy-%d", time.Now().UnixNano()))
	d.args = []string{"--proxy", strconv.Itoa(benchProxyPort)}
	defer os.RemoveAll(filepath.Dir(d.Dir))
	defer d.stop()
	if _, err := d.start(); err != nil {
		b.Fatal(err)
	}
	if err := os.Mkdir(d.path("web"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := writeFile(d.path("web", "config"), unix.O_TRUNC, "[ports]\nstep = 1\ncount = 1000\n[ports.bases]\nHTTP = 21000\n"); err != nil {
		b.Fatal(err)
	}
	claim := func(i int) (int, error) {
		stack := fmt.Sprintf("s%d", i)
		if err := os.Mkdir(d.path("web", "stacks", stack), 0o755); err != nil {
			return 0, err
		}
		if err := writeFile(d.path("web", "stacks", stack, "holders", "h"), unix.O_CREAT, "pid=none"); err != nil {
			return 0, err
		}
		port, err := os.ReadFile(d.path("web", "stacks", stack, "ports", "HTTP"))
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(strings.TrimSpace(string(port)))
	}
	port, err := claim(0)
	if err != nil {
		b.Fatalf("%v\n%s", err, d.log.String())
	}
	// The stack's server: net/http on its leased port, in the daemon's network namespace.
	var ln net.Listener
	if err := daemonNetns.Do(func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	page := []byte(strings.Repeat("<p>a stack's page</p>\n", 50))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(page) })}
	go srv.Serve(ln)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			// Every name resolves to loopback, as *.localhost does for a browser.
			_, p, _ := net.SplitHostPort(addr)
			err = daemonNetns.Do(func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, "127.0.0.1:"+p)
				return err
			})
			return c, err
		},
	}}
	get := func(url string) op {
		return op{run: func() error {
			resp, err := client.Get(url)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			n, err := io.Copy(io.Discard, resp.Body)
			if err == nil && (resp.StatusCode != 200 || n != int64(len(page))) {
				err = fmt.Errorf("%s: %d, %d bytes", url, resp.StatusCode, n)
			}
			return err
		}}
	}
	proxied := fmt.Sprintf("http://http.s0.web.localhost:%d/", benchProxyPort)
	paired(b, map[string]op{
		"proxied": get(proxied),
		"direct":  get(fmt.Sprintf("http://127.0.0.1:%d/", port)),
	})
	b.StopTimer()
	for i := 1; i < 1000; i++ {
		if _, err := claim(i); err != nil {
			b.Fatalf("stack %d: %v\n%s", i, err, d.log.String())
		}
	}
	rssStacks := d.mib(b, "VmRSS")
	for i := 1; i < 1000; i++ {
		resp, err := client.Get(fmt.Sprintf("http://http.s%d.web.localhost:%d/", i, benchProxyPort))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable { // nothing listens on their ports
			b.Fatalf("stack %d without a server answered %d", i, resp.StatusCode)
		}
	}
	rssThousand := d.mib(b, "VmRSS")
	crowded := get(proxied)
	samples := make([]time.Duration, 0, 200)
	for range 200 {
		start := time.Now()
		if err := crowded.run(); err != nil {
			b.Fatal(err)
		}
		samples = append(samples, time.Since(start))
	}
	b.ReportMetric(rssStacks, "MiB-stacks-1000")
	b.ReportMetric(rssThousand, "MiB-routes-1000")
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2].Nanoseconds()), "ns/proxied-1000")
}
