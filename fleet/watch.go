package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// DefaultCachePath is where the agent keeps the last cluster choices.
const DefaultCachePath = "/var/lib/gpupin/cluster-overrides.json"

// Choices is what the watcher resolved for the node: the effective
// override per engine that the cluster decides, where each came from, and
// the overrides it could not use.
type Choices struct {
	// Overrides is engine → choice, as the agent applies them.
	Overrides map[string]string `json:"overrides"`
	// Sources is engine → "EngineOverride NAME (LEVEL)".
	Sources map[string]string `json:"sources"`
	// Rejections are EngineOverrides the node refused; for their engine
	// the last good choice holds.
	Rejections []OverrideRejection `json:"rejections,omitempty"`
	// Shadowed: engine → the overrides that lost a tie at the winner's level.
	Shadowed map[string][]string `json:"shadowed,omitempty"`
	// FromCache is true when the choices were read from the node's cache
	// file because the API could not be reached at start.
	FromCache bool `json:"-"`
}

// Watcher keeps a node's cluster overrides: informers on the
// EngineOverrides and on the node's own Node (field-selected), a
// resolution on every change, handed to Apply when it differs. Through an
// API outage the informers' caches, and so the last known choices, stay;
// they relist and catch up on reconnect.
type Watcher struct {
	Dyn      dynamic.Interface
	Kube     kubernetes.Interface
	NodeName string
	// Apply takes the new choices; an error is logged and retried at the
	// next change.
	Apply func(Choices) error
	// CachePath keeps the last applied choices on the node, for a restart
	// while the API is down (the agent's default: DefaultCachePath); ""
	// keeps none.
	CachePath string
	// SyncTimeout bounds Start's wait for the first listing (default 10s);
	// past it the cache file's choices are applied.
	SyncTimeout time.Duration
	Logger      *slog.Logger

	wg      sync.WaitGroup
	mu      sync.Mutex
	current Choices
	labels  map[string]string
	synced  bool
	kick    chan struct{}
	ovInf   cache.SharedIndexInformer
	noCRD   atomic.Bool // the EngineOverride CRD was found missing
	nodeInf cache.SharedIndexInformer
}

// Start starts the informers and waits for their first listing (or
// SyncTimeout, then applies the cache file's choices), applies the
// choices, and keeps them current until ctx ends. A restarted agent so
// has its choices before its first provision.
func (w *Watcher) Start(ctx context.Context) error {
	if w.Logger == nil {
		w.Logger = slog.Default()
	}
	if w.SyncTimeout == 0 {
		w.SyncTimeout = 10 * time.Second
	}
	w.kick = make(chan struct{}, 1)
	w.current = Choices{Overrides: map[string]string{}, Sources: map[string]string{}}
	df := dynamicinformer.NewDynamicSharedInformerFactory(w.Dyn, 0)
	w.ovInf = df.ForResource(EngineOverrides).Informer()
	nf := informers.NewSharedInformerFactoryWithOptions(w.Kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", w.NodeName).String()
	}))
	w.nodeInf = nf.Core().V1().Nodes().Informer()
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.poke() },
		UpdateFunc: func(any, any) { w.poke() },
		DeleteFunc: func(any) { w.poke() },
	}
	// A missing CRD is said once, in words an operator acts on, rather
	// than as client-go's reflector retrying a 404 forever.
	if err := w.ovInf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		if !apierrors.IsNotFound(err) {
			cache.DefaultWatchErrorHandler(ctx, r, err)
			return
		}
		if w.noCRD.CompareAndSwap(false, true) {
			w.Logger.Error("EngineOverrides cannot be read; the node's own overrides hold until they can", "err", notServed(EngineOverrides, err))
		}
	}); err != nil {
		return err
	}
	if _, err := w.ovInf.AddEventHandler(h); err != nil {
		return err
	}
	if _, err := w.nodeInf.AddEventHandler(h); err != nil {
		return err
	}
	df.Start(ctx.Done())
	nf.Start(ctx.Done())
	sctx, cancel := context.WithTimeout(ctx, w.SyncTimeout)
	ok := cache.WaitForCacheSync(sctx.Done(), w.ovInf.HasSynced, w.nodeInf.HasSynced)
	cancel()
	if ok {
		w.resolve()
	} else {
		c, err := w.loadCache()
		switch {
		case w.noCRD.Load():
			// Said by the handler; the cache is not applied, as the API
			// does answer: there are no EngineOverrides to be had.
		case err != nil:
			w.Logger.Error("the Kubernetes API is not answering and the cached cluster choices cannot be read: the node's own overrides hold until it answers", "err", err)
		case c != nil:
			w.Logger.Warn("the Kubernetes API is not answering: applying the last known cluster choices", "cache", w.CachePath, "overrides", len(c.Overrides))
			c.FromCache = true
			w.set(*c)
		default:
			w.Logger.Warn("the Kubernetes API is not answering and no cluster choices are cached: the node's own overrides hold until it answers")
		}
	}
	w.wg.Go(func() { w.run(ctx) })
	return nil
}

