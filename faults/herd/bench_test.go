package herd_test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpupin/gpupin/fetchgate"
	"github.com/gpupin/gpupin/internal/herd"
	"github.com/gpupin/gpupin/provision"
)

// BenchmarkHerd is `make bench-herd` (scripts/bench-herd.sh): for each
// count of GPUPIN_HERD_NODES (default "4 8") a herd of that many nodes on
// the containerd under test, an image of GPUPIN_HERD_MB (default 288) MB
// in 8 random layers, and four cases, each on an image of its own (no
// case finds another's layers): one node alone (gpupin, then `ctr images
// pull`), gpupin on every node at once with the fetch gate (the agent's
// default lease, 30 s), `ctr images pull --hosts-dir` on every node at
// once (the same Spegel mirrors, no gate). Each runs once per upstream
// link of GPUPIN_HERD_LINK (MB/s shared by all the upstream's responses;
// 0: none, where the nodes' shared CPUs bound the rollout; default "0
// 20"). It reports the images taken from upstream and the makespans as
// metrics; with GPUPIN_HERD_BENCH_OUT=F it appends Markdown rows to F (the
// table), F.split (how each node's time splits) and F.api (the gate's API
// requests per node).
func BenchmarkHerd(b *testing.B) {
	mb := 288
	if v := os.Getenv("GPUPIN_HERD_MB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 8 {
			b.Fatalf("GPUPIN_HERD_MB=%q: a number of MB, at least 8", v)
		}
		mb = n
	}
	counts := []int{4, 8}
	if v := os.Getenv("GPUPIN_HERD_NODES"); v != "" {
		counts = nil
		for _, f := range strings.Fields(strings.ReplaceAll(v, ",", " ")) {
			n, err := strconv.Atoi(f)
			if err != nil || n < 2 || n > herd.MaxNodes {
				b.Fatalf("GPUPIN_HERD_NODES=%q: node counts from 2 to %d", v, herd.MaxNodes)
			}
			counts = append(counts, n)
		}
	}
	links := []int{0, 20}
	if v := os.Getenv("GPUPIN_HERD_LINK"); v != "" {
		links = nil
		for _, f := range strings.Fields(strings.ReplaceAll(v, ",", " ")) {
			l, err := strconv.Atoi(f)
			if err != nil || l < 0 {
				b.Fatalf("GPUPIN_HERD_LINK=%q: MB/s, 0 for no limit", v)
			}
			links = append(links, l)
		}
	}
	out := os.Getenv("GPUPIN_HERD_BENCH_OUT")
	for _, n := range counts {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			benchHerd(b, n, int64(mb)<<20/8, links, out)
		})
	}
}

// linkName is a link's column in the tables.
func linkName(mbps int) string {
	if mbps == 0 {
		return "none"
	}
	return fmt.Sprintf("%d MB/s", mbps)
}

