package build

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

type srcVariant struct {
	name   string
	env    []string
	labels map[string]string
	archs  []string // platform architectures, linux
}

var (
	cu13Env = []string{"CUDA_VERSION=13.0.1",
		"NVIDIA_REQUIRE_CUDA=cuda>=13.0,driver>=580.65.06 brand=tesla,driver>=535,driver<536"}
	cu129Env = []string{"CUDA_VERSION=12.9.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.9", "TORCH_CUDA_ARCH_LIST=7.5 8.0 9.0+PTX"}
)

func twoVariants() []srcVariant {
	return []srcVariant{
		{name: "cu13", env: cu13Env, labels: map[string]string{images.AnnotationArchs: "7.5,8.0,9.0,10.0,12.0+PTX", images.AnnotationProbe: "torch"}, archs: []string{"amd64", "arm64"}},
		{name: "cu129", env: cu129Env, labels: map[string]string{images.AnnotationProbe: "cuda"}, archs: []string{"amd64", "arm64"}},
	}
}

// pushSources pushes each variant as a multi-platform index under
// host/src/NAME:ci and returns the variants to publish.
func pushSources(t testing.TB, host string, vs []srcVariant) []Variant {
	t.Helper()
	ctx := context.Background()
	var out []Variant
	for _, v := range vs {
		var entries []sandbox.IndexEntry
		for _, arch := range v.archs {
			l, err := sandbox.FileLayer(map[string][]byte{"etc/gpupin-test": []byte(v.name + "/" + arch)})
			if err != nil {
				t.Fatal(err)
			}
			img, err := sandbox.Image(sandbox.ImageSpec{Arch: arch, Env: v.env, Labels: v.labels, Layers: []v1.Layer{l}})
			if err != nil {
				t.Fatal(err)
			}
			entries = append(entries, sandbox.IndexEntry{Image: img, Platform: &v1.Platform{OS: "linux", Architecture: arch}})
		}
		ref := fmt.Sprintf("%s/src/%s:ci", host, v.name)
		if _, err := sandbox.PushIndex(ctx, ref, entries); err != nil {
			t.Fatal(err)
		}
		out = append(out, Variant{Name: v.name, Ref: ref})
	}
	return out
}

func sourceDigests(t *testing.T, ref string) map[string]string {
	t.Helper()
	idx, err := remote.Index(testenv.MustRef(t, ref))
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range im.Manifests {
		out[m.Platform.OS+"/"+m.Platform.Architecture] = m.Digest.String()
	}
	return out
}

