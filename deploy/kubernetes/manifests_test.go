// Package kubernetes_test checks the manifests against the names gpupin
// makes: the Deployment's local image name and node label are the ones
// the agent keeps, and the DaemonSet names the image `make image` builds.
package kubernetes_test

import (
	"bytes"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/runtime"
)

type container struct {
	Name            string   `json:"name"`
	Image           string   `json:"image"`
	ImagePullPolicy string   `json:"imagePullPolicy"`
	Args            []string `json:"args"`
	Env             []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"env"`
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
}

type object struct {
	Kind string `json:"kind"`
	Data map[string]string
	Spec struct {
		Template struct {
			Spec struct {
				Affinity struct {
					NodeAffinity struct {
						Required struct {
							Terms []struct {
								Expressions []struct {
									Key      string `json:"key"`
									Operator string `json:"operator"`
								} `json:"matchExpressions"`
							} `json:"nodeSelectorTerms"`
						} `json:"requiredDuringSchedulingIgnoredDuringExecution"`
					} `json:"nodeAffinity"`
				} `json:"affinity"`
				Containers []container `json:"containers"`
				Volumes    []struct {
					Name     string `json:"name"`
					HostPath struct {
						Path string `json:"path"`
					} `json:"hostPath"`
				} `json:"volumes"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

func load(t *testing.T, file string) []object {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []object
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		var o object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		out = append(out, o)
	}
	return out
}

func TestEngineDeploymentUsesTheLocalNameAndTheLabel(t *testing.T) {
	objs := load(t, "engine-deployment.yaml")
	if len(objs) != 1 || objs[0].Kind != "Deployment" {
		t.Fatalf("want one Deployment, got %+v", objs)
	}
	spec := objs[0].Spec.Template.Spec
	local, err := runtime.LocalName(runtime.DefaultLocalPrefix, "vllm:0.11.0")
	if err != nil {
		t.Fatal(err)
	}
	label, _ := agent.FeatureLabel("vllm", "0.11.0", "cu13")
	if len(spec.Containers) != 1 || spec.Containers[0].Image != local || spec.Containers[0].ImagePullPolicy != "Never" {
		t.Fatalf("containers %+v: want image %s, imagePullPolicy Never", spec.Containers, local)
	}
	terms := spec.Affinity.NodeAffinity.Required.Terms
	if len(terms) != 1 || len(terms[0].Expressions) != 1 || terms[0].Expressions[0].Key != label || terms[0].Expressions[0].Operator != "Exists" {
		t.Fatalf("node affinity %+v: want %s Exists", terms, label)
	}
}

func TestDaemonSetNamesTheImageAndMountsTheFeatureDir(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	repo := regexp.MustCompile(`(?m)^IMAGE_REPO\s*\?=\s*(\S+)`).FindSubmatch(mk)
	version := regexp.MustCompile(`(?m)^IMAGE_VERSION\s*\?=\s*(\S+)`).FindSubmatch(mk)
	if repo == nil || version == nil {
		t.Fatal("the Makefile sets no IMAGE_REPO / IMAGE_VERSION")
	}
	var ds *object
	var cm *object
	objs := load(t, "daemonset.yaml")
	for i := range objs {
		switch objs[i].Kind {
		case "DaemonSet":
			ds = &objs[i]
		case "ConfigMap":
			cm = &objs[i]
		}
	}
	if ds == nil || cm == nil {
		t.Fatal("no DaemonSet or ConfigMap")
	}
	c := ds.Spec.Template.Spec.Containers[0]
	if want := string(repo[1]) + ":" + string(version[1]); c.Image != want {
		t.Fatalf("the DaemonSet runs %s; make image builds %s", c.Image, want)
	}
	args := strings.Join(c.Args, " ")
	for _, a := range []string{"agent", "--nfd-features-dir=" + agent.DefaultNFDFeaturesDir} {
		if !strings.Contains(args, a) {
			t.Errorf("agent args %q lack %s", args, a)
		}
	}
	// The namespace kubelet and a peer-to-peer mirror read, in the
	// environment, so the CLI run in the container (kubectl exec) reads
	// the agent's pins.
	ns := ""
	for _, e := range c.Env {
		if e.Name == "CONTAINERD_NAMESPACE" {
			ns = e.Value
		}
	}
	if ns != runtime.CRINamespace || strings.Contains(args, "--namespace") {
		t.Errorf("CONTAINERD_NAMESPACE=%q, args %q: want the namespace %s in the environment only", ns, args, runtime.CRINamespace)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.MountPath == agent.DefaultNFDFeaturesDir {
			for _, v := range ds.Spec.Template.Spec.Volumes {
				mounted = mounted || (v.Name == m.Name && v.HostPath.Path == agent.DefaultNFDFeaturesDir)
			}
		}
	}
	if !mounted {
		t.Errorf("the host's %s is not mounted at the same path", agent.DefaultNFDFeaturesDir)
	}
	if !strings.Contains(cm.Data["agent.yaml"], "version: 0.11.0") {
		t.Errorf("the wants do not name vllm's version: %s", cm.Data["agent.yaml"])
	}
}

