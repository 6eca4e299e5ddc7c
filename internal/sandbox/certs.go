package sandbox

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// CA is a certificate authority made for one test: it signs server
// certificates for loopback registries and client certificates, and its
// certificate is what a containerd hosts.toml names as `ca`.
type CA struct {
	Dir      string // where its files and those it issues are written
	CertFile string // the CA certificate, PEM
	Cert     *x509.Certificate

	key *ecdsa.PrivateKey
}

// KeyPair is an issued certificate and its key, as PEM files.
type KeyPair struct {
	CertFile string
	KeyFile  string
}

// NewCA makes a CA valid for a day and writes its certificate to
// dir/ca.crt.
func NewCA(dir string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "gpupin test CA", Organization: []string{"gpupin tests"}},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	ca := &CA{Dir: dir, CertFile: filepath.Join(dir, "ca.crt"), key: key}
	der, err := ca.sign(tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	if ca.Cert, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := writePEM(ca.CertFile, "CERTIFICATE", der, 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

// Pool is a certificate pool holding just this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Server issues a server certificate for hosts (IP addresses or DNS
// names; default 127.0.0.1, ::1 and localhost) and writes it to
// dir/NAME.crt and dir/NAME.key.
func (ca *CA) Server(name string, hosts ...string) (KeyPair, error) {
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1", "::1", "localhost"}
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: hosts[0]},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(name, tmpl)
}

// Client issues a client certificate for commonName, written to
// dir/NAME.crt and dir/NAME.key (what a hosts.toml names as
// `client = [[cert, key]]`).
func (ca *CA) Client(name, commonName string) (KeyPair, error) {
	return ca.issue(name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func (ca *CA) issue(name string, tmpl *x509.Certificate) (KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("key for %s: %w", name, err)
	}
	der, err := ca.sign(tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return KeyPair{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("key for %s: %w", name, err)
	}
	kp := KeyPair{CertFile: filepath.Join(ca.Dir, name+".crt"), KeyFile: filepath.Join(ca.Dir, name+".key")}
	if err := writePEM(kp.CertFile, "CERTIFICATE", der, 0o644); err != nil {
		return KeyPair{}, err
	}
	if err := writePEM(kp.KeyFile, "PRIVATE KEY", keyDER, 0o600); err != nil {
		return KeyPair{}, err
	}
	return kp, nil
}

// sign fills in what every certificate here shares: a random serial, and
// a validity from an hour ago (a clock stepped back a little must not make
// it "not yet valid") to a day ahead.
func (ca *CA) sign(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, signer *ecdsa.PrivateKey) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, fmt.Errorf("sign %q: %w", tmpl.Subject.CommonName, err)
	}
	return der, nil
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Remote is what go-containerregistry's remote needs to reach a registry
// with a certificate of this CA, presenting client (a KeyPair from
// Client) when one is given: how a test puts content into a TLS registry
// before the code under test reads it.
func (ca *CA) Remote(client ...KeyPair) ([]remote.Option, error) {
	conf := &tls.Config{RootCAs: ca.Pool()}
	for _, kp := range client {
		c, err := tls.LoadX509KeyPair(kp.CertFile, kp.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate %s: %w", kp.CertFile, err)
		}
		conf.Certificates = append(conf.Certificates, c)
	}
	tr := remote.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = conf
	return []remote.Option{remote.WithTransport(tr)}, nil
}
