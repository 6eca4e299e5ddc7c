// Package helm holds the test of gpupin's Helm chart (deploy/helm/gpupin):
// it renders the chart with Helm's own library, pinned in this module's
// go.mod so the main module does not carry Helm, holds the render to what
// the plain manifests in deploy/kubernetes say, and installs it on a real
// kube-apiserver.
package helm
