package build

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/registry"
)

// Standard annotations publish writes beside gpupin's.
const (
	AnnotationOCIVersion = "org.opencontainers.image.version"
	AnnotationOCITitle   = "org.opencontainers.image.title"
)

// Variant is one variant to publish: a name and where its images come from.
type Variant struct {
	// Name is the variant name (cu13, cu129). A name of the form cuNN claims
	// CUDA NN.x and cuNNM claims NN.M; the image config must agree.
	Name string
	// Ref is the source image or index (single- or multi-platform).
	Ref string
	// Images are in-memory images (gpupin build's output), used instead of
	// Ref. Their manifests are not yet published, so publish annotates the
	// child manifests too, not only the index entries.
	Images []v1.Image
	// Archs overrides the image's io.gpupin.cuda.archs label and its
	// TORCH_CUDA_ARCH_LIST.
	Archs string
}

// PublishOptions say what to publish where.
type PublishOptions struct {
	// Tag is REPO:VERSION; the version is the engine version.
	Tag      string
	Variants []Variant
	// Engine names the engine; default: the image label io.gpupin.engine,
	// else the last element of the repository.
	Engine string
	// Annotations go on the index and on every entry, beside gpupin's.
	Annotations map[string]string
	// DryRun reads and checks everything and pushes nothing.
	DryRun bool
	// AllowPartialPlatforms publishes when a variant lacks a platform another
	// variant has, with a warning; by default that is refused, since nodes on
	// that platform would silently lose the variant.
	AllowPartialPlatforms bool
	// Registry is how registries are reached, for reading the sources,
	// pushing and reading back: the policy nodes resolve and pull by
	// (certs.d hosts, CAs and client certificates, the plain-HTTP rule,
	// credentials). nil means registry.New's defaults: no certs.d, plain
	// HTTP for loopback only, the Docker config's credentials.
	Registry *registry.Policy
	// Jobs bounds concurrent blob transfers; 0 means go-containerregistry's default.
	Jobs int
	// Compression re-encodes every variant's layers (CompressionZstd: once,
	// here, so that every node decompresses faster); CompressionKeep
	// publishes them as they are. The configs, and so the diff IDs, do not
	// change; the children are new manifests.
	Compression Compression
	// BeforeTag, when set, runs once every manifest is pushed by digest
	// (children, alias indexes, the index) and before any tag is written:
	// publish --sign-key signs there, so no tag ever names an unsigned
	// manifest that a node with a required policy would refuse. Its error
	// fails the publish with no tag written.
	BeforeTag func(ctx context.Context, res *Result) error
}

