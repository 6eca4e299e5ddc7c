// Command gpupin-chart packages gpupin's Helm chart into a chart
// repository directory (make dist): the archive and its index.yaml.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gpupin/gpupin/tools/helm"
)

func main() {
	dir := flag.String("chart", "../../deploy/helm/gpupin", "the chart's directory")
	out := flag.String("out", "dist/charts", "the chart repository directory written")
	version := flag.String("version", "", "the chart's version and appVersion (default: Chart.yaml's)")
	url := flag.String("url", "https://gpupin.github.io/gpupin/charts", "the URL out is served at (for index.yaml)")
	flag.Parse()
	tgz, err := helm.Package(*dir, *out, *version, *url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpupin-chart:", err)
		os.Exit(1)
	}
	fmt.Println(tgz)
}
