package etcdstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/cockpitfs/cockpitfs/storage/etcdconf"
)

// diagnose says why a cluster that did not answer could not be reached, in the words etcdctl and
// Go's TLS use, with the flag that fixes it: it connects to each endpoint itself and makes the TLS
// handshake the client would. nil when every endpoint connects and shakes hands (the cluster is
// reachable, only slow or without a quorum).
func diagnose(cfg etcdconf.Config, timeout time.Duration) error {
	var causes []error
	for _, endpoint := range cfg.Endpoints {
		if err := diagnoseEndpoint(endpoint, cfg.TLS, timeout); err != nil {
			causes = append(causes, fmt.Errorf("%s: %w", endpoint, err))
		}
	}
	if len(causes) < len(cfg.Endpoints) {
		return nil // some member is reachable: what failed is the cluster, not the connection
	}
	return errors.Join(causes...)
}

func diagnoseEndpoint(endpoint string, config *tls.Config, timeout time.Duration) error {
	host, _, _ := net.SplitHostPort(endpoint)
	dialer := &net.Dialer{Timeout: timeout}
	conn, err := dialer.Dial("tcp", endpoint)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("dial tcp %s: connect: connection refused (nothing listens there: check --store's endpoints)", endpoint)
	}
	if err != nil {
		return fmt.Errorf("%w (check --store's endpoints and the network)", err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(timeout))
	if config == nil {
		// A server that speaks TLS answers a TLS hello; one that speaks plain HTTP/2 does not.
		probe := tls.Client(conn, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only asks whether it speaks TLS
		if probe.Handshake() == nil {
			return errors.New("the server speaks TLS, this client does not: give --cacert (the CA that signed the members' certificates)")
		}
		return nil
	}
	c := config.Clone()
	if c.ServerName == "" {
		c.ServerName = host
	}
	client := tls.Client(conn, c)
	err = client.HandshakeContext(context.Background())
	if err == nil {
		// Under TLS 1.3 a server refuses a client certificate (or its absence) after the
		// client's side of the handshake is done: its alert is the first thing read.
		conn.SetReadDeadline(time.Now().Add(min(timeout, 500*time.Millisecond)))
		var b [1]byte
		if _, rerr := client.Read(b[:]); rerr != nil && !errors.Is(rerr, os.ErrDeadlineExceeded) && !errors.Is(rerr, io.EOF) {
			err = rerr
		}
	}
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var record tls.RecordHeaderError
	var alert tls.AlertError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &unknown):
		return errors.New("x509: certificate signed by unknown authority (the members' certificates are not signed by --cacert: give the CA that signed them)")
	case errors.As(err, &hostname):
		return fmt.Errorf("%v (use a name or address the certificate names in --store, or reissue it)", hostname.Error())
	case errors.As(err, &record):
		return errors.New("the server does not speak TLS (first record does not look like a TLS handshake): leave out --cacert, --cert and --key")
	case errors.Is(err, io.EOF):
		// etcd's plain port hangs up on a TLS hello.
		return errors.New("tls: EOF: the server hung up on the TLS handshake; it does not speak TLS: leave out --cacert, --cert and --key")
	case errors.As(err, &alert) || strings.Contains(err.Error(), "certificate required") || strings.Contains(err.Error(), "bad certificate"):
		if len(c.Certificates) == 0 {
			return fmt.Errorf("%v: the server requires a client certificate: give --cert and --key", err)
		}
		return fmt.Errorf("%v: the server refused the client certificate: give --cert and --key of one its CA signed", err)
	}
	return fmt.Errorf("tls: %w", err)
}

// describeAuth adds the flag to fix etcd's authentication refusals.
func describeAuth(err error) error {
	switch {
	case errors.Is(err, rpctypes.ErrAuthFailed):
		return fmt.Errorf("%w (check --user and --password)", err)
	case errors.Is(err, rpctypes.ErrUserEmpty):
		return fmt.Errorf("%w (the cluster has authentication on: give --user USER[:PASSWORD])", err)
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		return fmt.Errorf("%w (--user's roles must grant read and write of the prefix)", err)
	}
	return nil
}
