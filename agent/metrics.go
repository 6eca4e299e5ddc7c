package agent

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/provision"
)

// Metrics are the agent's Prometheus metrics, in a registry of their own
// so an embedding program's metrics and gpupin's do not collide.
type Metrics struct {
	reg       *prometheus.Registry
	duration  *prometheus.HistogramVec
	probes    *prometheus.CounterVec
	pullBytes *prometheus.CounterVec
	foreign   prometheus.Counter

	mu       sync.Mutex
	lastDone map[string]int64 // per pulled reference: bytes already counted
}

// NewMetrics makes the metrics. status gives the engines' statuses at each
// scrape (pin age, state); now is the clock pin age is measured by.
func NewMetrics(status func() []provision.Status, now func() time.Time) *Metrics {
	if now == nil {
		now = time.Now
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpupin_provision_duration_seconds",
			Help:    "How long a provision took, by engine and outcome; a check of an existing pin is quick, a pull and probe is not.",
			Buckets: []float64{0.05, 0.25, 1, 5, 15, 60, 180, 600, 1800},
		}, []string{"engine", "state"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpupin_probe_results_total",
			Help: "Compute probes run, by engine, variant and result (pass or fail).",
		}, []string{"engine", "variant", "result"}),
		pullBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpupin_pull_bytes_total",
			Help: "Bytes of image layers fetched, by engine.",
		}, []string{"engine"}),
		foreign: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpupin_foreign_local_names_total",
			Help: "Records of a node-local name (gpupin.local/…) that gpupin did not write on this node, pulled from a peer through a mirror or made by hand, that it replaced or removed.",
		}),
		lastDone: map[string]int64{},
	}
	m.reg.MustRegister(m.duration, m.probes, m.pullBytes, m.foreign, &statusCollector{status: status, now: now})
	return m
}

// Registry is the metrics' registry, for a program that serves it itself.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// ObserveResult counts one finished provision (provision.LoopOptions.OnResult).
func (m *Metrics) ObserveResult(st provision.Status) {
	engine := st.Engine
	m.duration.WithLabelValues(engine, string(st.State)).Observe(st.Duration.Seconds())
	for _, a := range st.Attempts {
		if a.Stage == "probe" {
			m.probes.WithLabelValues(engine, a.Variant, "fail").Inc()
		}
	}
	if st.State == provision.Ready && !st.FromPin && st.Verdict != nil {
		m.probes.WithLabelValues(engine, st.Variant, "pass").Inc()
	}
}

// PullProgress counts fetched bytes (provision.Options.Progress). Progress
// reports a running total per pull; only the growth is added.
func (m *Metrics) PullProgress(key string, p containerd.Progress) {
	engine, _, _ := strings.Cut(key, ":")
	m.mu.Lock()
	delta := p.Done - m.lastDone[p.Ref]
	if p.Finished {
		delete(m.lastDone, p.Ref)
	} else {
		m.lastDone[p.Ref] = p.Done
	}
	m.mu.Unlock()
	if delta > 0 {
		m.pullBytes.WithLabelValues(engine).Add(float64(delta))
	}
}

// statusCollector reads pin ages and states at scrape time, so an engine
// no longer wanted leaves the metrics with it.
type statusCollector struct {
	status func() []provision.Status
	now    func() time.Time
}

var (
	pinAgeDesc = prometheus.NewDesc("gpupin_pin_age_seconds",
		"Seconds since the engine's pin was proved by a probe.", []string{"key", "variant"}, nil)
	stateDesc = prometheus.NewDesc("gpupin_engine_state",
		"1 for the state each wanted engine is in.", []string{"key", "state"}, nil)
)

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pinAgeDesc
	ch <- stateDesc
}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	seen := map[string]bool{}
	for _, st := range c.status() {
		if seen[st.Key] {
			continue // two wants that came to one key: one series
		}
		seen[st.Key] = true
		ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, 1, st.Key, string(st.State))
		if st.Pin != nil && !st.Pin.ProbedAt.IsZero() {
			// The pin's own variant: a failed attempt of another one
			// beside it is not what the age is of.
			ch <- prometheus.MustNewConstMetric(pinAgeDesc, prometheus.GaugeValue, now.Sub(st.Pin.ProbedAt).Seconds(), st.Key, st.Pin.Variant)
		}
	}
}
