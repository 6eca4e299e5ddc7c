package images

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/node"
)

// Fuzz targets: values from registries and operators give errors, never
// panics, and what parses renders back to the same thing.

func FuzzParseOverride(f *testing.F) {
	for _, s := range []string{"", "auto", "none", "cu129", "cu13", "registry.example/org/vllm:0.11.0-custom",
		"127.0.0.1:5000/vllm@sha256:" + strings.Repeat("0", 64), "vllm:latest", "@", ":", "/", "a:b:c", "CU13", " none", "cu-", "x@sha256:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := ParseOverride(s)
		if err != nil {
			if !strings.Contains(err.Error(), "accepted forms") {
				t.Fatalf("ParseOverride(%q) error %q does not list the accepted forms", s, err)
			}
			return
		}
		back, err := ParseOverride(o.String())
		if err != nil || back != o {
			t.Fatalf("ParseOverride(%q) = %+v; its String %q parses to %+v, %v", s, o, o.String(), back, err)
		}
		switch o.Kind {
		case OverrideVariant:
			if !ValidVariantName(o.Variant) {
				t.Fatalf("variant %q accepted but not a valid name", o.Variant)
			}
		case OverrideImage:
			if !strings.ContainsAny(o.Image, "/:@") {
				t.Fatalf("image %q accepted without '/', ':' or '@'", o.Image)
			}
		}
	})
}

var fuzzNodes = []*node.Facts{
	{Driver: "580.82.07", CUDA: "13.0", GPUs: []node.GPU{{Index: 0, Brand: "tesla", CC: "9.0"}, {Index: 1, CC: "8.0"}}},
	{Driver: "535.104.05", CUDA: "12.2", GPUs: []node.GPU{{Index: 0, Brand: "geforce", CC: "8.9"}}},
}

func FuzzParseRequireVar(f *testing.F) {
	for _, s := range []string{
		"cuda>=12.9 brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=535,driver<536",
		"cuda>=13.0", "arch>=7.5", "driver!=535", ", cuda>=1", "cuda>=12.9 ,", ",,,", "", "cuda", "=", "cuda>=", "brand<tesla",
		"cuda>=1.2.3.4.5", "arch>=99.9", "cuda>=12.9\tbrand=tesla,driver>=535",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseRequireVar("NVIDIA_REQUIRE_CUDA", s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "NVIDIA_REQUIRE_CUDA: ") {
				t.Fatalf("error %q does not name the variable", err)
			}
			return
		}
		for _, alt := range v.Alternatives {
			for _, c := range alt {
				if c.Key != "cuda" && c.Key != "driver" && c.Key != "arch" && c.Key != "brand" {
					t.Fatalf("accepted unknown key %q", c.Key)
				}
			}
		}
		// Whatever parsed, evaluating it on real-looking nodes must not panic,
		// and a failure must say why.
		r := &Requirements{Vars: []RequireVar{v}}
		for _, n := range fuzzNodes {
			if ok, why := r.Check(n); !ok && why == "" {
				t.Fatalf("%q fails on %+v without a reason", s, n)
			}
		}
	})
}

func FuzzRequirementsFromEnv(f *testing.F) {
	f.Add("CUDA_VERSION=12.9.1\nNVIDIA_REQUIRE_CUDA=cuda>=12.9 brand=tesla,driver>=535,driver<536")
	f.Add("CUDA_VERSION=13.0.0")
	f.Add("NVIDIA_DISABLE_REQUIRE=1\nNVIDIA_REQUIRE_CUDA=cuda>=99")
	f.Add("NVIDIA_REQUIRE_ARCH=arch>=8.0\nNVIDIA_REQUIRE_JETPACK=x")
	f.Add("CUDA_VERSION=\nNVIDIA_REQUIRE_CUDA=")
	f.Fuzz(func(t *testing.T, s string) {
		env := strings.Split(s, "\n")
		r, err := RequirementsFromEnv(env)
		if err != nil {
			return
		}
		for _, n := range fuzzNodes {
			if ok, why := r.Check(n); !ok && why == "" {
				t.Fatalf("%q fails without a reason", s)
			}
		}
		// DeriveMetadata on the same env: an error or metadata that validates.
		if md, _, err := DeriveMetadata(env, nil); err == nil {
			if err := md.Validate(); err != nil {
				t.Fatalf("derived metadata %+v does not validate: %v", md, err)
			}
		}
	})
}

func FuzzParseAnnotations(f *testing.F) {
	f.Add("vllm", "0.11.0", "cu13", "13.0", "580.65.06", "7.5,8.0,8.6,8.9,9.0,10.0,12.0+PTX", "torch")
	f.Add("", "", "cu129", "12.9", "", "7.0 7.5 8.0 9.0a", "")
	f.Add("x", "y", "", "", "", "", "")
	f.Add("VLLM", "\x00", "cu 13", "13.x", "latest", "sm_90", "bash")
	f.Fuzz(func(t *testing.T, engine, version, variant, cuda, driverMin, archs, probe string) {
		ann := map[string]string{AnnotationEngine: engine, AnnotationEngineVersion: version, AnnotationVariant: variant,
			AnnotationCUDA: cuda, AnnotationDriverMin: driverMin, AnnotationArchs: archs, AnnotationProbe: probe}
		m, err := ParseAnnotations(ann)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("parsed metadata %+v does not validate: %v", m, err)
		}
		back, err := ParseAnnotations(m.Annotations())
		if err != nil || back != m {
			t.Fatalf("round trip of %+v = %+v, %v", m, back, err)
		}
		// Choosing with it must not panic on any node.
		v := Variant{Metadata: m}
		for _, n := range fuzzNodes {
			Reject(n, v)
		}
	})
}