// Entry is one index entry: one variant on one platform.
type Entry struct {
	Variant     string            `json:"variant"`
	Platform    string            `json:"platform"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	MediaType   string            `json:"media_type"`
	Source      string            `json:"source"`
	Annotations map[string]string `json:"annotations"`
}

// Result is what was published (or, in a dry run, what would be).
type Result struct {
	Tag     string  `json:"tag"`
	Digest  string  `json:"digest"`
	Entries []Entry `json:"entries"`
	// Aliases maps each alias tag (VERSION-VARIANT) to its index digest.
	Aliases  map[string]string `json:"aliases"`
	Warnings []string          `json:"warnings,omitempty"`
	DryRun   bool              `json:"dry_run"`
	Verified bool              `json:"verified"`
	// Index is the index manifest, as pushed.
	Index json.RawMessage `json:"index"`
}

// plan is everything publish will write, computed before anything is.
type plan struct {
	// ropts reach registries under the publish's policy: one transport,
	// so reads, pushes and the read-back share connections.
	ropts    []remote.Option
	tag      name.Tag
	version  string
	engine   string
	index    v1.ImageIndex
	aliases  []alias
	entries  []Entry
	children []v1.Image
	warnings []string
	// spool holds re-encoded layers until they are pushed; close removes them.
	spool *spool
}

// close removes what the plan spooled.
func (p *plan) close() {
	if p != nil && p.spool != nil {
		p.spool.close()
	}
}

type alias struct {
	tag     name.Tag
	variant string
	index   v1.ImageIndex
}

// Publish reads every variant, checks it against its own config, and pushes
// the children, the alias indexes and the index by digest, runs
// opts.BeforeTag, then writes the alias tags and the tag last, so a failure
// before that leaves the tag as it was. It then reads it all back.
func Publish(ctx context.Context, opts PublishOptions) (*Result, error) {
	// One policy for the whole publish, so an error can say which hosts
	// its reads and pushes tried.
	opts.Registry = opts.policy()
	p, err := makePlan(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer p.close()
	res, err := p.result(opts.DryRun)
	if err != nil {
		return nil, err
	}
	if opts.DryRun {
		return res, nil
	}
	if err := p.push(ctx, opts, res); err != nil {
		return nil, err
	}
	res.Verified = true
	return res, nil
}

// push writes the plan: by digest first, so children, their blobs and the
// index land without touching any tag (blobs present are skipped after a
// HEAD; blobs in another repository of the same registry are mounted);
// then it reads the index back by digest as nodes would, through the
// registry policy, so a registry nodes cannot read gets no tag; then the
// alias indexes by digest; then opts.BeforeTag (signing); then the alias
// tags, then the tag, then reads it all back.
func (p *plan) push(ctx context.Context, opts PublishOptions, res *Result) error {
	policy := opts.policy()
	explain := func(err error) error { return policy.Explain(err, p.tag.RegistryStr()) }
	pusher, err := remote.NewPusher(p.ropts...)
	if err != nil {
		return fmt.Errorf("publish %s: %w", p.tag, err)
	}
	idxDigest, err := p.index.Digest()
	if err != nil {
		return fmt.Errorf("publish %s: index digest: %w", p.tag, err)
	}
	byDigest := p.tag.Context().Digest(idxDigest.String())
	if err := pusher.Push(ctx, byDigest, p.index); err != nil {
		return explain(fmt.Errorf("publish %s: push variant images (tag not written): %w", p.tag, err))
	}
	if err := p.nodeView(ctx, policy, byDigest.String()); err != nil {
		return fmt.Errorf("publish %s: pushed by digest, but nodes could not read it back (tag not written): %w", p.tag, err)
	}
	for _, a := range p.aliases {
		d, err := a.index.Digest()
		if err != nil {
			return fmt.Errorf("publish %s: alias %s digest: %w", p.tag, a.tag, err)
		}
		if err := pusher.Push(ctx, a.tag.Context().Digest(d.String()), a.index); err != nil {
			return explain(fmt.Errorf("publish %s: alias %s by digest (tag not written): %w", p.tag, a.tag, err))
		}
	}
	if opts.BeforeTag != nil {
		if err := opts.BeforeTag(ctx, res); err != nil {
			return fmt.Errorf("publish %s: pushed by digest, tag not written: %w", p.tag, err)
		}
	}
	for _, a := range p.aliases {
		if err := pusher.Push(ctx, a.tag, a.index); err != nil {
			return explain(fmt.Errorf("publish %s: alias tag %s (tag not written): %w", p.tag, a.tag, err))
		}
	}
	if err := pusher.Push(ctx, p.tag, p.index); err != nil {
		return explain(fmt.Errorf("publish %s: push index: %w", p.tag, err))
	}
	if err := verify(ctx, opts, p); err != nil {
		return explain(fmt.Errorf("publish %s: pushed, but reading it back failed: %w", p.tag, err))
	}
	return nil
}

// policy is the registry policy publish goes through.
func (o PublishOptions) policy() *registry.Policy {
	if o.Registry != nil {
		return o.Registry
	}
	return registry.New(registry.Config{})
}

// remoteOptions make go-containerregistry's remote follow the registry
// policy: its transport (hosts, TLS, the plain-HTTP rule) and credentials.
func remoteOptions(ctx context.Context, opts PublishOptions) []remote.Option {
	policy := opts.policy()
	ro := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(policy.Keychain()),
		remote.WithTransport(policy.Transport(ctx)),
		remote.WithUserAgent("gpupin-publish"),
	}
	if opts.Jobs > 0 {
		ro = append(ro, remote.WithJobs(opts.Jobs))
	}
	return ro
}

func makePlan(ctx context.Context, opts PublishOptions) (*plan, error) {
	sp := &spool{}
	p, err := makePlanSpooled(ctx, opts, sp)
	if err != nil {
		// Nothing will push what was re-encoded so far.
		sp.close()
		return nil, err
	}
	return p, nil
}

func makePlanSpooled(ctx context.Context, opts PublishOptions, sp *spool) (*plan, error) {
	tag, err := checkOptions(opts)
	if err != nil {
		return nil, err
	}
	p := &plan{tag: tag, version: tag.TagStr(), spool: sp, ropts: remoteOptions(ctx, opts)}
	var all []*variantImages
	for _, v := range opts.Variants {
		vi, err := readVariant(ctx, v, p.ropts)
		if err != nil {
			return nil, err
		}
		all = append(all, vi)
	}
	if p.engine, err = pickEngine(opts.Engine, tag, all); err != nil {
		return nil, err
	}
	if err := checkPlatforms(all, opts.AllowPartialPlatforms, &p.warnings); err != nil {
		return nil, err
	}
	for _, vi := range all {
		for _, si := range vi.images {
			// Same config, same diff IDs: the metadata read from it holds.
			if si.img, err = recompress(si.img, opts.Compression, p.spool); err != nil {
				return nil, fmt.Errorf("variant %s (%s): re-encode as %s: %w", vi.name, si.platform, opts.Compression, err)
			}
		}
	}
	if err := p.assemble(all, opts.Annotations); err != nil {
		return nil, err
	}
	return p, nil
}

// checkOptions judges what publish was given before it reads any registry:
// a mistake in the options should not cost a pull of every variant.
func checkOptions(opts PublishOptions) (name.Tag, error) {
	ref, err := parseRef(opts.Tag)
	if err != nil {
		return name.Tag{}, fmt.Errorf("tag: %w", err)
	}
	tag, ok := ref.(name.Tag)
	last := opts.Tag[strings.LastIndex(opts.Tag, "/")+1:]
	if !ok || !strings.Contains(last, ":") || strings.Contains(opts.Tag, "@") {
		return name.Tag{}, fmt.Errorf("tag %q: want REPO:VERSION, e.g. registry.example.com/org/vllm:0.11.0", opts.Tag)
	}
	if len(opts.Variants) == 0 {
		return name.Tag{}, fmt.Errorf("no variants: give at least one (a name and an image reference)")
	}
	for k := range opts.Annotations {
		if strings.HasPrefix(k, "io.gpupin.") {
			return name.Tag{}, fmt.Errorf("annotation %s: io.gpupin.* annotations are filled by publish from the images; set them through labels or options", k)
		}
		if k == "" {
			return name.Tag{}, fmt.Errorf("annotation: empty key")
		}
	}
	seen := map[string]bool{}
	for i, v := range opts.Variants {
		if !images.ValidVariantName(v.Name) {
			return name.Tag{}, fmt.Errorf("variant %d: %q is not a variant name (lower-case letters, digits, '.', '_' or '-', e.g. cu129)", i, v.Name)
		}
		if seen[v.Name] {
			return name.Tag{}, fmt.Errorf("variant %s is given twice", v.Name)
		}
		seen[v.Name] = true
		if v.Ref == "" && len(v.Images) == 0 {
			return name.Tag{}, fmt.Errorf("variant %s: no image reference", v.Name)
		}
		if alias_(tag.TagStr(), v.Name) == "" {
			return name.Tag{}, fmt.Errorf("variant %s: alias tag %s-%s is not a valid tag", v.Name, tag.TagStr(), v.Name)
		}
	}
	if _, err := ParseCompression(string(opts.Compression)); err != nil {
		return name.Tag{}, err
	}
	return tag, nil
}

// assemble builds the index, its aliases and the entries from the variants
// read; all is sorted in place.
func (p *plan) assemble(all []*variantImages, extra map[string]string) error {
	order := platformOrder(all)
	// Lowest CUDA first: the first entry for a platform is what a plain
	// `docker pull` gets, and it should run on the oldest driver. Ties keep
	// the order given.
	sort.SliceStable(all, func(i, j int) bool { return all[i].cuda.Compare(all[j].cuda) < 0 })

	idxAnn := map[string]string{
		images.AnnotationEngine:        p.engine,
		images.AnnotationEngineVersion: p.version,
		AnnotationOCIVersion:           p.version,
	}
	maps.Copy(idxAnn, extra)
	var adds []mutate.IndexAddendum
	for _, vi := range all {
		sort.SliceStable(vi.images, func(i, j int) bool { return order[vi.images[i].platform] < order[vi.images[j].platform] })
		var vadds []mutate.IndexAddendum
		for _, si := range vi.images {
			add, err := p.addChild(vi, si, extra)
			if err != nil {
				return fmt.Errorf("variant %s (%s): %w", vi.name, si.platform, err)
			}
			vadds = append(vadds, add)
		}
		adds = append(adds, vadds...)
		aliasAnn := maps.Clone(idxAnn)
		aliasAnn[images.AnnotationVariant] = vi.name
		at := p.tag.Context().Tag(alias_(p.version, vi.name))
		// An alias is an index too, even for one platform: only an index
		// entry can carry annotations without changing the child's digest.
		aidx, err := newIndex(vadds, aliasAnn)
		if err != nil {
			return fmt.Errorf("alias %s: %w", at, err)
		}
		p.aliases = append(p.aliases, alias{tag: at, variant: vi.name, index: aidx})
	}
	var err error
	if p.index, err = newIndex(adds, idxAnn); err != nil {
		return fmt.Errorf("index: %w", err)
	}
	return nil
}

// addChild records one variant's image for one platform as a child of the
// index, annotated with its metadata.
func (p *plan) addChild(vi *variantImages, si *sourceImage, extra map[string]string) (mutate.IndexAddendum, error) {
	md := si.meta
	md.Engine, md.EngineVersion = p.engine, p.version
	if err := md.Validate(); err != nil {
		return mutate.IndexAddendum{}, err
	}
	ann := md.Annotations()
	ann[AnnotationOCIVersion] = p.version
	maps.Copy(ann, extra)
	img := si.img
	if vi.inMemory {
		// Our own manifest: annotate it too, so the child carries its
		// metadata when pulled by digest.
		img = mutate.Annotations(img, ann).(v1.Image)
	}
	d, err := partial.Descriptor(img)
	if err != nil {
		return mutate.IndexAddendum{}, err
	}
	d.Platform = si.plat
	d.Annotations = ann
	p.children = append(p.children, img)
	p.entries = append(p.entries, Entry{Variant: vi.name, Platform: si.platform, Digest: d.Digest.String(),
		Size: d.Size, MediaType: string(d.MediaType), Source: si.source, Annotations: ann})
	return mutate.IndexAddendum{Add: img, Descriptor: *d}, nil
}

// alias_ returns the alias tag string VERSION-VARIANT, or "" when that is
// not a valid tag (128 characters of [A-Za-z0-9_.-]).
func alias_(version, variant string) string {
	s := version + "-" + variant
	if _, err := name.NewTag("r/x:" + s); err != nil {
		return ""
	}
	return s
}

func newIndex(adds []mutate.IndexAddendum, ann map[string]string) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, adds...), types.OCIImageIndex)
	return newPlainIndex(mutate.Annotations(idx, ann).(v1.ImageIndex))
}

// pickEngine takes the option, else the images' io.gpupin.engine label (all
// must agree), else the repository's last element.
func pickEngine(opt string, tag name.Tag, all []*variantImages) (string, error) {
	label := ""
	for _, vi := range all {
		for _, si := range vi.images {
			e := si.labels[images.AnnotationEngine]
			if e == "" {
				continue
			}
			if opt != "" && e != opt {
				return "", fmt.Errorf("variant %s (%s): image label %s=%q contradicts the engine asked for, %s", vi.name, si.platform, images.AnnotationEngine, e, opt)
			}
			if label != "" && e != label {
				return "", fmt.Errorf("variant %s (%s): image label %s=%q, but another variant says %q", vi.name, si.platform, images.AnnotationEngine, e, label)
			}
			label = e
		}
	}
	switch {
	case opt != "":
		return opt, nil
	case label != "":
		return label, nil
	}
	repo := tag.Context().RepositoryStr()
	return repo[strings.LastIndex(repo, "/")+1:], nil
}

// checkPlatforms refuses (or, when allowed, warns about) a variant that
// lacks a platform another variant has.
func checkPlatforms(all []*variantImages, allowPartial bool, warnings *[]string) error {
	has := map[string][]string{} // platform → variants
	var plats []string
	for _, vi := range all {
		for _, si := range vi.images {
			if _, ok := has[si.platform]; !ok {
				plats = append(plats, si.platform)
			}
			has[si.platform] = append(has[si.platform], vi.name)
		}
	}
	var problems []string
	for _, vi := range all {
		mine := map[string]bool{}
		for _, si := range vi.images {
			mine[si.platform] = true
		}
		for _, pl := range plats {
			if !mine[pl] {
				problems = append(problems, fmt.Sprintf("variant %s has no %s image, which %s has", vi.name, pl, strings.Join(has[pl], ", ")))
			}
		}
	}
	if len(problems) == 0 {
		return nil
	}
	if !allowPartial {
		return fmt.Errorf("%s (nodes on that platform would lose the variant; allow partial platforms to publish anyway)", strings.Join(problems, "; "))
	}
	*warnings = append(*warnings, problems...)
	return nil
}

// platformOrder ranks platforms by first appearance in the variants given.
func platformOrder(all []*variantImages) map[string]int {
	order := map[string]int{}
	for _, vi := range all {
		for _, si := range vi.images {
			if _, ok := order[si.platform]; !ok {
				order[si.platform] = len(order)
			}
		}
	}
	return order
}

func (p *plan) result(dryRun bool) (*Result, error) {
	raw, err := p.index.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("index manifest: %w", err)
	}
	d, err := p.index.Digest()
	if err != nil {
		return nil, fmt.Errorf("index digest: %w", err)
	}
	res := &Result{Tag: p.tag.String(), Digest: d.String(), Entries: p.entries, Aliases: map[string]string{},
		Warnings: p.warnings, DryRun: dryRun, Index: raw}
	for _, a := range p.aliases {
		ad, err := a.index.Digest()
		if err != nil {
			return nil, fmt.Errorf("alias %s digest: %w", a.tag, err)
		}
		res.Aliases[a.tag.String()] = ad.String()
	}
	return res, nil
}

// verify reads the tag, every child and every alias back, and resolves the
// tag as nodes do: every variant must be read from annotations, none derived.
func verify(ctx context.Context, opts PublishOptions, p *plan) error {
	ropts := p.ropts
	want, err := p.index.Digest()
	if err != nil {
		return err
	}
	desc, err := remote.Get(p.tag, ropts...)
	if err != nil {
		return fmt.Errorf("read %s: %w", p.tag, err)
	}
	if desc.Digest != want {
		return fmt.Errorf("%s is %s, want %s (written over concurrently?)", p.tag, desc.Digest, want)
	}
	got, err := desc.ImageIndex()
	if err != nil {
		return fmt.Errorf("read %s: %w", p.tag, err)
	}
	im, err := got.IndexManifest()
	if err != nil {
		return fmt.Errorf("read %s: %w", p.tag, err)
	}
	if len(im.Manifests) != len(p.entries) {
		return fmt.Errorf("%s has %d entries, want %d", p.tag, len(im.Manifests), len(p.entries))
	}
	for i, e := range p.entries {
		m := im.Manifests[i]
		if m.Digest.String() != e.Digest {
			return fmt.Errorf("entry %d is %s, want %s", i, m.Digest, e.Digest)
		}
		for k, v := range e.Annotations {
			if m.Annotations[k] != v {
				return fmt.Errorf("entry %d (%s %s): annotation %s=%q, want %q", i, e.Variant, e.Platform, k, m.Annotations[k], v)
			}
		}
		cd, err := remote.Head(p.tag.Context().Digest(e.Digest), ropts...)
		if err != nil {
			return fmt.Errorf("entry %d (%s %s): child %s: %w", i, e.Variant, e.Platform, e.Digest, err)
		}
		if cd.Size != e.Size {
			return fmt.Errorf("entry %d (%s %s): child is %d bytes, want %d", i, e.Variant, e.Platform, cd.Size, e.Size)
		}
	}
	for _, a := range p.aliases {
		wd, err := a.index.Digest()
		if err != nil {
			return err
		}
		ad, err := remote.Head(a.tag, ropts...)
		if err != nil {
			return fmt.Errorf("alias %s: %w", a.tag, err)
		}
		if ad.Digest != wd {
			return fmt.Errorf("alias %s is %s, want %s", a.tag, ad.Digest, wd)
		}
	}
	// Read back as a node reads it: through containerd's resolver.
	return p.nodeView(ctx, opts.policy(), p.tag.String())
}

// nodeView resolves ref as nodes do, through containerd's resolver under
// the registry policy: every variant must be read from annotations, none
// derived.
func (p *plan) nodeView(ctx context.Context, policy *registry.Policy, ref string) error {
	r := images.Resolver{Remote: policy}
	set, err := r.Resolve(ctx, ref)
	if err != nil {
		return err
	}
	if len(set.Variants) != len(p.entries) {
		return fmt.Errorf("nodes see %d variants, want %d", len(set.Variants), len(p.entries))
	}
	for i, v := range set.Variants {
		if v.Derived || v.Variant != p.entries[i].Variant {
			return fmt.Errorf("nodes see entry %d as %s (derived %v), want %s from annotations", i, v.Variant, v.Derived, p.entries[i].Variant)
		}
	}
	return nil
}

// plainIndex is an index whose image entries carry no artifactType.
// go-containerregistry fills one in from the config's media type; an image
// manifest's entry does not need it, and mirroring tools drop it (skopeo 1.9
// copy --all), which changes the index digest and so breaks anything
// recorded or signed by digest. The children are the inner index's, so a
// push still mounts their blobs.
type plainIndex struct {
	inner v1.ImageIndex
	raw   []byte
	im    *v1.IndexManifest
}

func newPlainIndex(idx v1.ImageIndex) (v1.ImageIndex, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	im = im.DeepCopy()
	for i := range im.Manifests {
		if im.Manifests[i].MediaType.IsImage() {
			im.Manifests[i].ArtifactType = ""
		}
	}
	raw, err := json.Marshal(im)
	if err != nil {
		return nil, err
	}
	return &plainIndex{inner: idx, raw: raw, im: im}, nil
}

func (p *plainIndex) RawManifest() ([]byte, error)                { return p.raw, nil }
func (p *plainIndex) IndexManifest() (*v1.IndexManifest, error)   { return p.im.DeepCopy(), nil }
func (p *plainIndex) Size() (int64, error)                        { return int64(len(p.raw)), nil }
func (p *plainIndex) MediaType() (types.MediaType, error)         { return p.inner.MediaType() }
func (p *plainIndex) Image(h v1.Hash) (v1.Image, error)           { return p.inner.Image(h) }
func (p *plainIndex) ImageIndex(h v1.Hash) (v1.ImageIndex, error) { return p.inner.ImageIndex(h) }
func (p *plainIndex) Digest() (v1.Hash, error) {
	h, _, err := v1.SHA256(bytes.NewReader(p.raw))
	return h, err
}