func TestPublishTwoVariantsTwoPlatforms(t *testing.T) {
	ctx := context.Background()
	src := testenv.Registry(t)
	dst := testenv.Registry(t)
	variants := pushSources(t, src.Host, twoVariants())
	tag := dst.Host + "/org/vllm:0.11.0"
	opts := PublishOptions{Tag: tag, Variants: variants, Engine: "vllm", Annotations: map[string]string{"org.opencontainers.image.source": "https://example.com/vllm"}}

	res, err := Publish(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Verified {
		t.Fatal("result not verified")
	}
	if n := dst.Count("upload", ""); n == 0 {
		t.Fatalf("first publish into an empty registry uploaded nothing")
	}

	src13 := sourceDigests(t, variants[0].Ref)
	src129 := sourceDigests(t, variants[1].Ref)
	common := map[string]string{
		images.AnnotationEngine:           "vllm",
		images.AnnotationEngineVersion:    "0.11.0",
		AnnotationOCIVersion:              "0.11.0",
		"org.opencontainers.image.source": "https://example.com/vllm",
	}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range common {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	ann129 := with(images.AnnotationVariant, "cu129", images.AnnotationCUDA, "12.9",
		images.AnnotationArchs, "7.5,8.0,9.0+PTX", images.AnnotationProbe, "cuda")
	ann13 := with(images.AnnotationVariant, "cu13", images.AnnotationCUDA, "13.0", images.AnnotationDriverMin, "580.65.06",
		images.AnnotationArchs, "7.5,8.0,9.0,10.0,12.0+PTX", images.AnnotationProbe, "torch")
	// Lowest CUDA first, though cu13 was given first.
	req129 := map[string]string{"CUDA_VERSION": "12.9.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.9"}
	req13 := map[string]string{"CUDA_VERSION": "13.0.1", "NVIDIA_REQUIRE_CUDA": "cuda>=13.0,driver>=580.65.06 brand=tesla,driver>=535,driver<536"}
	want := []struct {
		platform, digest string
		ann, req         map[string]string
	}{
		{"linux/amd64", src129["linux/amd64"], ann129, req129},
		{"linux/arm64", src129["linux/arm64"], ann129, req129},
		{"linux/amd64", src13["linux/amd64"], ann13, req13},
		{"linux/arm64", src13["linux/arm64"], ann13, req13},
	}

	idx, err := remote.Index(testenv.MustRef(t, tag))
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := idx.Digest(); got.String() != res.Digest {
		t.Errorf("tag digest %s, result says %s", got, res.Digest)
	}
	if len(im.Manifests) != len(want) {
		t.Fatalf("%d entries, want %d", len(im.Manifests), len(want))
	}
	for i, w := range want {
		m := im.Manifests[i]
		if m.Platform == nil || m.Platform.OS+"/"+m.Platform.Architecture != w.platform {
			t.Errorf("entry %d platform %v, want %s", i, m.Platform, w.platform)
		}
		if m.Digest.String() != w.digest {
			t.Errorf("entry %d digest %s, want the source's %s (child digests must not change)", i, m.Digest, w.digest)
		}
		// The requirement set is the source config's variables, as JSON.
		got := map[string]string{}
		for k, v := range m.Annotations {
			got[k] = v
		}
		var req map[string]string
		if err := json.Unmarshal([]byte(got[images.AnnotationRequire]), &req); err != nil {
			t.Errorf("entry %d: %s=%q: %v", i, images.AnnotationRequire, got[images.AnnotationRequire], err)
		}
		delete(got, images.AnnotationRequire)
		if !reflect.DeepEqual(got, w.ann) {
			t.Errorf("entry %d annotations:\n got %v\nwant %v", i, got, w.ann)
		}
		if !reflect.DeepEqual(req, w.req) {
			t.Errorf("entry %d requirement set %v, want %v", i, req, w.req)
		}
		// The child is in the target repository by digest.
		if _, err := remote.Head(testenv.MustRef(t, dst.Host+"/org/vllm@"+w.digest)); err != nil {
			t.Errorf("entry %d: child not in the target repository: %v", i, err)
		}
	}
	if im.Annotations[images.AnnotationEngine] != "vllm" || im.Annotations[AnnotationOCIVersion] != "0.11.0" {
		t.Errorf("index annotations %v", im.Annotations)
	}

	// Alias tags: an index of the variant's own entries.
	for _, a := range []struct {
		tag     string
		digests []string
	}{
		{tag + "-cu13", []string{src13["linux/amd64"], src13["linux/arm64"]}},
		{tag + "-cu129", []string{src129["linux/amd64"], src129["linux/arm64"]}},
	} {
		ai, err := remote.Index(testenv.MustRef(t, a.tag))
		if err != nil {
			t.Fatalf("alias %s: %v", a.tag, err)
		}
		aim, _ := ai.IndexManifest()
		var got []string
		for _, m := range aim.Manifests {
			got = append(got, m.Digest.String())
			if !images.HasMetadata(m.Annotations) {
				t.Errorf("alias %s entry %s without metadata", a.tag, m.Digest)
			}
		}
		if !reflect.DeepEqual(got, a.digests) {
			t.Errorf("alias %s entries %v, want %v", a.tag, got, a.digests)
		}
		if ad, _ := ai.Digest(); res.Aliases[a.tag] != ad.String() {
			t.Errorf("alias %s is %s, result says %s", a.tag, ad, res.Aliases[a.tag])
		}
	}

	// What a node sees: every variant from annotations, nothing derived.
	set, err := (&images.Resolver{}).Resolve(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, v := range set.Variants {
		if v.Derived {
			t.Errorf("variant %s %s derived", v.Variant, v.Platform)
		}
		seen = append(seen, v.Variant+"@"+v.Platform)
	}
	if w := []string{"cu129@linux/amd64", "cu129@linux/arm64", "cu13@linux/amd64", "cu13@linux/arm64"}; !reflect.DeepEqual(seen, w) {
		t.Errorf("resolved %v, want %v", seen, w)
	}

	// Same inputs again: not one blob upload, same index.
	dst.Reset()
	res2, err := Publish(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if n := dst.Count("upload", ""); n != 0 {
		t.Errorf("second publish made %d blob upload requests, want 0", n)
	}
	if n := dst.Count("manifest", http.MethodPut); n != 0 {
		t.Errorf("second publish wrote %d manifests, want 0 (all present)", n)
	}
	if res2.Digest != res.Digest {
		t.Errorf("second publish index %s, first %s: publish is not deterministic", res2.Digest, res.Digest)
	}
}

// A registry that scopes blobs per repository (as most do) answers HEAD in
// the target repository with 404; go-containerregistry's registry does
// not, so a hook plays that part and answers the mount. Publish must then
// mount from the source repository, not upload.
func TestPublishMountsFromSameRegistry(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	variants := pushSources(t, reg.Host, twoVariants())
	var mu sync.Mutex
	var mounts []string
	reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasPrefix(r.URL.Path, "/v2/org/vllm/blobs/") {
			return false
		}
		q := r.URL.Query()
		switch {
		case r.Method == http.MethodHead:
			w.WriteHeader(http.StatusNotFound)
			return true
		case r.Method == http.MethodPost && q.Get("mount") != "" && strings.HasPrefix(q.Get("from"), "src/"):
			mu.Lock()
			mounts = append(mounts, q.Get("from")+"@"+q.Get("mount"))
			mu.Unlock()
			w.Header().Set("Docker-Content-Digest", q.Get("mount"))
			w.WriteHeader(http.StatusCreated)
			return true
		}
		return false
	})
	reg.Reset()
	if _, err := Publish(ctx, PublishOptions{Tag: reg.Host + "/org/vllm:0.11.0", Variants: variants}); err != nil {
		t.Fatal(err)
	}
	if len(mounts) == 0 {
		t.Fatal("no cross-repository mounts")
	}
	for _, q := range reg.Requests() {
		if q.Kind() == "upload" && (q.Method == http.MethodPatch || q.Method == http.MethodPut) {
			t.Errorf("blob data uploaded (%s %s); want mounts only", q.Method, q.Path)
		}
	}
}

func TestPublishRefusals(t *testing.T) {
	cases := []struct {
		name    string
		src     []srcVariant
		extra   func(host string) []Variant
		partial bool
		want    string
	}{
		{
			name: "config contradicts name",
			src: []srcVariant{
				{name: "cu13", env: []string{"CUDA_VERSION=12.9.1"}, archs: []string{"amd64"}},
			},
			want: "variant name cu13 claims CUDA 13.x, but the image config has CUDA_VERSION=12.9.1",
		},
		{
			name: "cu129 built with 12.8",
			src: []srcVariant{
				{name: "cu13", env: cu13Env, archs: []string{"amd64"}},
				{name: "cu129", env: []string{"CUDA_VERSION=12.8.0"}, archs: []string{"amd64"}},
			},
			want: "claims CUDA 12.9, but the image config has CUDA_VERSION=12.8.0",
		},
		{
			name: "NVIDIA_REQUIRE_CUDA contradicts CUDA_VERSION",
			src: []srcVariant{
				{name: "cu129", env: []string{"CUDA_VERSION=12.9.1", "NVIDIA_REQUIRE_CUDA=cuda>=13.0"}, archs: []string{"amd64"}},
			},
			want: "NVIDIA_REQUIRE_CUDA needs cuda>=13.0, newer than CUDA_VERSION=12.9.1",
		},
		{
			name: "label contradicts name",
			src: []srcVariant{
				{name: "cu13", env: cu13Env, labels: map[string]string{images.AnnotationVariant: "cu129"}, archs: []string{"amd64"}},
			},
			want: "label io.gpupin.variant=cu129 contradicts variant cu13",
		},
		{
			name: "missing platform",
			src: []srcVariant{
				{name: "cu13", env: cu13Env, archs: []string{"amd64", "arm64"}},
				{name: "cu129", env: cu129Env, archs: []string{"amd64"}},
			},
			want: "variant cu129 has no linux/arm64 image, which cu13 has",
		},
		{
			name: "no CUDA_VERSION",
			src:  []srcVariant{{name: "cu13", archs: []string{"amd64"}}},
			want: "no CUDA_VERSION (nor cuda>= in NVIDIA_REQUIRE_CUDA) in the image config",
		},
		{
			name: "unknown source repository",
			src:  []srcVariant{{name: "cu13", env: cu13Env, archs: []string{"amd64"}}},
			extra: func(host string) []Variant {
				return []Variant{{Name: "cu129", Ref: host + "/src/nowhere:ci"}}
			},
			want: "variant cu129: cannot read source image 127.0.0.1:",
		},
		{
			name: "unreachable source registry",
			src:  []srcVariant{{name: "cu13", env: cu13Env, archs: []string{"amd64"}}},
			extra: func(string) []Variant {
				return []Variant{{Name: "cu129", Ref: closedHost(t) + "/src/cu129:ci"}}
			},
			want: "variant cu129: cannot read source image 127.0.0.1:",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			reg := testenv.Registry(t)
			variants := pushSources(t, reg.Host, c.src)
			if c.extra != nil {
				variants = append(variants, c.extra(reg.Host)...)
			}
			reg.Reset()
			tag := reg.Host + "/org/vllm:0.11.0"
			_, err := Publish(ctx, PublishOptions{Tag: tag, Variants: variants, AllowPartialPlatforms: c.partial})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			assertNoTag(t, tag)
			if n := reg.Count("manifest", http.MethodPut); n != 0 {
				t.Errorf("%d manifests written before refusing", n)
			}
			if n := reg.Count("upload", ""); n != 0 {
				t.Errorf("%d uploads before refusing", n)
			}
		})
	}
}

func assertNoTag(t *testing.T, tag string) {
	t.Helper()
	if _, err := remote.Head(testenv.MustRef(t, tag)); err == nil {
		t.Errorf("%s exists after a refused publish", tag)
	}
	for _, v := range []string{"cu13", "cu129"} {
		if _, err := remote.Head(testenv.MustRef(t, tag+"-"+v)); err == nil {
			t.Errorf("alias %s-%s exists after a refused publish", tag, v)
		}
	}
}

// closedHost is a loopback address nothing listens on.
func closedHost(t *testing.T) string {
	r, err := sandbox.StartRegistry(sandbox.RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	return r.Host
}

func TestPublishAllowPartialPlatforms(t *testing.T) {
	reg := testenv.Registry(t)
	variants := pushSources(t, reg.Host, []srcVariant{
		{name: "cu13", env: cu13Env, archs: []string{"amd64", "arm64"}},
		{name: "cu129", env: cu129Env, archs: []string{"amd64"}},
	})
	res, err := Publish(context.Background(), PublishOptions{Tag: reg.Host + "/org/vllm:1.0", Variants: variants, AllowPartialPlatforms: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "cu129 has no linux/arm64") {
		t.Errorf("warnings %q", res.Warnings)
	}
	var got []string
	for _, e := range res.Entries {
		got = append(got, e.Variant+"@"+e.Platform)
	}
	if w := []string{"cu129@linux/amd64", "cu13@linux/amd64", "cu13@linux/arm64"}; !reflect.DeepEqual(got, w) {
		t.Errorf("entries %v, want %v", got, w)
	}
}

// A failure after the children are pushed but before the tag leaves the tag
// on the previous version.
func TestPublishFailureLeavesTag(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	tag := reg.Host + "/org/vllm:0.11.0"
	first := pushSources(t, reg.Host, []srcVariant{{name: "cu129", env: cu129Env, archs: []string{"amd64"}}})
	old, err := Publish(ctx, PublishOptions{Tag: tag, Variants: first})
	if err != nil {
		t.Fatal(err)
	}
	reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/manifests/0.11.0-cu13") {
			http.Error(w, "quota exceeded", http.StatusForbidden)
			return true
		}
		return false
	})
	both := pushSources(t, reg.Host, []srcVariant{
		{name: "cu13", env: cu13Env, archs: []string{"amd64"}},
		{name: "cu129", env: cu129Env, archs: []string{"amd64"}},
	})
	_, err = Publish(ctx, PublishOptions{Tag: tag, Variants: both})
	if err == nil || !strings.Contains(err.Error(), "alias tag") || !strings.Contains(err.Error(), "tag not written") {
		t.Fatalf("error %v, want an alias failure that says the tag was not written", err)
	}
	d, err := remote.Head(testenv.MustRef(t, tag))
	if err != nil {
		t.Fatal(err)
	}
	if d.Digest.String() != old.Digest {
		t.Errorf("tag moved to %s after a failed publish; want the old %s", d.Digest, old.Digest)
	}
}

