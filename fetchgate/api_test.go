package fetchgate_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpupin/gpupin/fetchgate"
	"github.com/gpupin/gpupin/internal/kubetest"
)

// The lease logic against a real kube-apiserver, as the agents use it:
// each simulated node is the user gpupin:agent:NODE of group
// gpupin:agents, with the RBAC of deploy/kubernetes/fleet-rbac.yaml.

const ns = "gpupin-system"

var manifests = []string{"../deploy/kubernetes/fleet-crds.yaml", "../deploy/kubernetes/fleet-rbac.yaml"}

func users() []kubetest.User {
	var us []kubetest.User
	for i := range 10 {
		us = append(us, kubetest.User{Name: "gpupin:agent:n" + strconv.Itoa(i), Groups: []string{"gpupin:agents"}})
	}
	return us
}

func nodeClient(t *testing.T, c *kubetest.Cluster, node string) *kubernetes.Clientset {
	t.Helper()
	cfg := c.Config("gpupin:agent:" + node)
	cfg.Timeout = 5 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func digestFor(t *testing.T) (string, string) {
	dg := fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(t.Name()+time.Now().String())))
	return dg, "registry.test/org/vllm@" + dg
}

// mirror is a registry API root that answers, as Spegel's does.
func mirror(t *testing.T) fetchgate.Option {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }))
	t.Cleanup(srv.Close)
	return fetchgate.WithMirrors(func(context.Context, string) ([]string, error) { return []string{srv.URL}, nil })
}

