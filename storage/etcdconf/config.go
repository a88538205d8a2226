package etcdconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// Config names a cluster, the prefix of the store in it, and how to authenticate.
type Config struct {
	Endpoints []string // host:port of members
	Prefix    string
	TLS       *tls.Config // nil: plain connections
	Username  string
	Password  string
	// Budget is how long Update retries conflicts and any read or commit waits for a quorum (a
	// lost quorum refuses after it, never hangs); 0 means storage.Budget.
	Budget time.Duration
}

// Scheme starts a --store value that names an etcd store.
const Scheme = "etcd://"

// ParseURL reads etcd://HOST:PORT[,HOST:PORT…]/PREFIX.
func ParseURL(s string) (Config, error) {
	rest, ok := strings.CutPrefix(s, Scheme)
	if !ok {
		return Config{}, fmt.Errorf("store %q: want %sHOST:PORT[,HOST:PORT…]/PREFIX", s, Scheme)
	}
	hosts, prefix, _ := strings.Cut(rest, "/")
	if strings.Trim(prefix, "/") == "" {
		return Config{}, fmt.Errorf("store %q: no key prefix after the hosts (%sHOST:PORT/PREFIX)", s, Scheme)
	}
	var cfg Config
	for _, h := range strings.Split(hosts, ",") {
		if _, port, err := net.SplitHostPort(h); err != nil || port == "" {
			return Config{}, fmt.Errorf("store %q: endpoint %q is not HOST:PORT", s, h)
		}
		cfg.Endpoints = append(cfg.Endpoints, h)
	}
	cfg.Prefix = prefix
	return cfg, nil
}

// TLSFiles are etcdctl's --cacert, --cert and --key.
type TLSFiles struct {
	CACert, Cert, Key string
}

// Config returns the TLS configuration the files describe, or nil if none is given.
func (f TLSFiles) Config() (*tls.Config, error) {
	if f == (TLSFiles{}) {
		return nil, nil
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("--cert and --key go together")
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CACert != "" {
		pem, err := os.ReadFile(f.CACert)
		if err != nil {
			return nil, fmt.Errorf("--cacert: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--cacert %s holds no PEM certificate", f.CACert)
		}
	}
	if f.Cert != "" {
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("--cert/--key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
