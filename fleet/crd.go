package fleet

import (
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// CRDFix is what an operator does about a missing CRD. helm upgrade does
// not add CRDs a chart gained since its install (Helm's rule for crds/).
const CRDFix = "kubectl apply -f deploy/kubernetes/fleet-crds.yaml (helm install applies the chart's crds/, helm upgrade does not)"

// CRDMissingError is the API server not serving one of gpupin's
// resources: its CustomResourceDefinition is not installed.
type CRDMissingError struct {
	Resource schema.GroupVersionResource
	Err      error
}

func (e *CRDMissingError) Error() string {
	return fmt.Sprintf("the API server does not serve %s.%s/%s: CustomResourceDefinition not installed; %s: %v",
		e.Resource.Resource, e.Resource.Group, e.Resource.Version, CRDFix, e.Err)
}

func (e *CRDMissingError) Unwrap() error { return e.Err }

// notServed turns a 404 for a whole resource into a CRDMissingError. Only
// called where no object can be missing (a list, a create of a
// cluster-scoped object): there a 404 means the resource itself.
func notServed(gvr schema.GroupVersionResource, err error) error {
	if apierrors.IsNotFound(err) {
		return &CRDMissingError{Resource: gvr, Err: err}
	}
	return err
}

// IsCRDMissing reports whether err is, or wraps, a CRDMissingError.
func IsCRDMissing(err error) bool {
	var m *CRDMissingError
	return errors.As(err, &m)
}
