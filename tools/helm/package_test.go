package helm_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"helm.sh/helm/v4/pkg/chart/v2/loader"
	repo "helm.sh/helm/v4/pkg/repo/v1"

	"github.com/gpupin/gpupin/tools/helm"
)

// make dist's chart repository: the packaged chart is the chart directory
// (the same render), at the version asked for, and index.yaml names it
// with its digest and the URL it will be served at, as helm repo add and
// helm install --repo read them.
func TestPackageIsAChartRepository(t *testing.T) {
	out := t.TempDir()
	const url = "https://charts.example/gpupin"
	// At Chart.yaml's version: the package renders as the directory.
	tgz, err := helm.Package(chartDir, out, "", url)
	if err != nil {
		t.Fatal(err)
	}
	version := loadChart(t).Metadata.Version
	if want := filepath.Join(out, "gpupin-"+version+".tgz"); tgz != want {
		t.Errorf("archive %s, want %s", tgz, want)
	}
	ch, err := loader.Load(tgz)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.Schema) == 0 || len(ch.CRDObjects()) == 0 {
		t.Errorf("the package lost the values schema (%d bytes) or the CRDs (%d)", len(ch.Schema), len(ch.CRDObjects()))
	}
	packaged, err := renderChart(t, ch, namespace, "")
	if err != nil {
		t.Fatal(err)
	}
	fromDir, err := render(t, namespace, "")
	if err != nil {
		t.Fatal(err)
	}
	if packaged.Manifest != fromDir.Manifest {
		t.Error("the packaged chart renders differently from its directory")
	}

	idx, err := repo.LoadIndexFile(filepath.Join(out, "index.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cv, err := idx.Get("gpupin", version)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(tgz)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	if cv.Digest != hex.EncodeToString(sum[:]) {
		t.Errorf("index.yaml's digest %s, the archive's %x", cv.Digest, sum)
	}
	if len(cv.URLs) != 1 || cv.URLs[0] != url+"/gpupin-"+version+".tgz" {
		t.Errorf("index.yaml's URLs %v", cv.URLs)
	}

	// A release's version beside it (make dist's DIST_VERSION): the
	// archive carries it as version and appVersion, and the index lists
	// both.
	tgz, err = helm.Package(chartDir, out, "9.8.7", url)
	if err != nil {
		t.Fatal(err)
	}
	if ch, err = loader.Load(tgz); err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.Version != "9.8.7" || ch.Metadata.AppVersion != "9.8.7" {
		t.Errorf("packaged chart is version %s, appVersion %s; want 9.8.7", ch.Metadata.Version, ch.Metadata.AppVersion)
	}
	idx, err = repo.LoadIndexFile(filepath.Join(out, "index.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(idx.Entries["gpupin"]); n != 2 {
		t.Errorf("index.yaml lists %d versions after two packages, want 2", n)
	}
}
