package api

import _ "embed"

//go:embed openapi.json
var openAPI []byte

// OpenAPI is the API's description, an OpenAPI 3.1 document (JSON): every
// route of the client API with what a platform key is held to
// (x-platform), the bodies, the error codes, the events stream, and the
// host-to-host routes (tag peer). The daemon serves it at GET
// /v1/openapi.json. The caller must not modify the slice.
func OpenAPI() []byte { return openAPI }
