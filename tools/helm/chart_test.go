package helm_test

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/deploycheck"
	"github.com/gpupin/gpupin/provision"
)

const (
	chartDir = "../../deploy/helm/gpupin"
	plainDir = "../../deploy/kubernetes"
	// The namespace the plain manifests use, and the docs install into.
	namespace = "gpupin-system"
)

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// render is `helm template gpupin deploy/helm/gpupin -n NS -f values`:
// Helm's install action in client-side dry-run, as the helm command runs
// it, schema validation included.
func render(t *testing.T, ns, values string) (*release.Release, error) {
	t.Helper()
	return renderChart(t, loadChart(t), ns, values)
}

// renderChart is render of ch.
func renderChart(t *testing.T, ch *chart.Chart, ns, values string) (*release.Release, error) {
	t.Helper()
	vals := map[string]any{}
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatal(err)
	}
	in := action.NewInstall(action.NewConfiguration())
	in.DryRunStrategy = action.DryRunClient
	in.ReleaseName = "gpupin"
	in.Namespace = ns
	in.Replace = true
	// The release the API-server tests run; Helm's test default is older
	// than the chart's kubeVersion.
	kv, err := common.ParseKubeVersion("v1.37.2")
	if err != nil {
		t.Fatal(err)
	}
	in.KubeVersion = kv
	r, err := in.Run(ch, vals)
	if err != nil {
		return nil, err
	}
	rel, ok := r.(*release.Release)
	if !ok {
		t.Fatalf("release of type %T", r)
	}
	return rel, nil
}

func mustRender(t *testing.T, ns, values string) (*release.Release, []deploycheck.Object) {
	t.Helper()
	rel, err := render(t, ns, values)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploycheck.Parse([]byte(rel.Manifest))
	if err != nil {
		t.Fatalf("the render is no YAML: %v\n%s", err, rel.Manifest)
	}
	return rel, objs
}

// helmLabels are the chart's own labels, which the plain manifests lack.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/part-of"}

// normalized reads objects by kind/namespace/name, without Namespace
// objects (Helm makes the release's: --create-namespace), without the
// chart's labels, and with the agent's file parsed (its text is toYaml's,
// not the hand-written one).
func normalized(t *testing.T, data []byte) map[string]map[string]any {
	t.Helper()
	docs, err := deploycheck.Split(data)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for _, doc := range docs {
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatal(err)
		}
		if o["kind"] == "Namespace" {
			continue
		}
		md, _ := o["metadata"].(map[string]any)
		if labels, ok := md["labels"].(map[string]any); ok {
			for _, l := range helmLabels {
				delete(labels, l)
			}
			if len(labels) == 0 {
				delete(md, "labels")
			}
		}
		if data, ok := o["data"].(map[string]any); ok && o["kind"] == "ConfigMap" {
			if s, ok := data["agent.yaml"].(string); ok {
				var cfg any
				if err := yaml.Unmarshal([]byte(s), &cfg); err != nil {
					t.Fatal(err)
				}
				data["agent.yaml"] = cfg
			}
		}
		key := fmt.Sprintf("%s %v/%v", o["kind"], md["namespace"], md["name"])
		if _, dup := out[key]; dup {
			t.Errorf("%s twice", key)
		}
		out[key] = o
	}
	return out
}

