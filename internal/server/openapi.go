package server

import (
	"net/http"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// openAPI serves the API's description (api.OpenAPI).
func (h *handler) openAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(api.OpenAPI())
}
