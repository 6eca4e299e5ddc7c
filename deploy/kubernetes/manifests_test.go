// Package kubernetes_test checks the manifests against the names gpupin
// makes: the Deployment's local image name and node label are the ones
// the agent keeps, and the DaemonSet names the image `make image` builds.
package kubernetes_test

import (
	"bytes"
	"os"
	"regexp"
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
	VolumeMounts    []struct {
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
	for _, a := range []string{"--namespace=k8s.io", "agent", "--nfd-features-dir=" + agent.DefaultNFDFeaturesDir} {
		if !strings.Contains(args, a) {
			t.Errorf("agent args %q lack %s", args, a)
		}
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