func FuzzParseArchs(f *testing.F) {
	for _, s := range []string{"7.5,8.0,8.6,8.9,9.0,10.0,12.0+PTX", "7.5 8.0 9.0a 12.0+PTX", "9.0a+PTX", "10.0f", "", ",", "9", "99.9", "1.0+PTX+PTX", "9.0fa"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		as, err := ParseArchs(s)
		if err != nil {
			return
		}
		back, err := ParseArchs(as.String())
		if err != nil || back.String() != as.String() {
			t.Fatalf("ParseArchs(%q) = %s; it reparses to %s, %v", s, as, back, err)
		}
		for _, cc := range []node.CC{{Major: 7, Minor: 0}, {Major: 9, Minor: 0}, {Major: 12, Minor: 1}} {
			as.Covers(cc)
		}
	})
}

// FuzzParseRequireAnnotation: an io.gpupin.cuda.require value from a
// registry gives an error or requirements, never a panic; what parses is
// judged exactly as the same variables in an image's own Env would be
// (RequirementsFromEnv: the derived path), and writing those variables
// back (RequireAnnotation, what publish does) gives a value judged the
// same again. ParseAnnotations never takes a value the parser refuses.
func FuzzParseRequireAnnotation(f *testing.F) {
	for _, env := range [][]string{
		{"CUDA_VERSION=12.9.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.9 brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=535,driver<536"},
		{"CUDA_VERSION=13.0.0", "NVIDIA_REQUIRE_ARCH=arch>=8.0"},
		{"CUDA_VERSION=13.0.0", "NVIDIA_DISABLE_REQUIRE=true", "NVIDIA_REQUIRE_CUDA=cuda>=13.0"},
		{"NVIDIA_REQUIRE_CUDA=cuda>=12.4", "NVIDIA_REQUIRE_DRIVER=driver<560", "NVIDIA_REQUIRE_BRAND=brand!=geforce"},
		{"CUDA_VERSION=12.9.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.9 , brand=tesla"},
		{"CUDA_VERSION=12.8.1"},
	} {
		s, err := RequireAnnotation(env)
		if err != nil {
			f.Fatalf("seed %q: %v", env, err)
		}
		f.Add(s)
	}
	for _, s := range []string{"", "{}", "null", "[]", `"cuda>=12.9"`, `{"CUDA_VERSION":12.9}`, `{"PATH":"/bin"}`,
		`{"NVIDIA_REQUIRE_CUDA":"cuda>=12.9"} {}`, `{"NVIDIA_REQUIRE_CUDA":"cuda>=12.9","NVIDIA_REQUIRE_CUDA":"cuda>=13.0"}`,
		`{"NVIDIA_REQUIRE_A=B":"arch>=8.0"}`, `{"NVIDIA_REQUIRE_JETPACK":"x"}`, `{"NVIDIA_DISABLE_REQUIRE":"maybe","CUDA_VERSION":"99"}`,
		`{"CUDA_VERSION":"12.9\u0000"}`, `{"NVIDIA_REQUIRE_CUDA":"` + strings.Repeat("cuda>=12.9 ", 900) + `"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		req, disabled, err := ParseRequireAnnotation(s)
		md := Metadata{Variant: "cu129", CUDA: "12.9", Require: s}
		if _, aerr := ParseAnnotations(md.Annotations()); aerr == nil && err != nil && s != "" && strings.TrimSpace(s) == s {
			t.Fatalf("ParseAnnotations took %q, which ParseRequireAnnotation refuses: %v", s, err)
		}
		if err != nil {
			return
		}
		if disabled != (req == nil) {
			t.Fatalf("%q: disabled %v with requirements %+v", s, disabled, req)
		}
		var vars map[string]string
		if err := json.Unmarshal([]byte(s), &vars); err != nil {
			t.Fatalf("%q parsed, but is not a JSON object of strings: %v", s, err)
		}
		env := make([]string, 0, len(vars))
		for k, v := range vars {
			env = append(env, k+"="+v)
		}
		sort.Strings(env)
		fromEnv, err := RequirementsFromEnv(env)
		if err != nil {
			t.Fatalf("%q parsed, but the same Env does not: %v", s, err)
		}
		back, err := RequireAnnotation(env)
		if err != nil {
			t.Fatalf("%q parsed, but RequireAnnotation of its Env fails: %v", s, err)
		}
		again, againDisabled, err := ParseRequireAnnotation(back)
		if err != nil || againDisabled != disabled {
			t.Fatalf("%q written back as %q: %v, disabled %v (want %v)", s, back, err, againDisabled, disabled)
		}
		for _, n := range fuzzNodes {
			ok, why := req.Check(n)
			eok, ewhy := fromEnv.Check(n)
			aok, awhy := again.Check(n)
			if ok != eok || why != ewhy || ok != aok || why != awhy {
				t.Fatalf("%q on %+v: annotation (%v, %q), Env (%v, %q), written back (%v, %q)", s, n, ok, why, eok, ewhy, aok, awhy)
			}
			if !ok && why == "" {
				t.Fatalf("%q fails on %+v without a reason", s, n)
			}
			// As Reject judges a published entry: the requirement set alone.
			v := Variant{Metadata: md, Require: req, RequireDisabled: disabled}
			if got := Reject(n, v); (got == "") != ok {
				t.Fatalf("%q on %+v: Reject %q, but the set holds %v", s, n, got, ok)
			}
		}
	})
}