// diff lists where a and b differ, by path.
func diff(path string, a, b any) []string {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		var keys []string
		for k := range av {
			keys = append(keys, k)
		}
		for k := range bv {
			if _, ok := av[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		var out []string
		for _, k := range keys {
			out = append(out, diff(path+"."+k, av[k], bv[k])...)
		}
		return out
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			break
		}
		var out []string
		for i := range av {
			out = append(out, diff(fmt.Sprintf("%s[%d]", path, i), av[i], bv[i])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	return []string{fmt.Sprintf("%s: plain %v, chart %v", path, a, b)}
}

// makeImage is the image `make image` publishes.
func makeImage(t *testing.T) string {
	t.Helper()
	image, err := deploycheck.MakeImage("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	return image
}

// The chart's defaults render the objects of daemonset.yaml,
// fleet-rbac.yaml and local-names-policy.yaml, field for field, and pass
// the checks the plain manifests' test makes.
func TestDefaultsRenderThePlainManifests(t *testing.T) {
	rel, objs := mustRender(t, namespace, "")
	var plain []byte
	for _, f := range []string{"daemonset.yaml", "fleet-rbac.yaml", "local-names-policy.yaml"} {
		data, err := os.ReadFile(plainDir + "/" + f)
		if err != nil {
			t.Fatal(err)
		}
		plain = append(append(plain, data...), "\n---\n"...)
	}
	want := normalized(t, plain)
	got := normalized(t, []byte(rel.Manifest))
	for key, w := range want {
		g, ok := got[key]
		if !ok {
			t.Errorf("%s: in the plain manifests, not rendered", key)
			continue
		}
		for _, d := range diff(key, w, g) {
			t.Error(d)
		}
	}
	for key := range got {
		if _, ok := want[key]; !ok {
			t.Errorf("%s: rendered, not in the plain manifests", key)
		}
	}
	if len(want) < 15 {
		t.Errorf("only %d objects compared", len(want))
	}

	cfg, errs := deploycheck.CheckAgent(objs, deploycheck.Agent{Image: makeImage(t), Namespace: containerd.CRINamespace, FeaturesDir: agent.DefaultNFDFeaturesDir})
	for _, err := range errs {
		t.Error(err)
	}
	if cfg == nil || len(cfg.Wants) != 2 || cfg.Wants[0].Version != "0.11.0" {
		t.Errorf("wants %+v", cfg)
	}
	docs, err := deploycheck.Split([]byte(rel.Manifest))
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range deploycheck.CheckLocalNamesPolicy(docs, containerd.DefaultLocalPrefix) {
		t.Error(err)
	}
	if !strings.Contains(rel.Info.Notes, "exec ds/gpupin-agent -- gpupin pins") || !strings.Contains(rel.Info.Notes, "gpupin.io/vllm-0.11.0") {
		t.Errorf("NOTES.txt:\n%s", rel.Info.Notes)
	}
}

// helm lint --strict passes: no error and no warning, with the defaults
// and with the fleet layer off.
func TestLint(t *testing.T) {
	kv, err := common.ParseKubeVersion("v1.37.2")
	if err != nil {
		t.Fatal(err)
	}
	for _, values := range []string{"", "fleet: {enabled: false}\nmetrics: {serviceMonitor: {enabled: true}}"} {
		vals := map[string]any{}
		if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
			t.Fatal(err)
		}
		l := action.NewLint()
		l.Strict = true
		l.Namespace = namespace
		l.KubeVersion = kv
		res := l.Run([]string{chartDir}, vals)
		if res.TotalChartsLinted != 1 {
			t.Errorf("%d charts linted", res.TotalChartsLinted)
		}
		for _, err := range res.Errors {
			t.Errorf("values %q: %v", values, err)
		}
		for _, m := range res.Messages {
			t.Log(m)
		}
	}
}

// crds/ is deploy/kubernetes/fleet-crds.yaml, byte for byte: Helm installs
// it before the templates, and the two copies must never drift.
func TestCRDsAreThePlainOnes(t *testing.T) {
	plain, err := os.ReadFile(plainDir + "/fleet-crds.yaml")
	if err != nil {
		t.Fatal(err)
	}
	crds := loadChart(t).CRDObjects()
	if len(crds) != 1 || crds[0].Name != "crds/fleet-crds.yaml" {
		t.Fatalf("CRD files %+v, want crds/fleet-crds.yaml only", crds)
	}
	if !bytes.Equal(crds[0].File.Data, plain) {
		t.Error("deploy/helm/gpupin/crds/fleet-crds.yaml differs from deploy/kubernetes/fleet-crds.yaml: cp the latter over the former")
	}
}

// find returns the rendered object of that kind and name as a map.
func find(objs []deploycheck.Object, kind, name string) map[string]any {
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name {
			var m map[string]any
			if err := yaml.Unmarshal(o.Raw, &m); err != nil {
				panic(err)
			}
			return m
		}
	}
	return nil
}

// at walks a path of map keys and list indexes.
func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func podSpec(objs []deploycheck.Object) any {
	return at(find(objs, "DaemonSet", "gpupin-agent"), "spec", "template", "spec")
}

func agentContainer(objs []deploycheck.Object) any { return at(podSpec(objs), "containers", 0) }

func env(objs []deploycheck.Object, name string) (string, bool) {
	l, _ := at(agentContainer(objs), "env").([]any)
	for _, e := range l {
		if at(e, "name") == name {
			v, _ := at(e, "value").(string)
			return v, true
		}
	}
	return "", false
}

func args(objs []deploycheck.Object) []string {
	l, _ := at(agentContainer(objs), "args").([]any)
	var out []string
	for _, a := range l {
		out = append(out, fmt.Sprint(a))
	}
	return out
}

func fromYAML(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Values flow where they must: each case renders the chart with a values
// file, holds the agent's objects to the shared checks with what the
// values say, and checks what it changed.
func TestValues(t *testing.T) {
	image := makeImage(t)
	def := deploycheck.Agent{Image: image, Namespace: containerd.CRINamespace, FeaturesDir: agent.DefaultNFDFeaturesDir}
	cases := []struct {
		name   string
		ns     string
		values string
		agent  func(a *deploycheck.Agent)
		check  func(t *testing.T, objs []deploycheck.Object, cfg *agent.Config)
	}{
		{
			name: "wants and overrides",
			values: `
wants:
  - {engine: llamacpp, version: b6000, ref: registry.example/org/llama:b6000, override: cu129}
  - {ref: registry.example/org/trt:1.0}
overrides: {vllm: none, sglang: cu13}
`,
			check: func(t *testing.T, objs []deploycheck.Object, cfg *agent.Config) {
				want := []provision.Want{{Engine: "llamacpp", Version: "b6000", Ref: "registry.example/org/llama:b6000", Override: "cu129"}, {Ref: "registry.example/org/trt:1.0"}}
				if !reflect.DeepEqual(cfg.Wants, want) || !reflect.DeepEqual(cfg.Overrides, map[string]string{"vllm": "none", "sglang": "cu13"}) {
					t.Errorf("the agent reads %+v", cfg)
				}
			},
		},
		{
			name: "no wants",
			values: `
wants: []
`,
			check: func(t *testing.T, objs []deploycheck.Object, cfg *agent.Config) {
				if len(cfg.Wants) != 0 || len(cfg.Overrides) != 0 {
					t.Errorf("the agent reads %+v", cfg)
				}
			},
		},
		{
			name: "containerd namespace, socket and root (k3s)",
			values: `
containerd:
  namespace: gpupin
  socket: /run/k3s/containerd/containerd.sock
  root: /var/lib/rancher/k3s/agent/containerd
`,
			agent: func(a *deploycheck.Agent) { a.Namespace = "gpupin" },
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				if v, _ := env(objs, "CONTAINERD_ADDRESS"); v != "/run/k3s/containerd/containerd.sock" {
					t.Errorf("CONTAINERD_ADDRESS=%q", v)
				}
				vols := at(podSpec(objs), "volumes")
				mounts := at(agentContainer(objs), "volumeMounts")
				// The socket's directory: a restarted containerd's new
				// socket shows in it.
				for _, p := range []string{"/run/k3s/containerd", "/var/lib/rancher/k3s/agent/containerd"} {
					if !strings.Contains(fmt.Sprint(vols), "path:"+p) || !strings.Contains(fmt.Sprint(mounts), "mountPath:"+p) {
						t.Errorf("%s not mounted at the same path: %v %v", p, vols, mounts)
					}
				}
				if strings.Contains(fmt.Sprint(vols), "/var/lib/containerd") {
					t.Errorf("the default root still mounted: %v", vols)
				}
			},
		},
		{
			name: "host network, SIMULATED node facts",
			values: `
hostNetwork: true
simulated: {nodeFile: /etc/gpupin-sim/node.json}
`,
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				spec := podSpec(objs)
				if at(spec, "hostNetwork") != true || at(spec, "dnsPolicy") != "ClusterFirstWithHostNet" {
					t.Errorf("hostNetwork %v, dnsPolicy %v", at(spec, "hostNetwork"), at(spec, "dnsPolicy"))
				}
				if !slices.Contains(args(objs), "--node=/etc/gpupin-sim/node.json") {
					t.Errorf("args %v: no --node", args(objs))
				}
				vols, mounts := fmt.Sprint(at(spec, "volumes")), fmt.Sprint(at(agentContainer(objs), "volumeMounts"))
				if !strings.Contains(vols, "path:/etc/gpupin-sim/node.json type:File") || !strings.Contains(mounts, "mountPath:/etc/gpupin-sim/node.json") {
					t.Errorf("the node file not mounted: %v %v", vols, mounts)
				}
			},
		},
		{
			name: "fetch policy (one fetch per image)",
			values: `
fleet: {fetch: {concurrency: 3, leaseDuration: 1m, maxWait: 30m}}
`,
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				for _, a := range []string{"--fetch-concurrency=3", "--fetch-lease=1m", "--fetch-max-wait=30m"} {
					if !slices.Contains(args(objs), a) {
						t.Errorf("args %v: no %s", args(objs), a)
					}
				}
			},
		},
		{
			name: "fetch coordination off",
			values: `
fleet: {fetch: {concurrency: 0}}
`,
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				var fetch []string
				for _, a := range args(objs) {
					if strings.HasPrefix(a, "--fetch-") {
						fetch = append(fetch, a)
					}
				}
				// The defaults (30s, 15m) are the agent's own: not repeated.
				if !slices.Equal(fetch, []string{"--fetch-concurrency=0"}) {
					t.Errorf("fetch args %v, want only --fetch-concurrency=0", fetch)
				}
			},
		},
		{
			name: "canary policy",
			values: `
fleet: {canary: {leaseDuration: 1m, maxWait: 30m}}
`,
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				for _, a := range []string{"--canary-lease=1m", "--canary-max-wait=30m"} {
					if !slices.Contains(args(objs), a) {
						t.Errorf("args %v: no %s", args(objs), a)
					}
				}
				if slices.Contains(args(objs), "--canary=false") {
					t.Errorf("args %v: canary turned off", args(objs))
				}
			},
		},
		{
			name: "canary off",
			values: `
fleet: {canary: {enabled: false, leaseDuration: 1m}}
`,
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				var got []string
				for _, a := range args(objs) {
					if strings.HasPrefix(a, "--canary") {
						got = append(got, a)
					}
				}
				if !slices.Equal(got, []string{"--canary=false"}) {
					t.Errorf("canary args %v, want only --canary=false", got)
				}
			},
		},
		{
			name: "node selection and tolerations",
			values: `
nodeSelector:
  nvidia.com/gpu.present: null
  gpupin.io/pool: inference
tolerations:
  - {key: dedicated, operator: Equal, value: gpu, effect: NoExecute}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions: [{key: nvidia.com/gpu.product, operator: NotIn, values: [Tesla-K80]}]
`,
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				spec := podSpec(objs)
				if got := at(spec, "nodeSelector"); !reflect.DeepEqual(got, fromYAML(t, `{gpupin.io/pool: inference}`)) {
					t.Errorf("nodeSelector %v", got)
				}
				if got := at(spec, "tolerations"); !reflect.DeepEqual(got, fromYAML(t, `[{key: dedicated, operator: Equal, value: gpu, effect: NoExecute}]`)) {
					t.Errorf("tolerations %v", got)
				}
				if got := at(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms", 0, "matchExpressions", 0, "key"); got != "nvidia.com/gpu.product" {
					t.Errorf("affinity %v", at(spec, "affinity"))
				}
			},
		},
		{
			name: "resources",
			values: `
resources:
  requests: {cpu: 200m, memory: 128Mi}
  limits: {memory: 1Gi}
`,
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				if got := at(agentContainer(objs), "resources"); !reflect.DeepEqual(got, fromYAML(t, `{requests: {cpu: 200m, memory: 128Mi}, limits: {memory: 1Gi}}`)) {
					t.Errorf("resources %v", got)
				}
			},
		},
		{
			name:   "image by digest",
			values: `image: {digest: "sha256:` + strings.Repeat("ab", 32) + `"}`,
			agent: func(a *deploycheck.Agent) {
				a.Image = strings.Split(image, ":")[0] + "@sha256:" + strings.Repeat("ab", 32)
			},
		},
		{
			name:   "NFD features.d elsewhere",
			values: `nfd: {featuresDir: /var/lib/nfd/features.d}`,
			agent:  func(a *deploycheck.Agent) { a.FeaturesDir = "/var/lib/nfd/features.d" },
		},
		{
			name:   "NFD off",
			values: `nfd: {featuresDir: ""}`,
			agent:  func(a *deploycheck.Agent) { a.FeaturesDir = "" },
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				if s := fmt.Sprint(podSpec(objs)); strings.Contains(s, "features.d") {
					t.Errorf("features.d still mounted: %s", s)
				}
			},
		},
		{
			name: "another namespace",
			ns:   "gpu-ops",
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				if !slices.Contains(args(objs), "--wants-configmap=gpu-ops/gpupin-agent") {
					t.Errorf("args %v", args(objs))
				}
				for _, kind := range []string{"ConfigMap", "ServiceAccount", "DaemonSet"} {
					if ns := at(find(objs, kind, "gpupin-agent"), "metadata", "namespace"); ns != "gpu-ops" {
						t.Errorf("%s in namespace %v", kind, ns)
					}
				}
				if s := at(find(objs, "ClusterRoleBinding", "gpupin-agent"), "subjects", 0, "namespace"); s != "gpu-ops" {
					t.Errorf("ClusterRoleBinding's ServiceAccount in %v", s)
				}
				cond := fmt.Sprint(at(find(objs, "ValidatingAdmissionPolicy", "gpupin-agent-own-node"), "spec", "matchConditions", 0, "expression"))
				if !strings.Contains(cond, "'system:serviceaccount:gpu-ops:gpupin-agent'") {
					t.Errorf("the own-node policy matches %s", cond)
				}
				// Events about Nodes stay in default.
				if find(objs, "Role", "gpupin-agent-events") == nil || at(find(objs, "Role", "gpupin-agent-events"), "metadata", "namespace") != "default" {
					t.Error("the events Role is not in namespace default")
				}
			},
		},
		{
			name:   "fleet off",
			values: `fleet: {enabled: false}`,
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				for _, o := range objs {
					if o.Kind != "DaemonSet" && o.Kind != "ConfigMap" && !strings.HasPrefix(o.Metadata.Name, "gpupin-local-names") {
						t.Errorf("%s %s rendered without the fleet layer", o.Kind, o.Metadata.Name)
					}
				}
				if _, ok := env(objs, "NODE_NAME"); ok {
					t.Error("NODE_NAME set")
				}
				if strings.Contains(strings.Join(args(objs), " "), "--wants-configmap") {
					t.Errorf("args %v", args(objs))
				}
				if at(podSpec(objs), "automountServiceAccountToken") != false || at(podSpec(objs), "serviceAccountName") != nil {
					t.Errorf("pod spec %v", podSpec(objs))
				}
			},
		},
		{
			name:   "another local prefix",
			values: `localNames: {prefix: node.local}`,
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				var docs [][]byte
				for _, o := range objs {
					docs = append(docs, o.Raw)
				}
				for _, err := range deploycheck.CheckLocalNamesPolicy(docs, "node.local") {
					t.Error(err)
				}
				a := args(objs)
				if i := slices.Index(a, "--local-prefix=node.local"); i < 0 || i > slices.Index(a, "agent") {
					t.Errorf("args %v: want the global --local-prefix=node.local", a)
				}
			},
		},
		{
			name:   "local-names policy off",
			values: `localNames: {policy: false}`,
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				for _, o := range objs {
					if strings.HasPrefix(o.Metadata.Name, "gpupin-local-names") {
						t.Errorf("%s %s rendered", o.Kind, o.Metadata.Name)
					}
				}
			},
		},
		{
			name: "ServiceMonitor",
			values: `
metrics:
  port: 9500
  serviceMonitor: {enabled: true, interval: 15s, labels: {release: prometheus}}
`,
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				sm := find(objs, "ServiceMonitor", "gpupin-agent")
				svc := find(objs, "Service", "gpupin-agent-metrics")
				if sm == nil || svc == nil {
					t.Fatal("no ServiceMonitor or Service")
				}
				if at(sm, "apiVersion") != "monitoring.coreos.com/v1" || at(sm, "metadata", "labels", "release") != "prometheus" ||
					at(sm, "spec", "endpoints", 0, "port") != "metrics" || at(sm, "spec", "endpoints", 0, "interval") != "15s" {
					t.Errorf("ServiceMonitor %v", sm)
				}
				if at(svc, "spec", "ports", 0, "port") != float64(9500) || !reflect.DeepEqual(at(svc, "spec", "selector"), at(find(objs, "DaemonSet", "gpupin-agent"), "spec", "selector", "matchLabels")) {
					t.Errorf("Service %v", svc)
				}
				if ann := at(find(objs, "DaemonSet", "gpupin-agent"), "spec", "template", "metadata", "annotations", "prometheus.io/port"); ann != "9500" {
					t.Errorf("scrape port annotation %v", ann)
				}
				if !slices.Contains(args(objs), "--metrics-address=0.0.0.0:9500") {
					t.Errorf("args %v", args(objs))
				}
			},
		},
		{
			name:   "metrics off",
			values: `metrics: {port: 0}`,
			check: func(t *testing.T, objs []deploycheck.Object, _ *agent.Config) {
				if a := at(find(objs, "DaemonSet", "gpupin-agent"), "spec", "template", "metadata", "annotations"); a != nil {
					t.Errorf("annotations %v", a)
				}
				if strings.Contains(strings.Join(args(objs), " "), "--metrics-address") || at(agentContainer(objs), "ports") != nil {
					t.Errorf("metrics still served: %v", agentContainer(objs))
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.ns
			if ns == "" {
				ns = namespace
			}
			_, objs := mustRender(t, ns, tc.values)
			a := def
			if tc.agent != nil {
				tc.agent(&a)
			}
			cfg, errs := deploycheck.CheckAgent(objs, a)
			for _, err := range errs {
				t.Error(err)
			}
			if cfg == nil {
				t.FailNow()
			}
			if tc.check != nil {
				tc.check(t, objs, cfg)
			}
		})
	}
}