// The systemd unit's namespace is the CLI's default, and a file an
// operator edits (and sources in the shell) can change both.
func TestSystemdUnitNamespace(t *testing.T) {
	data, err := os.ReadFile("../systemd/gpupin-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(data)
	env := strings.Index(unit, "Environment=CONTAINERD_NAMESPACE=gpupin\n")
	file := strings.Index(unit, "EnvironmentFile=-/etc/gpupin/environment\n")
	// systemd: an EnvironmentFile's settings win over Environment=.
	if env < 0 || file < 0 {
		t.Fatalf("the unit sets CONTAINERD_NAMESPACE=gpupin at %d, reads /etc/gpupin/environment at %d:\n%s", env, file, unit)
	}
	if !strings.Contains(unit, "CONTAINERD_NAMESPACE=k8s.io") {
		t.Error("the unit does not say which namespace kubelet and a mirror read")
	}
}

// policy is a ValidatingAdmissionPolicy or its binding, the fields the
// guard rests on.
type policy struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		FailurePolicy    string   `json:"failurePolicy"`
		PolicyName       string   `json:"policyName"`
		ValidationAction []string `json:"validationActions"`
		MatchConstraints struct {
			ResourceRules []struct {
				APIGroups   []string `json:"apiGroups"`
				APIVersions []string `json:"apiVersions"`
				Operations  []string `json:"operations"`
				Resources   []string `json:"resources"`
			} `json:"resourceRules"`
		} `json:"matchConstraints"`
		Variables []struct {
			Name       string `json:"name"`
			Expression string `json:"expression"`
		} `json:"variables"`
		Validations []struct {
			Expression        string `json:"expression"`
			MessageExpression string `json:"messageExpression"`
			Reason            string `json:"reason"`
		} `json:"validations"`
	} `json:"spec"`
}

// The cluster-side guard of the local names: a policy for pods and one
// for pod templates, each bound with Deny, matching what they must, and
// testing the prefix gpupin writes. (Its CEL is evaluated by a real API
// server in the fleet tests; no CEL library is a dependency here.)
func TestLocalNamesPolicy(t *testing.T) {
	data, err := os.ReadFile("local-names-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	policies := map[string]policy{}
	bindings := map[string]policy{}
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		var p policy
		if err := yaml.UnmarshalStrict(doc, &p); err != nil {
			t.Fatalf("local-names-policy.yaml: %v", err)
		}
		if p.APIVersion != "admissionregistration.k8s.io/v1" {
			t.Errorf("%s %s: apiVersion %s", p.Kind, p.Metadata.Name, p.APIVersion)
		}
		switch p.Kind {
		case "ValidatingAdmissionPolicy":
			policies[p.Metadata.Name] = p
		case "ValidatingAdmissionPolicyBinding":
			bindings[p.Spec.PolicyName] = p
		default:
			t.Errorf("unexpected %s", p.Kind)
		}
	}
	prefix := "'" + runtime.DefaultLocalPrefix + "/'"
	for _, tc := range []struct {
		name      string
		resources []string
		spec      string // where the pod spec is
	}{
		{"gpupin-local-names-pods", []string{"pods"}, "object.spec."},
		{"gpupin-local-names-templates", []string{"deployments", "daemonsets", "statefulsets", "replicasets", "jobs"}, "object.spec.template.spec."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := policies[tc.name]
			if !ok {
				t.Fatalf("no policy %s", tc.name)
			}
			if b, ok := bindings[tc.name]; !ok || len(b.Spec.ValidationAction) != 1 || b.Spec.ValidationAction[0] != "Deny" {
				t.Errorf("binding of %s: %+v; want validationActions [Deny]", tc.name, b.Spec)
			}
			if p.Spec.FailurePolicy != "Fail" {
				t.Errorf("failurePolicy %q, want Fail", p.Spec.FailurePolicy)
			}
			var matched []string
			for _, r := range p.Spec.MatchConstraints.ResourceRules {
				if !slices.Contains(r.Operations, "CREATE") || !slices.Contains(r.Operations, "UPDATE") {
					t.Errorf("rule %+v: want CREATE and UPDATE", r)
				}
				matched = append(matched, r.Resources...)
			}
			slices.Sort(matched)
			want := slices.Clone(tc.resources)
			slices.Sort(want)
			if !slices.Equal(matched, want) {
				t.Errorf("matches %v, want %v", matched, want)
			}
			if len(p.Spec.Variables) != 1 || len(p.Spec.Validations) != 1 {
				t.Fatalf("variables %+v, validations %+v: want one of each", p.Spec.Variables, p.Spec.Validations)
			}
			v := p.Spec.Variables[0]
			for _, s := range []string{tc.spec + "containers", tc.spec + "initContainers", "startsWith(" + prefix + ")", "'Never'", "imagePullPolicy"} {
				if !strings.Contains(v.Expression, s) {
					t.Errorf("variable %s lacks %q: %s", v.Name, s, v.Expression)
				}
			}
			val := p.Spec.Validations[0]
			if !strings.Contains(val.Expression, "variables."+v.Name) || !strings.Contains(val.MessageExpression, "imagePullPolicy: Never") || val.Reason != "Invalid" {
				t.Errorf("validation %+v", val)
			}
			for _, e := range []string{v.Expression, val.Expression, val.MessageExpression} {
				if strings.Count(e, "(") != strings.Count(e, ")") || strings.Count(e, "'")%2 != strings.Count(e, `\'`)%2 {
					t.Errorf("unbalanced expression: %s", e)
				}
			}
		})
	}
}
