package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// ApplyFiles applies every object of the YAML files (server-side apply,
// as `kubectl apply --server-side` would), in order. A CRD is waited for
// until it is established, so the objects after it (and the caller) can
// use its kind.
func ApplyFiles(ctx context.Context, cfg *rest.Config, files ...string) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var obj unstructured.Unstructured
			if err := dec.Decode(&obj.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return fmt.Errorf("%s: %w", f, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			if err := applyOne(ctx, mapper, dyn, &obj); err != nil {
				return fmt.Errorf("%s: %s %s: %w", f, obj.GetKind(), obj.GetName(), err)
			}
		}
	}
	return nil
}

func applyOne(ctx context.Context, mapper *restmapper.DeferredDiscoveryRESTMapper, dyn dynamic.Interface, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		// A kind a CRD just made: discovery again.
		mapper.Reset()
		if m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return err
		}
	}
	var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		r = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
	}
	if _, err := r.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "kubetest", Force: true}); err != nil {
		return err
	}
	if gvk.Kind != "CustomResourceDefinition" {
		return nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := r.Get(ctx, obj.GetName(), metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if got != nil {
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				cm, _ := c.(map[string]any)
				if cm["type"] == "Established" && cm["status"] == "True" {
					mapper.Reset()
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return errors.New("CRD not established after 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