// Wait waits, once Start's ctx has ended, for the watcher to stop
// applying and caching.
func (w *Watcher) Wait() { w.wg.Wait() }

func (w *Watcher) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *Watcher) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		}
		// Until both have listed, an empty cache is not "no overrides".
		if w.ovInf.HasSynced() && w.nodeInf.HasSynced() {
			w.resolve()
		}
	}
}

// NodeUID is the UID of the node's Node as the informer last listed it;
// "" before the first listing, or when no Node has the name.
func (w *Watcher) NodeUID() types.UID {
	if w.nodeInf == nil {
		return ""
	}
	obj, ok, err := w.nodeInf.GetStore().GetByKey(w.NodeName)
	if err != nil || !ok {
		return ""
	}
	if n, ok := obj.(*corev1.Node); ok {
		return n.UID
	}
	return ""
}

// Current is the choices last applied.
func (w *Watcher) Current() Choices {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

// resolve computes the choices from the informers' caches and applies
// them if they changed.
func (w *Watcher) resolve() {
	var ovs []EngineOverride
	var bad []OverrideRejection
	for _, obj := range w.ovInf.GetStore().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var o EngineOverride
		if err := fromUnstructured(u, &o); err != nil {
			bad = append(bad, OverrideRejection{Source: "EngineOverride " + u.GetName(), Reason: err.Error()})
			continue
		}
		ovs = append(ovs, o)
	}
	w.mu.Lock()
	if obj, ok, _ := w.nodeInf.GetStore().GetByKey(w.NodeName); ok {
		if n, ok := obj.(*corev1.Node); ok {
			w.labels = n.Labels
		}
	}
	labels := w.labels
	prev := w.current
	w.mu.Unlock()

	res, rej := Resolve(ovs, w.NodeName, labels)
	bad = append(bad, rej...)
	next := Choices{Overrides: map[string]string{}, Sources: map[string]string{}, Shadowed: map[string][]string{}}
	for engine, r := range res {
		if len(r.Shadowed) > 0 {
			next.Shadowed[engine] = r.Shadowed
		}
		if r.Err != nil {
			bad = append(bad, OverrideRejection{Engine: engine, Source: r.Source(), Choice: r.Choice, Reason: r.Err.Error()})
			// The last good choice holds: a typo must not move a pin.
			if v, ok := prev.Overrides[engine]; ok {
				next.Overrides[engine], next.Sources[engine] = v, prev.Sources[engine]
			}
			continue
		}
		next.Overrides[engine], next.Sources[engine] = r.Choice, r.Source()
	}
	sort.Slice(bad, func(i, j int) bool { return bad[i].Source < bad[j].Source })
	next.Rejections = bad
	w.set(next)
}

// set applies c when it differs from what was applied.
func (w *Watcher) set(c Choices) {
	w.mu.Lock()
	prev := w.current
	same := maps.Equal(prev.Overrides, c.Overrides) && maps.Equal(prev.Sources, c.Sources) &&
		equalRejections(prev.Rejections, c.Rejections) && w.synced
	w.mu.Unlock()
	if same {
		return
	}
	// Current answers the new choices once the agent has them: set
	// before Apply, put back if it fails.
	w.mu.Lock()
	w.current = c
	w.mu.Unlock()
	if err := w.Apply(c); err != nil {
		w.Logger.Error("cluster overrides not applied; the last applied hold", "err", err)
		w.mu.Lock()
		w.current = prev
		w.mu.Unlock()
		return
	}
	w.mu.Lock()
	w.synced = true
	w.mu.Unlock()
	if !c.FromCache {
		if err := w.saveCache(c); err != nil {
			w.Logger.Warn("cluster choices not cached on the node", "path", w.CachePath, "err", err)
		}
	}
	w.Logger.Info("cluster overrides applied", "overrides", c.Overrides, "sources", c.Sources, "rejected", len(c.Rejections))
}

func equalRejections(a, b []OverrideRejection) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (w *Watcher) loadCache() (*Choices, error) {
	if w.CachePath == "" {
		return nil, nil
	}
	data, err := os.ReadFile(w.CachePath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var c Choices
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", w.CachePath, err)
	}
	return &c, nil
}

// saveCache writes the choices atomically (a temporary file renamed over).
func (w *Watcher) saveCache(c Choices) error {
	if w.CachePath == "" {
		return nil
	}
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(w.CachePath), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(w.CachePath), ".cluster-overrides-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), w.CachePath)
}
