package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

// Agent is what the fleet layer needs of a node agent (*agent.Agent), said
// in full: the wants a ConfigMap holds (NodeOptions.WantsConfigMap) are
// set through its WantsSetter, so an agent that lacks one does not compile.
type Agent interface {
	SetClusterOverrides(map[string]string) error
	FileOverrides() map[string]string
	Status() []provision.Status
	WantsSetter
}

// NodeOptions configure a node's fleet layer.
type NodeOptions struct {
	Config   *rest.Config
	NodeName string
	// CachePath keeps the last cluster choices on the node (Watcher.CachePath).
	CachePath string
	// Facts reads the node's facts for its status; nil: none reported.
	Facts       node.Reader
	SyncTimeout time.Duration
	// WantsConfigMap is NAMESPACE/NAME of a ConfigMap whose agent.yaml
	// holds the wants (WantsWatcher), read through the API; "": off.
	WantsConfigMap string
	// StatusEvery rewrites the status without a change (default a minute).
	StatusEvery time.Duration
	Logger      *slog.Logger
}

// Node is one node's fleet layer: the choices' watcher, the status
// writer and the Node's Events, around an agent.
type Node struct {
	opts    NodeOptions
	kube    kubernetes.Interface
	watcher *Watcher
	status  *StatusWriter
	rec     record.EventRecorder
	bcast   record.EventBroadcaster

	wg          sync.WaitGroup
	mu          sync.Mutex
	agent       Agent
	lastEvent   map[string]string
	lastFailure map[string]*Failure
	lastRejects map[string]bool
	settled     map[string]EngineStatus // each key's last settled status, for Conditions
}

// NewNode makes the clients; nothing talks to the API until Start.
func NewNode(opts NodeOptions) (*Node, error) {
	if opts.NodeName == "" {
		return nil, errors.New("fleet: no node name (--node-name, or NODE_NAME from the downward API)")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	dyn, err := dynamic.NewForConfig(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	kube, err := kubernetes.NewForConfig(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	n := &Node{opts: opts, kube: kube, lastEvent: map[string]string{}, lastFailure: map[string]*Failure{}, lastRejects: map[string]bool{},
		settled: map[string]EngineStatus{}}
	n.watcher = &Watcher{Dyn: dyn, Kube: kube, NodeName: opts.NodeName, CachePath: opts.CachePath,
		SyncTimeout: opts.SyncTimeout, Logger: opts.Logger, Apply: n.applyChoices}
	n.status = &StatusWriter{Dyn: dyn, NodeName: opts.NodeName, Every: opts.StatusEvery, Logger: opts.Logger, Build: n.build,
		NodeUID: n.watcher.NodeUID}
	// The broadcaster's correlator aggregates repeats and rate-limits
	// each source and object (a burst of 25, then one per 5 minutes).
	n.bcast = record.NewBroadcaster()
	n.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	n.rec = n.bcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "gpupin-agent", Host: opts.NodeName})
	return n, nil
}

// Start has the agent's cluster overrides before it returns (or the
// cached ones, when the API does not answer within SyncTimeout), then
// keeps them and the node's status current until ctx ends. Call it
// before the agent's loop runs (agent.RunConfig.Started).
func (n *Node) Start(ctx context.Context, a Agent) error {
	n.mu.Lock()
	n.agent = a
	n.mu.Unlock()
	if err := n.watcher.Start(ctx); err != nil {
		return err
	}
	if n.opts.WantsConfigMap != "" {
		ns, name, err := ParseWantsRef(n.opts.WantsConfigMap)
		if err != nil {
			return err
		}
		ww := &WantsWatcher{Kube: n.kube, Namespace: ns, Name: name, Set: a, Logger: n.opts.Logger,
			Rejected: func(err error) {
				n.rec.Event(NodeRef(n.opts.NodeName), corev1.EventTypeWarning, "WantsRejected", clip(err.Error(), 1024))
			}}
		timeout := n.watcher.SyncTimeout
		if err := ww.Start(ctx, func() <-chan struct{} {
			c, cancel := context.WithTimeout(ctx, timeout)
			go func() { <-c.Done(); cancel() }()
			return c.Done()
		}); err != nil {
			return err
		}
	}
	n.wg.Go(func() { n.status.Run(ctx) })
	go func() {
		<-ctx.Done()
		n.bcast.Shutdown()
	}()
	n.status.Kick()
	return nil
}

// Wait waits, once Start's ctx has ended, for the watcher and the status
// writer to stop.
func (n *Node) Wait() {
	n.watcher.Wait()
	n.wg.Wait()
}

// StatusChanged is the loop's OnChange: an Event on a new state, and a
// status write.
func (n *Node) StatusChanged(st provision.Status) {
	n.mu.Lock()
	src := n.watcher.Current().Sources[st.Engine]
	if src == "" {
		src = "the node's overrides file"
	}
	recordState(n.rec, n.opts.NodeName, n.lastEvent, st, src)
	n.mu.Unlock()
	n.status.Kick()
}

// Choices are the cluster's choices as last applied.
func (n *Node) Choices() Choices { return n.watcher.Current() }

// StatusWrites counts the status writes that succeeded.
func (n *Node) StatusWrites() int { return n.status.Writes() }

func (n *Node) applyChoices(c Choices) error {
	n.mu.Lock()
	a := n.agent
	n.mu.Unlock()
	if err := a.SetClusterOverrides(c.Overrides); err != nil {
		return err
	}
	n.mu.Lock()
	seen := map[string]bool{}
	for _, r := range c.Rejections {
		k := r.Source + "\x00" + r.Choice
		seen[k] = true
		if !n.lastRejects[k] {
			n.rec.Event(NodeRef(n.opts.NodeName), corev1.EventTypeWarning, "OverrideRejected",
				fmt.Sprintf("%s: %s for %s not applied, the last good choice holds: %s", r.Source, r.Choice, r.Engine, r.Reason))
		}
	}
	n.lastRejects = seen
	n.mu.Unlock()
	if len(c.Overrides) > 0 {
		var parts []string
		for e, v := range c.Overrides {
			parts = append(parts, e+"="+v+" from "+c.Sources[e])
		}
		n.opts.Logger.Info("cluster choices", "node", n.opts.NodeName, "choices", strings.Join(parts, "; "))
	}
	n.status.Kick()
	return nil
}

func (n *Node) build(ctx context.Context) NodeStatus {
	n.mu.Lock()
	a := n.agent
	n.mu.Unlock()
	var facts *node.Facts
	if n.opts.Facts != nil {
		f, err := n.opts.Facts.Read(ctx)
		if err != nil {
			n.opts.Logger.Warn("node facts not read for the GPUPinNode status", "err", err)
		} else {
			facts = f
		}
	}
	// The agent's locks are taken before n.mu: the loop calls
	// StatusChanged, which takes n.mu, while it may hold its own.
	sts, fileOv, ch := a.Status(), a.FileOverrides(), n.watcher.Current()
	n.mu.Lock()
	defer n.mu.Unlock()
	ns := BuildStatus(sts, facts, ch, fileOv, n.lastFailure)
	ns.Conditions = Conditions(ns, n.settled)
	rememberSettled(n.settled, ns.Engines)
	return ns
}
