package herd

import (
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// APICount counts the requests one client makes to the API server, by
// verb as the API server names them (LIST, WATCH, GET, CREATE, UPDATE,
// PATCH, DELETE) and resource: a counting wrapper around a rest.Config's
// transport (cfg.Wrap(c.Wrap)). A WATCH counts once, when it starts; the
// events it then carries are not requests.
type APICount struct {
	mu     sync.Mutex
	counts map[string]int // "LIST leases", "CREATE leases 409", …
	first  time.Time
	last   time.Time
}

// NewAPICount is an empty count.
func NewAPICount() *APICount { return &APICount{counts: map[string]int{}} }

// Wrap is a transport.WrapperFunc: give it to rest.Config.Wrap.
func (c *APICount) Wrap(rt http.RoundTripper) http.RoundTripper {
	return countingRT{c: c, rt: rt}
}

type countingRT struct {
	c  *APICount
	rt http.RoundTripper
}

func (r countingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.rt.RoundTrip(req)
	key := Verb(req) + " " + resource(req.URL.Path)
	if err != nil {
		key += " error"
	} else if resp.StatusCode >= 300 {
		key += " " + http.StatusText(resp.StatusCode)
	}
	r.c.mu.Lock()
	now := time.Now()
	if r.c.first.IsZero() {
		r.c.first = now
	}
	r.c.last = now
	r.c.counts[key]++
	r.c.mu.Unlock()
	return resp, err
}

// Verb is the API server's name for what req asks (its request info's
// verb, upper-cased).
func Verb(req *http.Request) string {
	switch req.Method {
	case http.MethodGet:
		if w := req.URL.Query().Get("watch"); w == "true" || w == "1" {
			return "WATCH"
		}
		if collection(req.URL.Path) {
			return "LIST"
		}
		return "GET"
	case http.MethodPost:
		return "CREATE"
	case http.MethodPut:
		return "UPDATE"
	case http.MethodPatch:
		return "PATCH"
	case http.MethodDelete:
		return "DELETE"
	}
	return req.Method
}

// parts splits /api(s)/[group/]version/[namespaces/NS/]resource[/name…]
// into resource and the rest after it.
func parts(path string) (res string, rest []string) {
	seg := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(seg) >= 2 && seg[0] == "api":
		seg = seg[2:]
	case len(seg) >= 3 && seg[0] == "apis":
		seg = seg[3:]
	default:
		return path, nil
	}
	if len(seg) >= 3 && seg[0] == "namespaces" {
		seg = seg[2:]
	}
	if len(seg) == 0 {
		return "", nil
	}
	return seg[0], seg[1:]
}

func resource(path string) string { r, _ := parts(path); return r }

func collection(path string) bool { _, rest := parts(path); return len(rest) == 0 }

// Reset starts the count again.
func (c *APICount) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts = map[string]int{}
	c.first, c.last = time.Time{}, time.Time{}
}

// Total is the number of requests so far.
func (c *APICount) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.counts {
		n += v
	}
	return n
}

// Counts is a copy of the count by "VERB resource[ status]".
func (c *APICount) Counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// String is the count as "LIST leases 2, CREATE leases 1, …", in order.
func (c *APICount) String() string {
	m := c.Counts()
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k)
		b.WriteString(" ")
		b.WriteString(strconv.Itoa(m[k]))
	}
	return b.String()
}
