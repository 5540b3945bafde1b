package server

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// maxJSON bounds a JSON request body.
const maxJSON = 1 << 20

type handler struct {
	Deps
	d   Daemon // Deps.Daemon
	log *slog.Logger
	// tenancy and policy hold platform keys (NewPlatform); nil on the
	// operator's socket.
	tenancy *Tenancy
	policy  *bundle.Policy
}

func (h *handler) logged(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		h.log.Debug("api", "method", r.Method, "path", r.URL.Path, "status", sw.status, "took", time.Since(start))
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func (h *handler) reply(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// decode reads a JSON body strictly.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: request body: %w", answers.ErrInvalid, err)
	}
	return nil
}

func (h *handler) host(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, hostOf(h.d.Host()))
}

func (h *handler) importImage(w http.ResponseWriter, r *http.Request) {
	img, err := h.d.ImportImage(r.Context(), r.Body, r.URL.Query().Get("name"))
	h.reply(w, r, api.Image{Name: img.Name, Digest: img.Digest}, err)
}

func (h *handler) start(w http.ResponseWriter, r *http.Request) {
	var req api.RunRequest
	if err := decode(w, r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	if key, ok := platformOf(r); ok {
		h.platformStart(w, r, key, req)
		return
	}
	run, err := h.d.StartBooked(r.Context(), req.ID, req.Unit, req.Grants, answers.Starting{Secrets: req.Secrets})
	h.reply(w, r, runOf(run), err)
}

func (h *handler) list(w http.ResponseWriter, r *http.Request) {
	var phase *record.Phase
	switch p := r.URL.Query().Get("phase"); p {
	case "":
	case "executing", "running":
		phase = ptr(record.PhaseExecuting)
	case "parked":
		phase = ptr(record.PhaseParked)
	case "closed":
		phase = ptr(record.PhaseClosed)
	default:
		h.fail(w, r, fmt.Errorf("%w: phase %q: use executing, parked or closed", answers.ErrInvalid, p))
		return
	}
	runs, err := h.d.List(phase)
	if keep := h.keepOf(r); keep != nil {
		runs = slices.DeleteFunc(runs, func(s answers.Summary) bool { return !keep(s.ID) })
	}
	h.reply(w, r, runsOf(runs), err)
}

func (h *handler) show(w http.ResponseWriter, r *http.Request) {
	s, err := show(h.d, h.Store, r.PathValue("id"))
	h.reply(w, r, s, err)
}

func (h *handler) park(w http.ResponseWriter, r *http.Request) {
	p, err := h.d.Park(r.Context(), r.PathValue("id"))
	h.reply(w, r, parkOf(p), err)
}

func (h *handler) resume(w http.ResponseWriter, r *http.Request) {
	var req api.ResumeRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	res, err := h.d.Resume(r.Context(), r.PathValue("id"), req.Secrets)
	h.reply(w, r, resumeOf(res), err)
}

func (h *handler) close(w http.ResponseWriter, r *http.Request) {
	var req api.CloseRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	run, err := h.d.Close(r.Context(), r.PathValue("id"), req.Reason)
	h.reply(w, r, runOf(run), err)
}

func (h *handler) migrate(w http.ResponseWriter, r *http.Request) {
	var req api.MigrateRequest
	if err := decode(w, r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	to, err := hostKey(req.To)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	h.moved(w, r, id, h.Fleet.Migrate(r.Context(), id, to))
}

func (h *handler) adopt(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	h.moved(w, r, id, h.Fleet.Adopt(r.Context(), id))
}

// moved answers a migration, an adoption or a received run: the run as it
// is now, or why it did not move.
func (h *handler) moved(w http.ResponseWriter, r *http.Request, id string, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	run, err := h.d.Run(id)
	h.reply(w, r, runOf(run), err)
}

func (h *handler) drain(w http.ResponseWriter, r *http.Request) {
	var req api.DrainRequest
	if err := decode(w, r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	if req.Parallel < 0 || req.Parallel > 64 {
		h.fail(w, r, fmt.Errorf("%w: parallel %d: use 1 to 64, or 0 for the default", answers.ErrInvalid, req.Parallel))
		return
	}
	if req.Parallel == 0 {
		req.Parallel = member.DefaultDrainParallel
	}
	var to []record.Address
	for _, k := range req.To {
		a, err := hostKey(k)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		to = append(to, a)
	}
	runs, err := h.Fleet.Drain(r.Context(), to, req.Parallel)
	h.reply(w, r, drainOf(runs), err)
}

// hostKey reads a host key id (trust.ParseKey).
func hostKey(text string) (record.Address, error) { return trust.ParseKey(text) }

func (h *handler) gc(w http.ResponseWriter, r *http.Request) {
	var req api.GCRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	var keep, grace *time.Duration
	if req.RetentionNS != nil {
		k := time.Duration(*req.RetentionNS)
		keep = &k
	}
	if req.GraceNS != nil {
		g := time.Duration(*req.GraceNS)
		grace = &g
	}
	out, err := h.Collector.GC(r.Context(), keep, grace)
	h.reply(w, r, gcOf(out), err)
}

func (h *handler) pin(w http.ResponseWriter, r *http.Request) {
	run, err := h.d.Pin(r.PathValue("id"), r.Method == http.MethodPost)
	h.reply(w, r, runOf(run), err)
}

func (h *handler) verify(w http.ResponseWriter, r *http.Request) {
	v, err := h.d.Verify(r.Context(), r.PathValue("id"))
	h.reply(w, r, verifyOf(v), err)
}

func (h *handler) waitProof(w http.ResponseWriter, r *http.Request) {
	rec, err := h.Store.Record(r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.reply(w, r, waitProofOf(rec.WaitProof()), nil)
}

func (h *handler) record(w http.ResponseWriter, r *http.Request) {
	rec, err := h.Store.Record(r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(rec.EncodeWire())
}

func (h *handler) export(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	// Check first, so that a run that cannot be exported gets an error
	// body, not a truncated tar behind a 200.
	if err := h.Exporter.Exportable(id); err != nil {
		h.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	// Every export hands the run off unless ?handoff=false asks for a copy.
	handoff := r.URL.Query().Get("handoff") != "false"
	if err := h.Exporter.Export(r.Context(), id, w, handoff); err != nil {
		// The status is sent; the client sees a truncated bundle, which
		// import refuses. Abort the connection so it cannot look whole.
		h.log.Error("export", "run", id, "err", err)
		panic(http.ErrAbortHandler)
	}
}

func (h *handler) importBundle(w http.ResponseWriter, r *http.Request) {
	im, err := h.d.ImportWith(r.Context(), r.Body, r.URL.Query().Get("id"), r.URL.Query().Get("reclaim") == "true")
	h.reply(w, r, importOf(im), err)
}

func (h *handler) trustList(w http.ResponseWriter, r *http.Request) {
	keys, err := h.Keys.List()
	h.reply(w, r, keysOf(keys), err)
}

func (h *handler) trustAdd(w http.ResponseWriter, r *http.Request) {
	var req api.TrustedKey
	if err := decode(w, r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	k, err := h.Keys.Add(req.Key, req.Name)
	h.reply(w, r, keyOf(k), err)
}

func (h *handler) trustRemove(w http.ResponseWriter, r *http.Request) {
	err := h.Keys.Remove(r.PathValue("key"))
	h.reply(w, r, struct{}{}, err)
}

func ptr[T any](v T) *T { return &v }
