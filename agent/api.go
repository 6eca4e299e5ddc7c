package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/provision"
)

// DefaultSocket is where `gpupin agent` serves its API.
const DefaultSocket = "/run/gpupin/agent.sock"

// maxBody bounds a request body: wants and overrides are small.
const maxBody = 1 << 20

// StatusResponse is GET /v1/status.
type StatusResponse struct {
	Engines  []provision.Status `json:"engines"`
	InFlight int                `json:"in_flight"`
	// ForeignLocalNames counts the records of a node-local name that
	// gpupin did not write on this node, found (and replaced or removed)
	// since the agent started; LastForeign are the last few.
	ForeignLocalNames int64           `json:"foreign_local_names,omitempty"`
	LastForeign       []ForeignRecord `json:"last_foreign,omitempty"`
}

// WantsRequest is the body of PUT /v1/wants (and its answer).
type WantsRequest struct {
	Wants []provision.Want `json:"wants"`
}

// OverrideRequest is the body of PUT /v1/overrides/{engine}.
type OverrideRequest struct {
	Override *string `json:"override"`
}

// OverrideResponse answers PUT /v1/overrides/{engine}.
type OverrideResponse struct {
	Engine   string `json:"engine"`
	Override string `json:"override"`
	Kind     string `json:"kind"`
	// Wanted says whether a wanted engine has this name now; when not,
	// Note says which wants have no name yet: the override is kept, and
	// applies to a want from its first plan that names it so.
	Wanted bool   `json:"wanted"`
	Note   string `json:"note,omitempty"`
}

// PinsResponse is GET /v1/pins.
type PinsResponse struct {
	Pins []containerd.Pin `json:"pins"`
}

// ErrorResponse is every error's body.
type ErrorResponse struct {
	Error string `json:"error"`
}

// Handler serves the agent's API. Every answer is JSON, errors included.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/status", only(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		n, last := a.Foreign()
		writeJSON(w, http.StatusOK, StatusResponse{Engines: a.Status(), InFlight: a.loop.InFlight(), ForeignLocalNames: n, LastForeign: last})
	}))
	mux.HandleFunc("/v1/pins", only(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		pins, err := a.Pins(r.Context())
		if err != nil {
			writeError(w, http.StatusInternalServerError, err)
			return
		}
		if pins == nil {
			pins = []containerd.Pin{}
		}
		writeJSON(w, http.StatusOK, PinsResponse{Pins: pins})
	}))
	mux.HandleFunc("/v1/wants", only(http.MethodPut, func(w http.ResponseWriter, r *http.Request) {
		var req WantsRequest
		if !decode(w, r, &req) {
			return
		}
		if req.Wants == nil {
			writeError(w, http.StatusBadRequest, errors.New(`body needs "wants": a list, empty to want nothing`))
			return
		}
		if err := a.SetWants(req.Wants); err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, WantsRequest{Wants: a.loop.Wants()})
	}))
	mux.HandleFunc("/v1/overrides/{engine}", only(http.MethodPut, func(w http.ResponseWriter, r *http.Request) {
		engine := r.PathValue("engine")
		var req OverrideRequest
		if !decode(w, r, &req) {
			return
		}
		if req.Override == nil {
			writeError(w, http.StatusBadRequest, errors.New(`body needs "override": auto, none, a variant name or an image reference`))
			return
		}
		set, err := a.SetOverride(engine, *req.Override)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		resp := OverrideResponse{Engine: engine, Override: set.Override.String(), Kind: string(set.Override.Kind), Wanted: set.Wanted}
		if !set.Wanted {
			resp.Note = overrideNote(engine, set)
		}
		writeJSON(w, http.StatusOK, resp)
	}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Errorf("no such endpoint %s; the API is GET /v1/status, PUT /v1/wants, PUT /v1/overrides/{engine}, GET /v1/pins", r.URL.Path))
	})
	return mux
}

// only answers other methods with 405 and a JSON body (ServeMux's own
// 405 is plain text).
func only(method string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method {
			w.Header().Set("Allow", method)
			writeError(w, http.StatusMethodNotAllowed, fmt.Errorf("%s %s: method not allowed; use %s", r.Method, r.URL.Path, method))
			return
		}
		h(w, r)
	}
}

// decode reads a JSON body strictly; it answers 400 itself when it cannot.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("bad JSON body: %w", err))
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, http.StatusBadRequest, errors.New("bad JSON body: more than one JSON value"))
		return false
	}
	return true
}

func statusOf(err error) int {
	var in *InputError
	if errors.As(err, &in) {
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// overrideNote says why an override names no wanted engine yet, and when
// it applies.
func overrideNote(engine string, set OverrideSet) string {
	named := "none"
	if len(set.Named) > 0 {
		named = strings.Join(set.Named, ", ")
	}
	note := fmt.Sprintf("no wanted engine is named %s now (named: %s)", engine, named)
	if len(set.Unnamed) > 0 {
		note += fmt.Sprintf("; not named yet, their images not read yet: %s", strings.Join(set.Unnamed, ", "))
	}
	return note + "; the override is kept, and applies to a want from its first plan that names its engine " + engine
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, ErrorResponse{Error: err.Error()})
}

// ListenUnix listens on a unix socket at path: its directory is made, a
// socket left by a process that died is replaced, and a socket another
// agent still answers on is refused. Only root and the socket's group may
// connect (0660): the API changes what runs on the node.
func ListenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another agent is listening there", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket mode: %w", err)
	}
	return ln, nil
}
