package helm

import (
	"fmt"
	"path/filepath"

	"helm.sh/helm/v4/pkg/action"
	repo "helm.sh/helm/v4/pkg/repo/v1"
)

// Package packages the chart in dir into out as NAME-VERSION.tgz, as
// `helm package` does (version "" keeps Chart.yaml's), and writes out's
// index.yaml, as `helm repo index out --url baseURL` does, so out can be
// served as a chart repository as it is (any static web server, or a
// GitHub Pages branch). It returns the archive's path.
func Package(dir, out, version, baseURL string) (string, error) {
	p := action.NewPackage()
	p.Destination = out
	p.Version = version
	p.AppVersion = version
	tgz, err := p.Run(dir, nil)
	if err != nil {
		return "", fmt.Errorf("package the chart %s: %w", dir, err)
	}
	idx, err := repo.IndexDirectory(out, baseURL)
	if err != nil {
		return "", fmt.Errorf("index %s: %w", out, err)
	}
	idx.SortEntries()
	if err := idx.WriteFile(filepath.Join(out, "index.yaml"), 0o644); err != nil {
		return "", fmt.Errorf("index %s: %w", out, err)
	}
	return tgz, nil
}
