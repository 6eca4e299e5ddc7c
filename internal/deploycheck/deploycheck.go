// Package deploycheck holds what gpupin's Kubernetes objects must say to
// agree with the agent: the image `make image` builds, the containerd
// namespace in the environment, NFD's features.d mounted at the host's
// path, wants the agent accepts, and the local-names policies' shape. The
// plain manifests' test (deploy/kubernetes) and the Helm chart's
// (tools/helm) both hold their objects to it, so the two cannot drift.
package deploycheck

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/gpupin/gpupin/agent"
)

// Container is the part of a container spec the checks read.
type Container struct {
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

// Object is the part of a Kubernetes object the checks read.
type Object struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Data map[string]string `json:"data"`
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
				Containers []Container `json:"containers"`
				Volumes    []struct {
					Name     string `json:"name"`
					HostPath struct {
						Path string `json:"path"`
					} `json:"hostPath"`
				} `json:"volumes"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
	// Raw is the document, for checks of their own.
	Raw []byte `json:"-"`
}

// Split returns the YAML documents of a multi-document stream (kubectl's
// and Helm's separators alike), without the empty ones.
func Split(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, err
		}
		if len(m) > 0 {
			docs = append(docs, doc)
		}
	}
}

// Parse reads the objects of a multi-document stream.
func Parse(data []byte) ([]Object, error) {
	docs, err := Split(data)
	if err != nil {
		return nil, err
	}
	out := make([]Object, 0, len(docs))
	for _, doc := range docs {
		var o Object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, err
		}
		o.Raw = doc
		out = append(out, o)
	}
	return out, nil
}

// Agent is what the agent's DaemonSet and ConfigMap must say.
type Agent struct {
	Image       string // the agent's image
	Namespace   string // containerd's, in CONTAINERD_NAMESPACE
	FeaturesDir string // NFD's features.d, "" for none
}

// CheckAgent holds the DaemonSet gpupin-agent and its ConfigMap to a, and
// returns the wants the agent would read (agent.ParseConfig, which the
// agent itself runs on the file).
func CheckAgent(objs []Object, a Agent) (*agent.Config, []error) {
	var ds, cm *Object
	for i := range objs {
		switch {
		case objs[i].Kind == "DaemonSet" && objs[i].Metadata.Name == "gpupin-agent":
			ds = &objs[i]
		case objs[i].Kind == "ConfigMap" && objs[i].Metadata.Name == "gpupin-agent":
			cm = &objs[i]
		}
	}
	if ds == nil || cm == nil {
		return nil, []error{errors.New("no DaemonSet or ConfigMap gpupin-agent")}
	}
	var errs []error
	if len(ds.Spec.Template.Spec.Containers) != 1 {
		return nil, []error{fmt.Errorf("the DaemonSet has %d containers, want 1", len(ds.Spec.Template.Spec.Containers))}
	}
	c := ds.Spec.Template.Spec.Containers[0]
	if c.Image != a.Image {
		errs = append(errs, fmt.Errorf("the DaemonSet runs %s, want %s", c.Image, a.Image))
	}
	args := strings.Join(c.Args, " ")
	if !slices.Contains(c.Args, "agent") || !slices.Contains(c.Args, "--nfd-features-dir="+a.FeaturesDir) {
		errs = append(errs, fmt.Errorf("agent args %q lack agent or --nfd-features-dir=%s", args, a.FeaturesDir))
	}
	// In the environment, so the CLI run in the container (kubectl exec)
	// reads the agent's pins.
	ns := ""
	for _, e := range c.Env {
		if e.Name == "CONTAINERD_NAMESPACE" {
			ns = e.Value
		}
	}
	if ns != a.Namespace || strings.Contains(args, "--namespace") {
		errs = append(errs, fmt.Errorf("CONTAINERD_NAMESPACE=%q, args %q: want the namespace %s in the environment only", ns, args, a.Namespace))
	}
	if a.FeaturesDir != "" {
		mounted := false
		for _, m := range c.VolumeMounts {
			if m.MountPath == a.FeaturesDir {
				for _, v := range ds.Spec.Template.Spec.Volumes {
					mounted = mounted || (v.Name == m.Name && v.HostPath.Path == a.FeaturesDir)
				}
			}
		}
		if !mounted {
			errs = append(errs, fmt.Errorf("the host's %s is not mounted at the same path", a.FeaturesDir))
		}
	}
	cfg, err := agent.ParseConfig([]byte(cm.Data["agent.yaml"]))
	if err != nil {
		errs = append(errs, fmt.Errorf("the ConfigMap's agent.yaml: %w:\n%s", err, cm.Data["agent.yaml"]))
	}
	return cfg, errs
}

// MakeImage is the image `make image` builds and publishes, from the
// IMAGE_REPO and IMAGE_VERSION of the Makefile at path.
func MakeImage(path string) (string, error) {
	makefile, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	repo := regexp.MustCompile(`(?m)^IMAGE_REPO\s*\?=\s*(\S+)`).FindSubmatch(makefile)
	version := regexp.MustCompile(`(?m)^IMAGE_VERSION\s*\?=\s*(\S+)`).FindSubmatch(makefile)
	if repo == nil || version == nil {
		return "", errors.New("the Makefile sets no IMAGE_REPO / IMAGE_VERSION")
	}
	return string(repo[1]) + ":" + string(version[1]), nil
}
