package server

import "net/http"

// routeCalls adds the platform's side of outward calls.
func routeCalls(mux *http.ServeMux, h *handler) {}