func TestPublishDryRun(t *testing.T) {
	reg := testenv.Registry(t)
	variants := pushSources(t, reg.Host, twoVariants())
	reg.Reset()
	res, err := Publish(context.Background(), PublishOptions{Tag: reg.Host + "/org/vllm:0.11.0", Variants: variants, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	var im v1.IndexManifest
	if err := json.Unmarshal(res.Index, &im); err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 4 || im.Manifests[0].Annotations[images.AnnotationVariant] != "cu129" {
		t.Errorf("dry-run index: %s", res.Index)
	}
	for _, q := range reg.Requests() {
		if q.Method != http.MethodGet && q.Method != http.MethodHead {
			t.Errorf("dry run sent %s %s", q.Method, q.Path)
		}
	}
	assertNoTag(t, reg.Host+"/org/vllm:0.11.0")
}

func TestCUDAClaim(t *testing.T) {
	cases := []struct {
		variant string
		cuda    string
		ok      bool
		err     bool
	}{
		{"cu13", "13.0", true, false},
		{"cu13", "13.1", true, false},
		{"cu13", "12.9", false, false},
		{"cu129", "12.9", true, false},
		{"cu129", "12.8", false, false},
		{"cu130", "13.0", true, false},
		{"cu130", "13.1", false, false},
		{"cu128-sm90", "12.8", true, false},
		{"cpu", "12.8", true, false}, // claims nothing
		{"cu1", "12.8", false, true},
		{"cu12345", "12.8", false, true},
	}
	for _, c := range cases {
		cl, err := cudaClaim(c.variant)
		if (err != nil) != c.err {
			t.Errorf("%s: error %v, want error %v", c.variant, err, c.err)
			continue
		}
		if err == nil && cl.holds(versionOf(c.cuda)) != c.ok {
			t.Errorf("%s holds %s = %v, want %v", c.variant, c.cuda, !c.ok, c.ok)
		}
	}
}

func TestDriverMin(t *testing.T) {
	cases := []struct{ req, want string }{
		{"", ""},
		{"cuda>=12.9", ""},
		{"cuda>=13.0,driver>=580.65.06", "580.65.06"},
		{"cuda>=12.9 brand=tesla,driver>=535,driver<536", ""},
		{"cuda>=13.0,driver>=580 brand=tesla,driver>=535,driver<536", "580"},
	}
	for _, c := range cases {
		got, err := driverMin(c.req)
		if err != nil || got != c.want {
			t.Errorf("driverMin(%q) = %q, %v; want %q", c.req, got, err, c.want)
		}
	}
}

func TestPublishOptionErrors(t *testing.T) {
	cases := []struct {
		name string
		opts PublishOptions
		want string
	}{
		{"no tag", PublishOptions{Tag: "127.0.0.1:1/org/vllm", Variants: []Variant{{Name: "cu13", Ref: "x"}}}, "want REPO:VERSION"},
		{"no variants", PublishOptions{Tag: "127.0.0.1:1/org/vllm:1"}, "no variants"},
		{"bad variant", PublishOptions{Tag: "127.0.0.1:1/org/vllm:1", Variants: []Variant{{Name: "CU13", Ref: "x"}}}, "not a variant name"},
		{"twice", PublishOptions{Tag: "127.0.0.1:1/org/vllm:1", Variants: []Variant{{Name: "cu13", Ref: "x"}, {Name: "cu13", Ref: "y"}}}, "given twice"},
		{"gpupin annotation", PublishOptions{Tag: "127.0.0.1:1/org/vllm:1", Variants: []Variant{{Name: "cu13", Ref: "x"}},
			Annotations: map[string]string{images.AnnotationCUDA: "13.0"}}, "filled by publish"},
		// Judged before any registry is read: 127.0.0.1:1 would refuse the connection.
		{"bad compression", PublishOptions{Tag: "127.0.0.1:1/org/vllm:1", Variants: []Variant{{Name: "cu13", Ref: "127.0.0.1:1/org/vllm-build:cu13"}},
			Compression: "lz4"}, "want gzip or zstd"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Publish(context.Background(), c.opts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want %q", err, c.want)
			}
		})
	}
}

// BeforeTag runs with every manifest readable by digest (each entry, each
// alias index, the index) and no tag written yet; its error fails the
// publish with no tag or alias written.
func TestPublishBeforeTag(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	variants := pushSources(t, reg.Host, twoVariants())
	for _, tc := range []struct {
		name, version string
		fail          error
	}{
		{"runs before the tags", "1.0", nil},
		{"its error writes no tag", "2.0", fmt.Errorf("signing refused")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tag := reg.Host + "/org/vllm:" + tc.version
			calls := 0
			before := func(ctx context.Context, res *Result) error {
				calls++
				digests := []string{res.Digest}
				for _, e := range res.Entries {
					digests = append(digests, e.Digest)
				}
				for _, d := range res.Aliases {
					digests = append(digests, d)
				}
				for _, d := range digests {
					if _, err := remote.Head(testenv.MustRef(t, reg.Host+"/org/vllm@"+d)); err != nil {
						t.Errorf("BeforeTag: %s not pushed by digest yet: %v", d, err)
					}
				}
				if _, err := remote.Head(testenv.MustRef(t, tag)); err == nil {
					t.Errorf("BeforeTag: %s already written", tag)
				}
				return tc.fail
			}
			_, err := Publish(ctx, PublishOptions{Tag: tag, Variants: variants, BeforeTag: before})
			if calls != 1 {
				t.Fatalf("BeforeTag ran %d times", calls)
			}
			if tc.fail == nil {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := remote.Head(testenv.MustRef(t, tag)); err != nil {
					t.Fatalf("tag after BeforeTag: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "tag not written: signing refused") {
				t.Fatalf("error %v, want BeforeTag's, saying no tag was written", err)
			}
			assertNoTag(t, tag)
		})
	}
}