// values.schema.json refuses, at render time, what would make a broken
// DaemonSet or an agent that refuses its file, naming the value.
func TestSchemaRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		want         []string // in the error
	}{
		{"want without ref", `wants: [{engine: vllm, version: 0.11.0}]`, []string{"/wants/0", "ref"}},
		{"misspelt want key", `wants: [{engine: vllm, ref: r/v:1, overide: cu13}]`, []string{"/wants/0", "overide"}},
		{"override a YAML boolean", `overrides: {vllm: off}`, []string{"/overrides/vllm", "string"}},
		{"engine name", `overrides: {VLLM: none}`, []string{"/overrides", "VLLM"}},
		{"misspelt top-level key", `nodeSelecter: {a: b}`, []string{"nodeSelecter"}},
		{"digest", `image: {digest: latest}`, []string{"/image/digest"}},
		{"relative socket", `containerd: {socket: containerd.sock}`, []string{"/containerd/socket"}},
		{"port as a string", `metrics: {port: "9464"}`, []string{"/metrics/port"}},
		{"fetch wait not a duration", `fleet: {fetch: {maxWait: soon}}`, []string{"/fleet/fetch/maxWait"}},
		{"negative fetch concurrency", `fleet: {fetch: {concurrency: -1}}`, []string{"/fleet/fetch/concurrency"}},
		{"toleration effect", `tolerations: [{key: a, operator: Exists, effect: NoSchedul}]`, []string{"/tolerations/0/effect"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, namespace, tc.values)
			if err == nil {
				t.Fatal("rendered")
			}
			msg := err.Error()
			t.Log(msg)
			if !strings.Contains(msg, "schema") {
				t.Errorf("refused, but not by the schema: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("the error does not name %q: %v", w, err)
				}
			}
		})
	}
}
