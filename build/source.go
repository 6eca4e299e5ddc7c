package build

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
)

// variantImages is one variant's images, read and checked.
type variantImages struct {
	name     string
	inMemory bool
	cuda     node.Version
	images   []*sourceImage
}

// sourceImage is one platform's image of a variant.
type sourceImage struct {
	img      v1.Image
	plat     *v1.Platform
	platform string
	source   string
	labels   map[string]string
	meta     images.Metadata
}

// readVariant reads a variant's images (from a registry, or in memory) and
// checks each against its own config.
func readVariant(ctx context.Context, v Variant, ropts []remote.Option) (*variantImages, error) {
	vi := &variantImages{name: v.Name, inMemory: len(v.Images) > 0}
	type found struct {
		img    v1.Image
		plat   *v1.Platform
		source string
	}
	var list []found
	if vi.inMemory {
		for i, img := range v.Images {
			list = append(list, found{img: img, source: fmt.Sprintf("build:%s[%d]", v.Name, i)})
		}
	} else {
		ref, err := parseRef(v.Ref)
		if err != nil {
			return nil, fmt.Errorf("variant %s: %w", v.Name, err)
		}
		desc, err := remote.Get(ref, ropts...)
		if err != nil {
			return nil, fmt.Errorf("variant %s: cannot read source image %s: %w", v.Name, v.Ref, err)
		}
		repo := ref.Context()
		switch {
		case desc.MediaType.IsIndex():
			idx, err := desc.ImageIndex()
			if err != nil {
				return nil, fmt.Errorf("variant %s: source %s: %w", v.Name, v.Ref, err)
			}
			im, err := idx.IndexManifest()
			if err != nil {
				return nil, fmt.Errorf("variant %s: source %s: index: %w", v.Name, v.Ref, err)
			}
			for i, d := range im.Manifests {
				if d.MediaType.IsIndex() {
					return nil, fmt.Errorf("variant %s: source %s: entry %d is itself an index; give one of its images", v.Name, v.Ref, i)
				}
				// Attestations and signatures (buildx's unknown/unknown) are
				// not variants; they would dangle without their subject's tag.
				if !d.MediaType.IsImage() || (d.Platform != nil && d.Platform.OS == "unknown") {
					continue
				}
				img, err := idx.Image(d.Digest)
				if err != nil {
					return nil, fmt.Errorf("variant %s: source %s: entry %d: %w", v.Name, v.Ref, i, err)
				}
				list = append(list, found{img: img, plat: d.Platform, source: repo.Digest(d.Digest.String()).String()})
			}
		case desc.MediaType.IsImage():
			img, err := desc.Image()
			if err != nil {
				return nil, fmt.Errorf("variant %s: source %s: %w", v.Name, v.Ref, err)
			}
			list = append(list, found{img: img, source: repo.Digest(desc.Digest.String()).String()})
		default:
			return nil, fmt.Errorf("variant %s: source %s: media type %q is neither an image nor an index", v.Name, v.Ref, desc.MediaType)
		}
		if len(list) == 0 {
			return nil, fmt.Errorf("variant %s: source %s holds no image manifests", v.Name, v.Ref)
		}
	}
	claim, err := cudaClaim(v.Name)
	if err != nil {
		return nil, err
	}
	seen := map[string]string{}
	for _, f := range list {
		si, cuda, err := checkImage(v, claim, f.img, f.plat)
		if err != nil {
			return nil, fmt.Errorf("variant %s (%s): %w", v.Name, f.source, err)
		}
		si.source = f.source
		if prev, ok := seen[si.platform]; ok {
			return nil, fmt.Errorf("variant %s: two images for %s (%s and %s)", v.Name, si.platform, prev, f.source)
		}
		seen[si.platform] = f.source
		if vi.cuda == nil {
			vi.cuda = cuda
		} else if vi.cuda.Compare(cuda) != 0 {
			return nil, fmt.Errorf("variant %s: its images target different CUDA versions (%s and %s); one variant is one CUDA", v.Name, vi.cuda, cuda)
		}
		vi.images = append(vi.images, si)
	}
	return vi, nil
}

