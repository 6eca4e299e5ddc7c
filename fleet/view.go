package fleet

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ClientConfig finds a kubeconfig as kubectl does (explicit path, else
// $KUBECONFIG, else ~/.kube/config), in-cluster first when inCluster and
// no path is given: the agent's order.
func ClientConfig(path string, inCluster bool) (*rest.Config, error) {
	if path == "" && inCluster {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// ListNodes reads every GPUPinNode.
func ListNodes(ctx context.Context, dyn dynamic.Interface) ([]GPUPinNode, error) {
	l, err := dyn.Resource(GPUPinNodes).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list GPUPinNodes: %w", err)
	}
	out := make([]GPUPinNode, 0, len(l.Items))
	for i := range l.Items {
		var n GPUPinNode
		if err := fromUnstructured(&l.Items[i], &n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ListOverrides reads every EngineOverride.
func ListOverrides(ctx context.Context, dyn dynamic.Interface) ([]EngineOverride, error) {
	l, err := dyn.Resource(EngineOverrides).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list EngineOverrides: %w", err)
	}
	out := make([]EngineOverride, 0, len(l.Items))
	for i := range l.Items {
		var o EngineOverride
		if err := fromUnstructured(&l.Items[i], &o); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// NodeChoices resolves the cluster's overrides for one Node by name, as
// its agent would: `gpupin plan --node-name` shows where a choice comes
// from.
func NodeChoices(ctx context.Context, cfg *rest.Config, nodeName string) (map[string]Resolution, []OverrideRejection, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	n, err := kube.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("node %s: %w", nodeName, err)
	}
	ovs, err := ListOverrides(ctx, dyn)
	if err != nil {
		return nil, nil, err
	}
	res, rej := Resolve(ovs, n.Name, n.Labels)
	return res, rej, nil
}

// MatrixRow is one GPU model × driver × variant with its counts.
type MatrixRow struct {
	GPU     string         `json:"gpu"`
	Driver  string         `json:"driver"`
	Variant string         `json:"variant"`
	Proved  int            `json:"proved"`
	Failed  int            `json:"failed"`
	Reasons map[string]int `json:"reasons,omitempty"`
}

// Matrix counts proofs and failures by GPU model, driver and variant (the
// variant pinned when ready, the one attempted when failed; "-" when none
// was tried). A node with mixed GPUs counts under each model once.
func Matrix(nodes []GPUPinNode) []MatrixRow {
	rows := map[[3]string]*MatrixRow{}
	for _, n := range nodes {
		models := uniq(n.Status.GPUs)
		if len(models) == 0 {
			models = []string{"-"}
		}
		for _, e := range n.Status.Engines {
			var variant string
			var proved bool
			switch e.State {
			case "ready":
				variant, proved = e.Variant, true
			case "failed", "unsupported":
				variant = e.Attempted
			default:
				continue
			}
			if variant == "" {
				variant = "-"
			}
			for _, m := range models {
				k := [3]string{m, orDash(n.Status.Driver), variant}
				r := rows[k]
				if r == nil {
					r = &MatrixRow{GPU: k[0], Driver: k[1], Variant: k[2], Reasons: map[string]int{}}
					rows[k] = r
				}
				if proved {
					r.Proved++
				} else {
					r.Failed++
					reason := "Failed"
					if e.LastFailure != nil {
						reason = e.LastFailure.Reason
					} else if e.State == "unsupported" {
						reason = "Unsupported"
					}
					r.Reasons[reason]++
				}
			}
		}
	}
	out := make([]MatrixRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.GPU != b.GPU {
			return a.GPU < b.GPU
		}
		if a.Driver != b.Driver {
			return a.Driver < b.Driver
		}
		return a.Variant < b.Variant
	})
	return out
}

// WriteTable prints the nodes × engines table: a row per node, a column
// per engine key, each cell the state and variant.
func WriteTable(w io.Writer, nodes []GPUPinNode) {
	keys := map[string]bool{}
	for _, n := range nodes {
		for _, e := range n.Status.Engines {
			keys[e.Key] = true
		}
	}
	cols := make([]string, 0, len(keys))
	for k := range keys {
		cols = append(cols, k)
	}
	sort.Strings(cols)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "NODE\tGPUS\tDRIVER\tCUDA\t%s\n", strings.Join(upper(cols), "\t"))
	for _, n := range nodes {
		cells := make([]string, len(cols))
		for i, k := range cols {
			cells[i] = "-"
			for _, e := range n.Status.Engines {
				if e.Key == k {
					cells[i] = cell(e)
				}
			}
		}
		name := n.Name
		if n.Status.Simulated {
			name += " (SIMULATED)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", name, gpuSummary(n.Status.GPUs), orDash(n.Status.Driver), orDash(n.Status.CUDA), strings.Join(cells, "\t"))
	}
	tw.Flush()
}

// WriteMatrix prints the GPU model × driver × variant matrix with the
// commonest failure reasons first.
func WriteMatrix(w io.Writer, rows []MatrixRow) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tDRIVER\tVARIANT\tPROVED\tFAILED\tREASONS")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", r.GPU, r.Driver, r.Variant, r.Proved, r.Failed, reasons(r.Reasons))
	}
	tw.Flush()
}

func cell(e EngineStatus) string {
	s := e.State
	switch {
	case e.State == "ready" && e.Variant != "":
		s += "/" + e.Variant
	case e.State == "failed" && e.LastFailure != nil:
		s += ":" + e.LastFailure.Reason
		if e.Variant != "" {
			s += " (" + e.Variant + " kept)"
		}
	}
	if e.SignedBy != "" {
		s += " signed by " + e.SignedBy
	}
	if e.Canary != "" && e.State != "ready" && e.State != "failed" {
		s += " (waits on canary " + e.Canary + ")"
	}
	if e.Override != "" && e.Override != "auto" {
		s += " [" + e.Override + "]"
	}
	return s
}

func reasons(m map[string]int) string {
	type kv struct {
		k string
		v int
	}
	var l []kv
	for k, v := range m {
		l = append(l, kv{k, v})
	}
	sort.Slice(l, func(i, j int) bool { return l[i].v > l[j].v || (l[i].v == l[j].v && l[i].k < l[j].k) })
	parts := make([]string, len(l))
	for i, e := range l {
		parts[i] = fmt.Sprintf("%s×%d", e.k, e.v)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func gpuSummary(models []string) string {
	if len(models) == 0 {
		return "-"
	}
	count := map[string]int{}
	for _, m := range models {
		count[m]++
	}
	var parts []string
	for _, m := range uniq(models) {
		parts = append(parts, fmt.Sprintf("%d×%s", count[m], m))
	}
	return strings.Join(parts, ",")
}

func uniq(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	sort.Strings(out)
	return out
}

func upper(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strings.ToUpper(v)
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