func gate(t *testing.T, c *kubetest.Cluster, node string, opts ...fetchgate.Option) *fetchgate.Gate {
	t.Helper()
	g, err := fetchgate.New(nodeClient(t, c, node).CoordinationV1(), ns, node, append([]fetchgate.Option{mirror(t)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// flow is a pull that moves step bytes every tick until total (or for
// ever with total 0), or until stop closes.
// Told to await, it awaits one layer before its first byte.
func flow(step, total int64, tick time.Duration, stop <-chan struct{}) fetchgate.Pull {
	return func(ctx context.Context, progress func(int64, int64), await fetchgate.Await) error {
		if await != nil {
			if err := await(ctx, layerDigest(0)); err != nil {
				return err
			}
		}
		var done int64
		for total == 0 || done < total {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-stop:
				return fmt.Errorf("stopped")
			case <-time.After(tick):
			}
			done += step
			progress(done, max(total, done+step))
		}
		return nil
	}
}

type record struct {
	mu    sync.Mutex
	start map[string]time.Time
	end   map[string]time.Time
	notes map[string][]string
}

func newRecord() *record {
	return &record{start: map[string]time.Time{}, end: map[string]time.Time{}, notes: map[string][]string{}}
}

func (r *record) note(node string) func(string) {
	return func(s string) { r.mu.Lock(); r.notes[node] = append(r.notes[node], s); r.mu.Unlock() }
}

// pull records when inner's bytes begin to move: at once, or when its
// first await returns.
func (r *record) pull(node string, inner fetchgate.Pull) fetchgate.Pull {
	return func(ctx context.Context, p func(int64, int64), await fetchgate.Await) error {
		begin := func() {
			r.mu.Lock()
			if _, ok := r.start[node]; !ok {
				r.start[node] = time.Now()
			}
			r.mu.Unlock()
		}
		var err error
		if await == nil {
			begin()
			err = inner(ctx, p, nil)
		} else {
			err = inner(ctx, p, func(ctx context.Context, dg string) error {
				err := await(ctx, dg)
				begin()
				return err
			})
		}
		r.mu.Lock()
		r.end[node] = time.Now()
		r.mu.Unlock()
		return err
	}
}

// fetchers are the nodes whose pull started before the first pull ended:
// those that went to upstream together.
func (r *record) fetchers() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first time.Time
	for _, e := range r.end {
		if first.IsZero() || e.Before(first) {
			first = e
		}
	}
	var out []string
	for n, s := range r.start {
		if s.Before(first) {
			out = append(out, n)
		}
	}
	return out
}

// TestContendersOneFetches: six nodes want one digest at once; one (two
// with concurrency 2) fetches, the others pull after it, through the
// mirror, told who fetched.
func TestContendersOneFetches(t *testing.T) {
	c := kubetest.StartT(t, manifests, users()...)
	for _, n := range []int{1, 2} {
		t.Run("concurrency "+strconv.Itoa(n), func(t *testing.T) {
			_, ref := digestFor(t)
			rec := newRecord()
			var wg sync.WaitGroup
			for i := range 6 {
				node := "n" + strconv.Itoa(i)
				g := gate(t, c, node, fetchgate.WithConcurrency(n), fetchgate.WithLeaseDuration(3*time.Second))
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := g.Fetch(context.Background(), ref, rec.note(node), rec.pull(node, flow(4<<20, 40<<20, 150*time.Millisecond, nil))); err != nil {
						t.Errorf("%s: %v", node, err)
					}
				}()
			}
			wg.Wait()
			if f := rec.fetchers(); len(f) != n {
				t.Fatalf("%d nodes fetched at once, want %d: %v (notes %v)", len(f), n, f, rec.notes)
			}
			mirrored := 0
			for node, notes := range rec.notes {
				if len(notes) > 0 && strings.HasPrefix(notes[len(notes)-1], "pulling through the mirror: ") {
					mirrored++
				} else if len(notes) == 0 || !strings.Contains(notes[len(notes)-1], "from upstream for the fleet") {
					t.Errorf("%s: notes %q", node, notes)
				}
			}
			if mirrored < 6-n {
				t.Errorf("%d nodes pulled through the mirror, want %d: %v", mirrored, 6-n, rec.notes)
			}
		})
	}
}

// TestStalledHolderLosesLease: a fetcher whose pull stops moving bytes
// stops renewing; a waiting node takes the lease within its duration
// (plus one renewal period), and the stalled one, when it ends, does not
// write over the new holder's lease.
func TestStalledHolderLosesLease(t *testing.T) {
	c := kubetest.StartT(t, manifests, users()...)
	dg, ref := digestFor(t)
	const d = 3 * time.Second
	stalled := make(chan struct{})
	release := make(chan struct{})
	holderDone := make(chan error, 1)
	go func() {
		holderDone <- gate(t, c, "n1", fetchgate.WithLeaseDuration(d)).Fetch(context.Background(), ref, nil,
			func(ctx context.Context, p func(int64, int64), _ fetchgate.Await) error {
				p(8<<20, 100<<20) // some bytes, then nothing
				close(stalled)
				<-release
				return fmt.Errorf("stalled pull cut")
			})
	}()
	<-stalled
	stallAt := time.Now()
	rec := newRecord()
	err := gate(t, c, "n2", fetchgate.WithLeaseDuration(d)).Fetch(context.Background(), ref, rec.note("n2"),
		rec.pull("n2", flow(4<<20, 20<<20, 100*time.Millisecond, nil)))
	if err != nil {
		t.Fatal(err)
	}
	took := rec.start["n2"].Sub(stallAt)
	// The holder's last renewal may follow the stall by one period, and
	// the waiter counts a full duration from the change it saw.
	if bound := d + d/3 + 2*time.Second; took > bound {
		t.Errorf("took over %s after the stall, bound %s", took, bound)
	}
	if n := rec.notes["n2"]; len(n) == 0 || !strings.Contains(n[len(n)-1], "from upstream for the fleet") {
		t.Errorf("n2 notes %q", n)
	}
	close(release)
	if err := <-holderDone; err == nil {
		t.Error("the stalled pull's error was lost")
	}
	l, err := nodeClient(t, c, "n0").CoordinationV1().Leases(ns).Get(context.Background(), fetchgate.LeaseName(dg, 0), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != "n2" || l.Annotations[fetchgate.AnnotState] != fetchgate.StateFetched || *l.Spec.LeaseTransitions != 1 {
		t.Errorf("lease after the takeover: holder %v, annotations %v, transitions %v", h, l.Annotations, l.Spec.LeaseTransitions)
	}
	t.Logf("took over %s after the stall (lease %s)", took.Round(time.Millisecond), d)
}

// TestMain runs the killed node of TestHolderKilledMidFetch when this
// binary is started as it (FETCHGATE_HELPER_KUBECONFIG set), else the tests.
func TestMain(m *testing.M) {
	if kc := os.Getenv("FETCHGATE_HELPER_KUBECONFIG"); kc != "" {
		if err := helperHolder(kc, os.Getenv("FETCHGATE_HELPER_REF")); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helperHolder is the node that is killed: a process of its own, that
// takes the lease and fetches for ever.
func helperHolder(kc, ref string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	pull, opts := flow(2<<20, 0, 100*time.Millisecond, nil), []fetchgate.Option{fetchgate.WithLeaseDuration(3 * time.Second)}
	if k, err := strconv.Atoi(os.Getenv("FETCHGATE_HELPER_LAYERS")); err == nil {
		// TestFollowerTakesOverMidPull's: k layers stored and listed, then
		// the rest never comes.
		st := newStore(helperLayers)
		pull = layered(helperLayers, 1<<20, 100*time.Millisecond, st, k)
		opts = append(opts, st.option())
	}
	g, err := fetchgate.New(cs.CoordinationV1(), ns, "n1", opts...)
	if err != nil {
		return err
	}
	return g.Fetch(context.Background(), ref, func(s string) { fmt.Println("NOTE", s) }, pull)
}

// startHelper starts this test binary as helperHolder, node n1, fetching
// ref, with env added; it is killed at the test's end. out collects what
// it prints.
func startHelper(t *testing.T, c *kubetest.Cluster, ref string, env ...string) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	kc, err := c.Kubeconfig("gpupin:agent:n1")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(append(os.Environ(), "FETCHGATE_HELPER_KUBECONFIG="+kc, "FETCHGATE_HELPER_REF="+ref), env...)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, out
}

// TestHolderKilledMidFetch: the fetching node's process is killed (no
// release); a waiting node takes over within the lease's duration.
func TestHolderKilledMidFetch(t *testing.T) {
	c := kubetest.StartT(t, manifests, users()...)
	dg, ref := digestFor(t)
	cmd, out := startHelper(t, c, ref)
	leases := nodeClient(t, c, "n0").CoordinationV1().Leases(ns)
	// Held, and renewed at least once: it is mid-fetch.
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := leases.Get(context.Background(), fetchgate.LeaseName(dg, 0), metav1.GetOptions{})
		if err == nil && l.Annotations[fetchgate.AnnotProgress] != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the helper never held the lease: %v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	rec := newRecord()
	waiting := make(chan error, 1)
	go func() {
		waiting <- gate(t, c, "n2", fetchgate.WithLeaseDuration(3*time.Second)).Fetch(context.Background(), ref, rec.note("n2"),
			rec.pull("n2", flow(4<<20, 20<<20, 100*time.Millisecond, nil)))
	}()
	time.Sleep(1500 * time.Millisecond) // n2 is waiting on a live holder
	rec.mu.Lock()
	early := len(rec.start)
	rec.mu.Unlock()
	if early != 0 {
		t.Fatalf("n2 pulled while n1 fetched: %v", rec.notes)
	}
	cmd.Process.Kill()
	killedAt := time.Now()
	cmd.Wait()
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}
	took := rec.start["n2"].Sub(killedAt)
	if bound := 3*time.Second + time.Second + 2*time.Second; took > bound {
		t.Errorf("n2 took over %s after the kill, bound %s", took, bound)
	}
	if n := rec.notes["n2"]; len(n) < 2 || !strings.HasPrefix(n[0], "pulling through the mirror: as n1 fetches") || !strings.Contains(n[len(n)-1], "from upstream for the fleet") {
		t.Errorf("n2 notes %q", n)
	}
	t.Logf("took over %s after the kill (lease 3s)", took.Round(time.Millisecond))
}

// TestMaxWaitBounds: a holder that keeps moving bytes keeps its lease, so
// a waiter's own bound ends its wait: it fetches from upstream itself.
func TestMaxWaitBounds(t *testing.T) {
	c := kubetest.StartT(t, manifests, users()...)
	_, ref := digestFor(t)
	stop := make(chan struct{})
	defer close(stop)
	go gate(t, c, "n1", fetchgate.WithLeaseDuration(2*time.Second)).Fetch(context.Background(), ref, nil, flow(2<<20, 0, 100*time.Millisecond, stop))
	time.Sleep(time.Second)
	rec := newRecord()
	start := time.Now()
	err := gate(t, c, "n2", fetchgate.WithLeaseDuration(2*time.Second), fetchgate.WithMaxWait(4*time.Second)).Fetch(context.Background(), ref,
		rec.note("n2"), rec.pull("n2", flow(1, 1, time.Millisecond, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if took := rec.start["n2"].Sub(start); took < 4*time.Second || took > 6*time.Second {
		t.Errorf("waited %s, bound 4s", took)
	}
	if n := rec.notes["n2"]; len(n) == 0 || !strings.Contains(n[len(n)-1], "the bound (max wait)") {
		t.Errorf("notes %q", n)
	}
}

// TestAPIServerRestartedWhileWaiting: a short outage while a node waits
// does not end the wait (the holder's fetch finishes and the waiter pulls
// through the mirror); an outage longer than the bound ends in a fallback
// to upstream within it.
func TestAPIServerRestartedWhileWaiting(t *testing.T) {
	c := kubetest.StartT(t, manifests, users()...)
	t.Run("short outage", func(t *testing.T) {
		_, ref := digestFor(t)
		const d = 20 * time.Second // longer than the restart: the holder keeps its lease
		holder := make(chan error, 1)
		go func() {
			holder <- gate(t, c, "n1", fetchgate.WithLeaseDuration(d)).Fetch(context.Background(), ref, nil,
				flow(1<<20, 200<<20, 100*time.Millisecond, nil)) // about 20 s
		}()
		time.Sleep(time.Second)
		rec := newRecord()
		waiter := make(chan error, 1)
		go func() {
			waiter <- gate(t, c, "n2", fetchgate.WithLeaseDuration(d), fetchgate.WithOutageBound(time.Minute)).Fetch(context.Background(), ref,
				rec.note("n2"), rec.pull("n2", flow(1, 1, time.Millisecond, nil)))
		}()
		time.Sleep(2 * time.Second)
		c.StopAPIServer()
		time.Sleep(3 * time.Second)
		if err := c.StartAPIServer(); err != nil {
			t.Fatal(err)
		}
		if err := <-holder; err != nil {
			t.Fatal(err)
		}
		if err := <-waiter; err != nil {
			t.Fatal(err)
		}
		if !rec.start["n2"].After(time.Now().Add(-30 * time.Second)) {
			t.Error("no pull")
		}
		if n := rec.notes["n2"]; len(n) == 0 || n[len(n)-1] != "pulling through the mirror: n1 fetched "+shortDigest(ref) {
			t.Errorf("notes %q", n)
		}
	})
	t.Run("outage past the bound", func(t *testing.T) {
		_, ref := digestFor(t)
		stop := make(chan struct{})
		defer close(stop)
		go gate(t, c, "n1", fetchgate.WithLeaseDuration(10*time.Second)).Fetch(context.Background(), ref, nil, flow(1<<20, 0, 100*time.Millisecond, stop))
		time.Sleep(time.Second)
		rec := newRecord()
		waiter := make(chan error, 1)
		go func() {
			waiter <- gate(t, c, "n2", fetchgate.WithLeaseDuration(10*time.Second), fetchgate.WithOutageBound(3*time.Second)).Fetch(context.Background(), ref,
				rec.note("n2"), rec.pull("n2", flow(1, 1, time.Millisecond, nil)))
		}()
		time.Sleep(time.Second)
		c.StopAPIServer()
		down := time.Now()
		defer func() {
			if err := c.StartAPIServer(); err != nil {
				t.Error(err)
			}
		}()
		if err := <-waiter; err != nil {
			t.Fatal(err)
		}
		// The watch sees the outage at once or at its next read: within
		// the bound plus a second of backoff and one client timeout.
		if took := rec.start["n2"].Sub(down); took > 3*time.Second+6*time.Second {
			t.Errorf("fell back %s after the outage began, bound 3s", took)
		}
		if n := rec.notes["n2"]; len(n) == 0 || !strings.Contains(n[len(n)-1], "the API server did not answer") {
			t.Errorf("notes %q", n)
		}
		t.Logf("fell back %s after the API server stopped (bound 3s)", rec.start["n2"].Sub(down).Round(time.Millisecond))
	})
}

func shortDigest(ref string) string {
	dg := ref[strings.LastIndexByte(ref, '@')+1:]
	return dg[:19] + "…"
}

// counting counts a client's requests by verb (LIST, WATCH, CREATE, …).
type counting struct {
	mu sync.Mutex
	n  map[string]int
	rt http.RoundTripper
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	verb := r.Method
	switch {
	case r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true":
		verb = "WATCH"
	case r.Method == http.MethodGet && !strings.Contains(strings.TrimPrefix(r.URL.Path, "/apis/coordination.k8s.io/v1/namespaces/"+ns+"/leases"), "/"):
		verb = "LIST"
	}
	c.mu.Lock()
	c.n[verb]++
	c.mu.Unlock()
	return c.rt.RoundTrip(r)
}

func (c *counting) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := 0
	for _, n := range c.n {
		t += n
	}
	return t
}

// TestAPILoadWhileFetching measures the requests of a holder and of a
// waiter during one fetch, against what docs/fleet.md states: the
// holder one UPDATE per renewal (a third of the lease), the waiter a LIST
// and a WATCH about every two thirds of a lease duration.
func TestAPILoadWhileFetching(t *testing.T) {
	c := kubetest.StartT(t, manifests, users()...)
	_, ref := digestFor(t)
	const d = 3 * time.Second
	counted := func(node string) (*fetchgate.Gate, *counting) {
		cfg := c.Config("gpupin:agent:" + node)
		cfg.Timeout = 5 * time.Second
		cnt := &counting{n: map[string]int{}}
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { cnt.rt = rt; return cnt }
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		g, err := fetchgate.New(cs.CoordinationV1(), ns, node, mirror(t), fetchgate.WithLeaseDuration(d))
		if err != nil {
			t.Fatal(err)
		}
		return g, cnt
	}
	hg, hc := counted("n1")
	wg, wc := counted("n2")
	holder := make(chan error, 1)
	began := time.Now()
	var took time.Duration // the holder's fetch, as it ran on this machine
	go func() {
		err := hg.Fetch(context.Background(), ref, nil, flow(1<<20, 120<<20, 100*time.Millisecond, nil)) // about 12 s
		took = time.Since(began)
		holder <- err
	}()
	time.Sleep(500 * time.Millisecond)
	rec := newRecord()
	if err := wg.Fetch(context.Background(), ref, rec.note("n2"), rec.pull("n2", flow(1, 1, time.Millisecond, nil))); err != nil {
		t.Fatal(err)
	}
	if err := <-holder; err != nil {
		t.Fatal(err)
	}
	if n := rec.notes["n2"]; len(n) == 0 || !strings.HasPrefix(n[len(n)-1], "pulling through the mirror: n1 fetched") {
		t.Fatalf("n2 notes %q", n)
	}
	hc.mu.Lock()
	hn := maps.Clone(hc.n)
	hc.mu.Unlock()
	wc.mu.Lock()
	wn := maps.Clone(wc.n)
	wc.mu.Unlock()
	fetch := took
	renewals := int(fetch / (d / 3))
	// Holder: the sweep's LIST, a LIST and a CREATE, the renewals, the mark.
	if hn["PUT"] < renewals-2 || hn["PUT"] > renewals+2 || hc.total() > renewals+6 {
		t.Errorf("holder's requests %v over %s, want about %d renewals (PUT) and a few more", hn, fetch, renewals)
	}
	// Waiter: a LIST and a WATCH at most every two thirds of a lease, and
	// the start's few.
	if perCycle := int(fetch/(2*d/3)) + 1; wn["WATCH"] > perCycle || wc.total() > 2*perCycle+4 {
		t.Errorf("waiter's requests %v over %s, want at most %d WATCHes and %d in all", wn, fetch, perCycle, 2*perCycle+4)
	}
	if wn["PUT"] != 0 {
		t.Errorf("the waiter wrote a live holder's lease: %v", wn)
	}
	t.Logf("over a %s fetch with a %s lease: holder %v, waiter %v", fetch.Round(time.Millisecond), d, hn, wn)
}

// TestReleasedWhenEveryByteIsIn: the holder's pull reports every layer
// byte in and then goes on (unpack, probe) until the waiter's pull has
// started: the waiter must be let go before the holder's pull ends.
// Where the holder's mirror died meanwhile, no peer can get the bytes
// from it: the waiter becomes the fetcher instead of being told fetched.
// Bytes in are not yet stored: the mark waits for WithStored's yes.
func TestReleasedWhenEveryByteIsIn(t *testing.T) {
	c := kubetest.StartT(t, manifests, users()...)
	for _, tc := range []struct {
		name         string
		mirrorDies   bool
		unstored     int32  // WithStored says no this many times first
		waiterNote   string // the waiter's last note starts with it
		holderState  string // the lease once both are done
		holderIsNode string
	}{
		{"mirror answers", false, 0, "pulling through the mirror: n1 fetched", fetchgate.StateFetched, "n1"},
		// Bytes counted before their commit: marked once stored.
		{"stored later", false, 3, "pulling through the mirror: n1 fetched", fetchgate.StateFetched, "n1"},
		{"mirror died", true, 0, "fetching the rest of sha256:", fetchgate.StateFetched, "n2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dg, ref := digestFor(t)
			own := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }))
			defer own.Close()
			ownMirror := fetchgate.WithMirrors(func(context.Context, string) ([]string, error) { return []string{own.URL}, nil })
			var storedAsked atomic.Int32
			stored := fetchgate.WithStored(func(context.Context, string) ([]string, bool) { return nil, storedAsked.Add(1) > tc.unstored })
			waiting := make(chan struct{})
			var waitingOnce sync.Once
			waiterPulled := make(chan struct{})
			holding := make(chan struct{})
			holderDone := make(chan error, 1)
			go func() {
				holderDone <- gate(t, c, "n1", ownMirror, stored, fetchgate.WithLeaseDuration(3*time.Second)).Fetch(context.Background(), ref, nil,
					func(ctx context.Context, p func(int64, int64), _ fetchgate.Await) error {
						close(holding)
						select {
						case <-waiting:
						case <-time.After(time.Minute):
							return fmt.Errorf("the waiter never waited")
						}
						p(10<<20, 20<<20)
						if tc.mirrorDies {
							own.CloseClientConnections()
							own.Close()
						}
						p(20<<20, 20<<20)
						// Unpack and probe: until the waiter pulls (a minute at
						// most, so that a gate that holds it back fails, not hangs).
						select {
						case <-waiterPulled:
							return nil
						case <-time.After(time.Minute):
							return fmt.Errorf("the waiter did not pull while the holder unpacked")
						}
					})
			}()
			select {
			case <-holding:
			case err := <-holderDone:
				t.Fatalf("n1 did not fetch: %v", err)
			}
			rec := newRecord()
			note := rec.note("n2")
			err := gate(t, c, "n2", fetchgate.WithLeaseDuration(3*time.Second)).Fetch(context.Background(), ref,
				func(s string) {
					note(s)
					if strings.HasPrefix(s, "pulling through the mirror: as n1") {
						waitingOnce.Do(func() { close(waiting) })
					}
				},
				func(ctx context.Context, p func(int64, int64), await fetchgate.Await) error {
					if err := await(ctx, layerDigest(0)); err != nil {
						return err
					}
					if n := storedAsked.Load(); n <= tc.unstored {
						t.Errorf("released after %d checks of the store, before it said stored", n)
					}
					close(waiterPulled)
					p(20<<20, 20<<20)
					return nil
				})
			if err != nil {
				t.Fatal(err)
			}
			if err := <-holderDone; err != nil {
				t.Fatalf("holder: %v (waiter's notes %q)", err, rec.notes["n2"])
			}
			if n := rec.notes["n2"]; len(n) == 0 || !strings.HasPrefix(n[len(n)-1], tc.waiterNote) {
				t.Errorf("waiter's notes %q, want the last to start %q", n, tc.waiterNote)
			}
			l, err := nodeClient(t, c, "n0").CoordinationV1().Leases(ns).Get(context.Background(), fetchgate.LeaseName(dg, 0), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if h := l.Spec.HolderIdentity; h == nil || *h != tc.holderIsNode || l.Annotations[fetchgate.AnnotState] != tc.holderState {
				t.Errorf("lease: holder %v, annotations %v; want %s, %s", h, l.Annotations, tc.holderIsNode, tc.holderState)
			}
		})
	}
}
