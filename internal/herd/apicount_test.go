package herd

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestAPICountVerbs(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusConflict)
		}
	}))
	defer srv.Close()
	c := NewAPICount()
	client := &http.Client{Transport: c.Wrap(http.DefaultTransport)}
	const leases = "/apis/coordination.k8s.io/v1/namespaces/gpupin-system/leases"
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, leases + "?labelSelector=x"},
		{http.MethodGet, leases + "?watch=true&resourceVersion=1"},
		{http.MethodGet, leases + "/gpupin-fetch-ab-0"},
		{http.MethodPost, leases},
		{http.MethodPut, leases + "/gpupin-fetch-ab-0"},
		{http.MethodPut, leases + "/gpupin-fetch-ab-0"},
		{http.MethodDelete, leases + "/gpupin-fetch-ab-0"},
		{http.MethodGet, "/api/v1/nodes"},
	} {
		req, _ := http.NewRequest(r.method, srv.URL+r.path, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	want := map[string]int{
		"LIST leases": 1, "WATCH leases": 1, "GET leases": 1, "CREATE leases Conflict": 1,
		"UPDATE leases": 2, "DELETE leases": 1, "LIST nodes": 1,
	}
	got := c.Counts()
	if len(got) != len(want) {
		t.Errorf("counts %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	if c.Total() != 8 {
		t.Errorf("total %d, want 8", c.Total())
	}
	c.Reset()
	if c.Total() != 0 {
		t.Errorf("after Reset: %d", c.Total())
	}
}
