package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/provision"
)

// WantsKey is the ConfigMap key holding the agent's file (agent.Config).
const WantsKey = "agent.yaml"

// WantsSetter takes the wanted engines (*agent.Agent).
type WantsSetter interface {
	SetWants([]provision.Want) error
}

// WantsWatcher reads the agent's wants from a ConfigMap through the API
// (an informer field-selected to its name), so an edit reaches every node
// at once rather than on kubelet's volume sync (about a minute). A
// ConfigMap that does not parse changes nothing; a deleted one leaves the
// last wants in place.
type WantsWatcher struct {
	Kube      kubernetes.Interface
	Namespace string
	Name      string
	Set       WantsSetter
	Logger    *slog.Logger
	// Rejected, when set, is told of a ConfigMap that does not parse.
	Rejected func(error)

	last string
}

// ParseWantsRef parses NAMESPACE/NAME.
func ParseWantsRef(s string) (ns, name string, err error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" {
		return "", "", fmt.Errorf("%q: want NAMESPACE/NAME of a ConfigMap", s)
	}
	return ns, name, nil
}

// Start starts the informer and, once it has listed, applies the wants;
// then keeps applying each change until ctx ends.
func (w *WantsWatcher) Start(ctx context.Context, syncTimeout func() <-chan struct{}) error {
	if w.Logger == nil {
		w.Logger = slog.Default()
	}
	f := informers.NewSharedInformerFactoryWithOptions(w.Kube, 0, informers.WithNamespace(w.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", w.Name).String()
		}))
	inf := f.Core().V1().ConfigMaps().Informer()
	apply := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		w.apply(cm)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    apply,
		UpdateFunc: func(_, obj any) { apply(obj) },
		DeleteFunc: func(any) {
			w.Logger.Warn("wants ConfigMap deleted: the last wants hold", "configmap", w.Namespace+"/"+w.Name)
		},
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	cache.WaitForCacheSync(syncTimeout(), inf.HasSynced)
	return nil
}

// apply hands the ConfigMap's wants to the agent if its text changed.
// Handlers of one informer run one at a time: last needs no lock.
func (w *WantsWatcher) apply(cm *corev1.ConfigMap) {
	data := cm.Data[WantsKey]
	if data == w.last {
		return
	}
	cfg, err := agent.ParseConfig([]byte(data))
	if err == nil {
		err = w.Set.SetWants(cfg.Wants)
	}
	if err != nil {
		err = fmt.Errorf("ConfigMap %s/%s key %s: %w", w.Namespace, w.Name, WantsKey, err)
		w.Logger.Error("wants not applied; the last good ones hold", "err", err)
		if w.Rejected != nil {
			w.Rejected(err)
		}
		return
	}
	w.last = data
	w.Logger.Info("wants from the cluster applied", "configmap", w.Namespace+"/"+w.Name, "wants", len(cfg.Wants))
}