func benchHerd(b *testing.B, n int, layer int64, links []int, out string) {
	h := herd.Start(b, herd.Options{Nodes: n, Gate: true, BlobDir: b.TempDir(),
		LeaseDuration: fetchgate.DefaultLeaseDuration, MaxWait: 5 * time.Minute})
	nodes := make([]*herd.BenchNode, n)
	for i, nd := range h.Nodes {
		bn, err := h.Bench(nd)
		if err != nil {
			b.Fatal(err)
		}
		nodes[i] = bn
	}
	write := func(suffix, s string) {
		if out == "" {
			return
		}
		if err := herd.AppendFile(out+suffix, s); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for iter := range b.N {
		for _, mbps := range links {
			b.StopTimer()
			h.Upstream.SetLink(int64(mbps) << 20)
			benchCase(b, h, nodes, fmt.Sprintf("%d-%d", iter, mbps), layer, linkName(mbps), write)
		}
	}
	h.Upstream.SetLink(0)
}

// benchCase is one row set: the four cases, on images of their own (tag
// names them), over the upstream link as set.
func benchCase(b *testing.B, h *herd.Herd, nodes []*herd.BenchNode, tag string, layer int64, link string, write func(suffix, s string)) {
	n := len(nodes)
	version := h.Nodes[0].Daemon.Version
	publish := func(engine string) (string, int64) {
		ref, size, err := h.PublishEngine(fmt.Sprintf("%s%s", engine, tag), 8, layer)
		if err != nil {
			b.Fatal(err)
		}
		return ref, size
	}
	refAlone, size := publish("alone")
	refCtrAlone, _ := publish("ctralone")
	refGpupin, _ := publish("gpupin")
	refCtr, _ := publish("ctr")
	b.StartTimer()
	images := func() float64 { return float64(h.Upstream.BlobBytes()) / float64(size) }

	// One node alone, as configured in the herd (its Spegel as its
	// mirror, the gate, which lets it fetch at once).
	h.Upstream.ResetCount()
	alone := nodes[0].Provision(b.Context(), provision.Want{Ref: refAlone})
	if alone.Status.State != provision.Ready {
		b.Fatalf("alone: %s", alone.Status)
	}
	aloneImages := images()

	h.Upstream.ResetCount()
	ctrAlone, err := herd.CtrPullAll(h.Nodes[:1], refCtrAlone+"-cu129")
	if err != nil {
		b.Fatal(err)
	}
	ctrAloneImages := images()

	h.Upstream.ResetCount()
	res := herd.BenchAll(nodes, provision.Want{Ref: refGpupin})
	gpupinImages := images()
	var makespan time.Duration
	for _, r := range res {
		if r.Status.State != provision.Ready || r.Status.Pinned == "" {
			b.Fatalf("%s: %s, want ready and pinned: %s", r.Node, r.Status.State, r.Status.Detail)
		}
		makespan = max(makespan, r.Total())
		b.Logf("%s: %s in %s (resolve %s, wait %s, fetch %s, unpack %s, probe+pin %s; upstream %v); gate: %q; API: %d %v",
			r.Node, r.Status.State, r.Total().Round(time.Millisecond), r.Resolve().Round(time.Millisecond), r.Wait().Round(time.Millisecond),
			r.Fetch().Round(time.Millisecond), r.Unpack().Round(time.Millisecond), r.Probe().Round(time.Millisecond), r.Upstream, r.Notes, r.APIRequests, r.API)
	}

	h.Upstream.ResetCount()
	durs, err := herd.CtrPullAll(h.Nodes, refCtr+"-cu129")
	if err != nil {
		b.Fatal(err)
	}
	ctrImages := images()
	ctrMakespan := slices.Max(durs)

	unit := func(u string) string { // one metric per link
		if link == "none" {
			return u
		}
		return u + "@" + strings.ReplaceAll(link, " ", "")
	}
	b.ReportMetric(gpupinImages, unit("upstream-images"))
	b.ReportMetric(makespan.Seconds(), unit("makespan-s"))
	b.ReportMetric(alone.Total().Seconds(), unit("alone-s"))
	b.ReportMetric(makespan.Seconds()/alone.Total().Seconds(), unit("x-alone"))
	b.ReportMetric(ctrImages, unit("ctr-upstream-images"))
	b.ReportMetric(ctrMakespan.Seconds(), unit("ctr-makespan-s"))
	b.Logf("containerd %s, %d nodes, %d MB, link %s: alone %.2f images %.1f s; ctr alone %.2f images %.1f s; gpupin %.2f images %.1f s; ctr %.2f images %.1f s",
		version, n, size>>20, link, aloneImages, alone.Total().Seconds(), ctrAloneImages, ctrAlone[0].Seconds(), gpupinImages, makespan.Seconds(), ctrImages, ctrMakespan.Seconds())

	// The table.
	goal := "met"
	if gpupinImages > 1.25 || makespan.Seconds() > 1.5*alone.Total().Seconds() {
		goal = "**missed**"
	}
	row := func(what string, imgs float64, d time.Duration, note string) string {
		return fmt.Sprintf("| %s | %d | %s | %s | %.2f | %.1f s | %.2f | %s |\n", version, n, link, what, imgs, d.Seconds(), d.Seconds()/alone.Total().Seconds(), note)
	}
	write("", row("one node alone, gpupin", aloneImages, alone.Total(), "resolve, pull, unpack, probe, pin; its Spegel first, the gate")+
		row("one node alone, `ctr images pull`", ctrAloneImages, ctrAlone[0], "pull and unpack only")+
		row("**gpupin, every node at once** (fetch gate)", gpupinImages, makespan, "goal (≤ 1.25 images, ≤ 1.5× alone): "+goal)+
		row("`ctr images pull --hosts-dir`, every node at once", ctrImages, ctrMakespan, "same mirrors, no gate; pull and unpack only"))

	// How the time splits: the fetcher, and the others.
	var fetcher *herd.Phases
	var others []herd.Phases
	for i, r := range res {
		if r.Upstream && fetcher == nil {
			fetcher = &res[i]
		} else {
			others = append(others, r)
		}
	}
	var split strings.Builder
	if fetcher != nil {
		fmt.Fprintf(&split, "| %s | %d | %s | fetcher (%s, from upstream) | %s | %s | %s | %s | %s | %s |\n", version, n, link, fetcher.Node,
			secs(fetcher.Resolve()), secs(fetcher.Wait()), secs(fetcher.Fetch()), secs(fetcher.Unpack()), secs(fetcher.Probe()), secs(fetcher.Total()))
	}
	if len(others) > 0 {
		via := "mirror first"
		for _, o := range others {
			if o.Upstream {
				via = "some sent upstream by the gate"
			}
		}
		med := func(f func(herd.Phases) time.Duration) string {
			var ds []time.Duration
			for _, o := range others {
				ds = append(ds, f(o))
			}
			slices.Sort(ds)
			return secs(ds[len(ds)/2]) + " / " + secs(ds[len(ds)-1])
		}
		fmt.Fprintf(&split, "| %s | %d | %s | the other %d (%s), median / max | %s | %s | %s | %s | %s | %s |\n", version, n, link, len(others), via,
			med(herd.Phases.Resolve), med(herd.Phases.Wait), med(herd.Phases.Fetch), med(herd.Phases.Unpack), med(herd.Phases.Probe), med(herd.Phases.Total))
	}
	fmt.Fprintf(&split, "| %s | %d | %s | one node alone (%s) | %s | %s | %s | %s | %s | %s |\n", version, n, link, alone.Node,
		secs(alone.Resolve()), secs(alone.Wait()), secs(alone.Fetch()), secs(alone.Unpack()), secs(alone.Probe()), secs(alone.Total()))
	write(".split", split.String())

	// The gate's API requests, per node, over its own provision.
	var api strings.Builder
	perMin := func(p herd.Phases) float64 { return float64(p.APIRequests) / p.Total().Minutes() }
	if fetcher != nil {
		fmt.Fprintf(&api, "| %s | %d | %s | fetcher | %d | %s | %s | %.0f |\n", version, n, link, fetcher.APIRequests, verbs(fetcher.API), secs(fetcher.Total()), perMin(*fetcher))
	}
	if len(others) > 0 {
		total, minutes := 0, 0.0
		agg := map[string]int{}
		for _, o := range others {
			total += o.APIRequests
			minutes += o.Total().Minutes()
			for k, v := range o.API {
				agg[k] += v
			}
		}
		fmt.Fprintf(&api, "| %s | %d | %s | each of the other %d (mean) | %.1f | %s (all %d) | %s | %.0f |\n", version, n, link, len(others),
			float64(total)/float64(len(others)), verbs(agg), len(others), secs(time.Duration(minutes/float64(len(others))*float64(time.Minute))), float64(total)/minutes)
	}
	write(".api", api.String())
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// verbs is a count by "VERB resource[ status]" as "LIST 2, CREATE (Conflict) 1".
func verbs(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		f := strings.Fields(k)
		s := f[0]
		if len(f) > 2 {
			s += " (" + strings.Join(f[2:], " ") + ")"
		}
		if len(f) > 1 && f[1] != "leases" {
			s += " " + f[1]
		}
		parts = append(parts, fmt.Sprintf("%s %d", s, m[k]))
	}
	return strings.Join(parts, ", ")
}
