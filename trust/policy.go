// Package trust is gpupin's signature policy: which keys or keyless
// identities must have signed an engine's image before a node pulls it,
// and the verification of those signatures where cosign writes them.
//
// Verification runs before the pull and the probe, so nothing unverified
// reaches the GPU (the probe runs as root in the candidate image). The
// cryptography and the bundle format are the Sigstore libraries'
// (sigstore-go's verify for bundles, sigstore's signature and payload
// packages for cosign's classic scheme); this package only finds the
// signatures, bounds what it reads, and says why one is refused.
package trust

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/options"
	"go.yaml.in/yaml/v3"
)

// Modes of a rule.
const (
	ModeOff      = "off"
	ModeRequired = "required"
)

// File is the policy file's shape (YAML, or JSON, which YAML reads):
//
//	default: {mode: off}
//	engines:
//	  vllm:
//	    mode: required
//	    keys: [/etc/gpupin/keys/ci.pub]
//	    identities:
//	      - issuer: https://token.actions.githubusercontent.com
//	        subject: https://github.com/org/repo/.github/workflows/release.yml@refs/heads/main
//	    trustedRoot: /etc/gpupin/trusted_root.json
//
// Relative paths are relative to the policy file's directory.
type File struct {
	Default *RuleFile           `yaml:"default" json:"default"`
	Engines map[string]RuleFile `yaml:"engines" json:"engines"`
}

// RuleFile is one engine's rule as written.
type RuleFile struct {
	Mode        string     `yaml:"mode" json:"mode"`
	Keys        []string   `yaml:"keys" json:"keys"`
	Identities  []Identity `yaml:"identities" json:"identities"`
	TrustedRoot string     `yaml:"trustedRoot" json:"trustedRoot"`
}

// Identity is a keyless signer: the OIDC issuer and the certificate's
// subject (SAN), both matched exactly.
type Identity struct {
	Issuer  string `yaml:"issuer" json:"issuer"`
	Subject string `yaml:"subject" json:"subject"`
}

func (i Identity) String() string { return i.Subject + " (" + i.Issuer + ")" }

// Policy is a loaded policy: each rule's keys parsed, its trusted root read.
type Policy struct {
	// Path is the file it came from, for messages.
	Path    string
	Default Rule
	Engines map[string]Rule
}

// Rule is one engine's loaded rule.
type Rule struct {
	Mode       string
	Keys       []Key
	Identities []Identity
	Root       root.TrustedMaterial
	RootPath   string
}

// Key is a public key a rule trusts, named by its file and fingerprint.
type Key struct {
	Name string // "key FILE (sha256:…)": what a pin's Signed.By says
	// Verifiers check this key's signatures: sigstore's default verifier
	// for its type, the hash chosen by the key as cosign chooses it (ECDSA
	// P-256 with SHA-256, P-384 with SHA-384, P-521 with SHA-512, RSA
	// PKCS #1 v1.5 with SHA-256). An Ed25519 key has two: Ed25519ph, what
	// cosign (and gpupin) sign classic signatures with, and pure Ed25519,
	// what sigstore-go signs bundles with by default.
	Verifiers []signature.Verifier
	Public    crypto.PublicKey
}

// KeyVerifiers are the verifiers a policy checks pub's signatures with
// (Key.Verifiers), or why sigstore has none for it.
func KeyVerifiers(pub crypto.PublicKey) ([]signature.Verifier, error) {
	var opts [][]signature.LoadOption
	if _, ok := pub.(ed25519.PublicKey); ok {
		opts = [][]signature.LoadOption{{options.WithED25519ph()}, nil}
	} else {
		opts = [][]signature.LoadOption{nil}
	}
	var out []signature.Verifier
	for _, o := range opts {
		v, err := signature.LoadDefaultVerifier(pub, o...)
		if err != nil {
			return nil, fmt.Errorf("%s, which sigstore does not verify (it verifies ECDSA P-256, P-384 and P-521, RSA of 2048, 3072 or 4096 bits, and Ed25519): %w", keyKind(pub), err)
		}
		out = append(out, v)
	}
	return out, nil
}

