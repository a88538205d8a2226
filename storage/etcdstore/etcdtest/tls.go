package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// TLSFiles are the PEM files of a cluster started by StartTLS: the CA that signed the members'
// and the client's certificates, and another CA that signed nothing of it.
type TLSFiles struct {
	CA, OtherCA           string
	ClientCert, ClientKey string
}

// StartTLS is Start with TLS on the client port: members' certificates name 127.0.0.1 only
// (not localhost), signed by a CA made for the test; with clientCerts the members require a
// client certificate signed by it.
func StartTLS(t testing.TB, n int, clientCerts bool) (*Cluster, TLSFiles) {
	t.Helper()
	dir := t.TempDir()
	ca, caKey := newCA(t, dir, "ca")
	newCA(t, dir, "other-ca")
	serverCert, serverKey := newLeaf(t, dir, "server", ca, caKey, x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := newLeaf(t, dir, "client", ca, caKey, x509.ExtKeyUsageClientAuth)
	files := TLSFiles{CA: filepath.Join(dir, "ca.pem"), OtherCA: filepath.Join(dir, "other-ca.pem"), ClientCert: clientCert, ClientKey: clientKey}
	tlsInfo := transport.TLSInfo{CertFile: serverCert, KeyFile: serverKey}
	if clientCerts { // etcd asks for a client certificate whenever it is given a CA to check one
		tlsInfo.TrustedCAFile, tlsInfo.ClientCertAuth = files.CA, true
	}
	return startWith(t, n, &tlsInfo), files
}

func newCA(t testing.TB, dir, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	tmpl := &x509.Certificate{KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, key := issue(t, name, tmpl, nil, nil)
	writePEM(t, filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func newLeaf(t testing.TB, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	tmpl := &x509.Certificate{KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, key := issue(t, name, tmpl, ca, caKey)
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
	return certFile, keyFile
}

// issue makes a key and a day's certificate of tmpl for it, named name, signed by parent's key
// (self-signed when parent is nil).
func issue(t testing.TB, name string, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.Subject = pkix.Name{CommonName: name}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