// claim is what a variant name says about its CUDA version.
type claim struct {
	major, minor int
	anyMinor     bool // cu13: any 13.x
	set          bool
}

func (c claim) String() string {
	if c.anyMinor {
		return fmt.Sprintf("%d.x", c.major)
	}
	return fmt.Sprintf("%d.%d", c.major, c.minor)
}

var cuRE = regexp.MustCompile(`^cu([0-9]{2})([0-9]?)(?:$|[._-])`)

// cudaClaim reads a variant name: cu13 claims 13.x, cu129 12.9, cu130 13.0,
// and a suffix may follow (cu128-sm90). Names not starting with cu and a
// digit (cpu, default) claim nothing.
func cudaClaim(variant string) (claim, error) {
	if len(variant) < 3 || !strings.HasPrefix(variant, "cu") || variant[2] < '0' || variant[2] > '9' {
		return claim{}, nil
	}
	m := cuRE.FindStringSubmatch(variant)
	if m == nil {
		return claim{}, fmt.Errorf("variant %s: cannot read a CUDA version from the name (want cuNN for NN.x or cuNNM for NN.M, e.g. cu13, cu129)", variant)
	}
	c := claim{set: true}
	c.major, _ = strconv.Atoi(m[1])
	if m[2] == "" {
		c.anyMinor = true
	} else {
		c.minor, _ = strconv.Atoi(m[2])
	}
	return c, nil
}

func (c claim) holds(v node.Version) bool {
	if !c.set {
		return true
	}
	if len(v) < 1 || v[0] != c.major {
		return false
	}
	if c.anyMinor {
		return true
	}
	minor := 0
	if len(v) > 1 {
		minor = v[1]
	}
	return minor == c.minor
}