// keyKind names a public key's type for messages ("an RSA key of 1024 bits").
func keyKind(pub crypto.PublicKey) string {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return "an ECDSA " + k.Curve.Params().Name + " key"
	case *rsa.PublicKey:
		return fmt.Sprintf("an RSA key of %d bits", k.N.BitLen())
	case ed25519.PublicKey:
		return "an Ed25519 key"
	default:
		return fmt.Sprintf("a %T key", pub)
	}
}

// Off is the policy when none is given: nothing is required.
func Off() *Policy { return &Policy{Default: Rule{Mode: ModeOff}} }

// For is the rule for an engine: its own, else the default.
func (p *Policy) For(engine string) Rule {
	if p == nil {
		return Rule{Mode: ModeOff}
	}
	if r, ok := p.Engines[engine]; ok {
		return r
	}
	return p.Default
}

// Load reads and checks a policy file.
func Load(path string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", path, err)
	}
	return Parse(path, b)
}

// Parse checks a policy's text; path names it in errors and anchors its
// relative paths. Every error reads "policy FILE: WHERE: why".
func Parse(path string, data []byte) (*Policy, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true) // a misspelt field is an error, not a silent "off"
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("policy %s: %s", path, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	dir := filepath.Dir(path)
	p := &Policy{Path: path, Default: Rule{Mode: ModeOff}, Engines: map[string]Rule{}}
	if f.Default != nil {
		r, err := loadRule(dir, *f.Default)
		if err != nil {
			return nil, fmt.Errorf("policy %s: default.%w", path, err)
		}
		p.Default = r
	}
	names := make([]string, 0, len(f.Engines))
	for n := range f.Engines {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if n == "" {
			return nil, fmt.Errorf("policy %s: engines: an empty engine name", path)
		}
		r, err := loadRule(dir, f.Engines[n])
		if err != nil {
			return nil, fmt.Errorf("policy %s: engines.%s.%w", path, n, err)
		}
		p.Engines[n] = r
	}
	return p, nil
}

func loadRule(dir string, rf RuleFile) (Rule, error) {
	r := Rule{Mode: rf.Mode, Identities: rf.Identities}
	switch rf.Mode {
	case "":
		r.Mode = ModeOff
	case ModeOff, ModeRequired:
	default:
		return r, fmt.Errorf("mode: %q is neither %q nor %q", rf.Mode, ModeRequired, ModeOff)
	}
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	for i, k := range rf.Keys {
		pem, err := os.ReadFile(abs(k))
		if err != nil {
			return r, fmt.Errorf("keys[%d]: %w", i, err)
		}
		pub, err := cryptoutils.UnmarshalPEMToPublicKey(pem)
		if err != nil {
			return r, fmt.Errorf("keys[%d]: %s: not a PEM public key: %w", i, k, err)
		}
		vs, err := KeyVerifiers(pub)
		if err != nil {
			return r, fmt.Errorf("keys[%d]: %s: %w", i, k, err)
		}
		fp, err := fingerprint(pub)
		if err != nil {
			return r, fmt.Errorf("keys[%d]: %s: %w", i, k, err)
		}
		r.Keys = append(r.Keys, Key{Name: "key " + filepath.Base(k) + " (" + fp + ")", Verifiers: vs, Public: pub})
	}
	for i, id := range rf.Identities {
		if id.Issuer == "" || id.Subject == "" {
			return r, fmt.Errorf("identities[%d]: issuer and subject are both required", i)
		}
	}
	if len(rf.Identities) > 0 {
		if rf.TrustedRoot == "" {
			return r, errors.New("trustedRoot: keyless identities need an offline trusted root JSON file (nodes may have no internet)")
		}
		tr, err := root.NewTrustedRootFromPath(abs(rf.TrustedRoot))
		if err != nil {
			return r, fmt.Errorf("trustedRoot: %s: %w", rf.TrustedRoot, err)
		}
		r.Root, r.RootPath = tr, rf.TrustedRoot
	}
	if r.Mode == ModeRequired && len(r.Keys) == 0 && len(r.Identities) == 0 {
		return r, errors.New("mode: required names no keys and no identities: nothing could ever verify")
	}
	return r, nil
}

// fingerprint names a key by the SHA-256 of its DER, as people compare keys.
func fingerprint(pub crypto.PublicKey) (string, error) {
	der, err := cryptoutils.MarshalPublicKeyToDER(pub)
	if err != nil {
		return "", err
	}
	sum := sha256Hex(der)
	return "sha256:" + sum[:16], nil
}