// checkImage checks what one image's config says against the variant and
// its index entry, and fills its metadata.
func checkImage(v Variant, c claim, img v1.Image, plat *v1.Platform) (*sourceImage, node.Version, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	cp := &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant, OSVersion: cf.OSVersion}
	if cp.OS == "" || cp.Architecture == "" {
		return nil, nil, fmt.Errorf("the image config names no os/architecture (as `crane append` leaves it), so no node could tell whether it runs there: set it (crane mutate --set-platform linux/amd64 IMAGE) and publish again")
	}
	if plat != nil {
		if plat.OS != cp.OS || plat.Architecture != cp.Architecture || (plat.Variant != "" && cp.Variant != "" && plat.Variant != cp.Variant) {
			return nil, nil, fmt.Errorf("index entry says %s, but the image config says %s", plat, cp)
		}
		cp = plat
	}
	si := &sourceImage{img: img, plat: cp, platform: cp.String(), labels: cf.Config.Labels}
	env := map[string]string{}
	for _, kv := range cf.Config.Env {
		k, val, _ := strings.Cut(kv, "=")
		env[k] = val
	}
	req, err := images.RequirementsFromEnv(cf.Config.Env)
	if err != nil {
		return nil, nil, err
	}
	cv, what := env["CUDA_VERSION"], "CUDA_VERSION="
	if cv == "" {
		// As nodes derive it: an image on another base may state its CUDA
		// only in NVIDIA_REQUIRE_CUDA.
		cv, what = req.MinCUDA(), "NVIDIA_REQUIRE_CUDA cuda>="
	}
	if cv == "" {
		return nil, nil, fmt.Errorf("no CUDA_VERSION (nor cuda>= in NVIDIA_REQUIRE_CUDA) in the image config: cannot check that it targets CUDA %s", c)
	}
	mm, err := images.ParseCUDAVersion(cv)
	if err != nil {
		return nil, nil, fmt.Errorf("%s%q: %w", what, cv, err)
	}
	ver, _ := node.ParseVersion(mm)
	if !c.holds(ver) {
		return nil, nil, fmt.Errorf("variant name %s claims CUDA %s, but the image config has %s%s; refusing to publish a mislabelled variant", v.Name, c, what, cv)
	}
	if min := req.MinCUDA(); min != "" {
		if mv, err := node.ParseVersion(min); err == nil && mv.Compare(ver) > 0 {
			return nil, nil, fmt.Errorf("NVIDIA_REQUIRE_CUDA needs cuda>=%s, newer than CUDA_VERSION=%s: the config contradicts itself", min, cv)
		}
	}
	labels := cf.Config.Labels
	md := images.Metadata{Variant: v.Name, CUDA: mm, Probe: labels[images.AnnotationProbe], ProbeExec: labels[images.AnnotationProbeExec]}
	switch {
	case v.Archs != "":
		md.Archs = v.Archs
	case labels[images.AnnotationArchs] != "":
		md.Archs = labels[images.AnnotationArchs]
	default:
		md.Archs = env["TORCH_CUDA_ARCH_LIST"]
	}
	// Labels and annotations already on the image are claims too.
	for _, src := range []struct {
		what string
		m    map[string]string
	}{{"label", cf.Config.Labels}, {"manifest annotation", manifestAnnotations(img)}} {
		if l := src.m[images.AnnotationVariant]; l != "" && l != v.Name {
			return nil, nil, fmt.Errorf("image %s %s=%s contradicts variant %s", src.what, images.AnnotationVariant, l, v.Name)
		}
		if l := src.m[images.AnnotationCUDA]; l != "" {
			lv, err := node.ParseVersion(l)
			if err != nil || lv.Compare(ver) != 0 {
				return nil, nil, fmt.Errorf("image %s %s=%s contradicts CUDA_VERSION=%s", src.what, images.AnnotationCUDA, l, cv)
			}
		}
	}
	if md.Archs != "" {
		if _, err := images.ParseArchs(md.Archs); err != nil {
			return nil, nil, fmt.Errorf("arch list %q: %w", md.Archs, err)
		}
		md.Archs = normaliseArchs(md.Archs)
	}
	md.DriverMin, err = driverMin(env["NVIDIA_REQUIRE_CUDA"])
	if err != nil {
		return nil, nil, err
	}
	// The whole requirement set travels with the entry: nodes judge the
	// published variant exactly as they would judge this image unannotated.
	if md.Require, err = images.RequireAnnotation(cf.Config.Env); err != nil {
		return nil, nil, err
	}
	if err := md.Validate(); err != nil {
		return nil, nil, err
	}
	si.meta = md
	return si, ver, nil
}

func manifestAnnotations(img v1.Image) map[string]string {
	m, err := img.Manifest()
	if err != nil || m == nil {
		return nil
	}
	return m.Annotations
}

// driverMin is the driver>= term of NVIDIA_REQUIRE_CUDA's main branch (its
// first alternative). The other alternatives are forward-compatibility
// branches for particular brands and do not bound every node.
func driverMin(req string) (string, error) {
	if strings.TrimSpace(req) == "" {
		return "", nil
	}
	rv, err := images.ParseRequireVar("NVIDIA_REQUIRE_CUDA", req)
	if err != nil {
		return "", err
	}
	if len(rv.Alternatives) == 0 {
		return "", nil
	}
	for _, c := range rv.Alternatives[0] {
		if c.Key == "driver" && c.Op == ">=" {
			return c.Value, nil
		}
	}
	return "", nil
}

// normaliseArchs writes an arch list comma-separated, as the annotation is;
// TORCH_CUDA_ARCH_LIST separates with spaces or semicolons.
func normaliseArchs(s string) string {
	f := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ';' || r == ' ' || r == '\t' })
	return strings.Join(f, ",")
}
