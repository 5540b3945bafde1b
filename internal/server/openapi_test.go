package server

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/fleet/peer"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/platform"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The Go types of each route's bodies, as the OpenAPI document names
// them (components/schemas): request, then response; nil where the body
// is not JSON of a pkg/api type (a byte stream, any JSON, none).
var routeTypes = map[string][2]any{
	"GET /v1/host":                           {nil, api.Host{}},
	"POST /v1/images":                        {nil, api.Image{}},
	"POST /v1/runs":                          {api.RunRequest{}, api.Run{}},
	"GET /v1/runs":                           {nil, []api.Run{}},
	"GET /v1/runs/{id}":                      {nil, api.Show{}},
	"POST /v1/runs/{id}/park":                {nil, api.Park{}},
	"POST /v1/runs/{id}/resume":              {api.ResumeRequest{}, api.Resume{}},
	"POST /v1/runs/{id}/close":               {api.CloseRequest{}, api.Run{}},
	"POST /v1/runs/{id}/migrate":             {api.MigrateRequest{}, api.Run{}},
	"POST /v1/drain":                         {api.DrainRequest{}, api.Drain{}},
	"POST /v1/park-all":                      {api.ParkAllRequest{}, api.ParkAll{}},
	"POST /v1/runs/{id}/adopt":               {nil, api.Run{}},
	"GET /v1/runs/{id}/verify":               {nil, api.Verify{}},
	"GET /v1/runs/{id}/wait-proof":           {nil, api.WaitProof{}},
	"GET /v1/runs/{id}/record":               {nil, nil},
	"GET /v1/runs/{id}/export":               {nil, nil},
	"GET /v1/runs/{id}/logs":                 {nil, api.LogLine{}},
	"POST /v1/import":                        {nil, api.Import{}},
	"POST /v1/gc":                            {api.GCRequest{}, api.GC{}},
	"POST /v1/runs/{id}/pin":                 {nil, api.Run{}},
	"DELETE /v1/runs/{id}/pin":               {nil, api.Run{}},
	"GET /v1/trust":                          {nil, []api.TrustedKey{}},
	"POST /v1/trust":                         {api.TrustedKey{}, api.TrustedKey{}},
	"DELETE /v1/trust/{key}":                 {nil, nil},
	"GET /v1/calls":                          {nil, []api.Call{}},
	"POST /v1/runs/{id}/calls/{call}/result": {nil, api.PostResult{}},
	"GET /v1/events":                         {nil, api.Event{}},
	"GET /metrics":                           {nil, nil},
	"GET /v1/openapi.json":                   {nil, nil},
	"GET /v1/objects/{addr}":                 {nil, nil},
	"POST /v1/objects/missing":               {transfer.MissingRequest{}, transfer.MissingResponse{}},
	"GET /v1/records/{id}":                   {nil, nil},
	"POST /v1/migrations":                    {peer.Migration{}, peer.Handed{}},
	"POST /v1/migrations/done":               {peer.Done{}, nil},
	"POST /v1/migrations/held":               {peer.Held{}, peer.HeldAnswer{}},
	"POST /v1/migrations/expect":             {peer.Expected{}, nil},
	"POST /v1/placement":                     {peer.OfferRequest{}, peer.OfferAnswer{}},
}

// openAPIDoc is the part of the document the test reads.
type openAPIDoc struct {
	Paths      map[string]map[string]openAPIOp `json:"paths"`
	Components struct {
		Schemas map[string]openAPISchema `json:"schemas"`
	} `json:"components"`
}

type openAPIOp struct {
	Tags        []string `json:"tags"`
	Platform    string   `json:"x-platform"`
	RequestBody *struct {
		Content map[string]struct{ Schema openAPISchema } `json:"content"`
	} `json:"requestBody"`
	Responses map[string]struct {
		Content map[string]struct{ Schema openAPISchema } `json:"content"`
	} `json:"responses"`
}

type openAPISchema struct {
	Ref                  string                   `json:"$ref"`
	Type                 string                   `json:"type"`
	Items                *openAPISchema           `json:"items"`
	Properties           map[string]openAPISchema `json:"properties"`
	AdditionalProperties *openAPISchema           `json:"additionalProperties"`
	Enum                 []string                 `json:"enum"`
}

func readOpenAPI(t *testing.T) openAPIDoc {
	t.Helper()
	var doc openAPIDoc
	if err := json.Unmarshal(api.OpenAPI(), &doc); err != nil {
		t.Fatalf("pkg/api/openapi.json: %v", err)
	}
	return doc
}

// The OpenAPI document (pkg/api/openapi.json) and the code say the same:
// the same routes as the route table, each with its platform gate, and
// the peer routes in their own section; every error code, and no other;
// and each body's schema with exactly the json fields of its Go type,
// down every nested type.
func TestOpenAPI(t *testing.T) {
	doc := readOpenAPI(t)
	var client, peers []string
	ops := map[string]openAPIOp{}
	for path, methods := range doc.Paths {
		for method, op := range methods {
			p := strings.ToUpper(method) + " " + path
			ops[p] = op
			if slices.Contains(op.Tags, "peer") {
				peers = append(peers, p)
			} else {
				client = append(client, p)
			}
		}
	}

	// Routes: the client API's, against the table, each with its gate.
	var table []string
	for _, rt := range routes {
		table = append(table, rt.pattern)
		if op, ok := ops[rt.pattern]; ok && op.Platform != rt.platform.String() {
			t.Errorf("%s: x-platform %q, the table's gate is %q", rt.pattern, op.Platform, rt.platform)
		}
	}
	sameSet(t, "routes (document, routes.go's table)", client, table)
	// The peer routes: each under one of PeerRoutes, each of those
	// described.
	for _, p := range peers {
		_, path, _ := strings.Cut(p, " ")
		if !slices.ContainsFunc(PeerRoutes, func(pre string) bool { return strings.HasPrefix(path, pre) }) {
			t.Errorf("peer route %s is under none of PeerRoutes %v", p, PeerRoutes)
		}
	}
	for _, pre := range PeerRoutes {
		if !slices.ContainsFunc(peers, func(p string) bool { _, path, _ := strings.Cut(p, " "); return strings.HasPrefix(path, pre) }) {
			t.Errorf("PeerRoutes' %s has no route in the document's peer section", pre)
		}
	}

	// Codes: the Error schema's enum against pkg/api's Code* constants
	// (daemon_unreachable too: a client may answer it).
	errSchema, ok := doc.Components.Schemas["Error"]
	if !ok {
		t.Fatal("no Error schema")
	}
	sameSet(t, "error codes (document, pkg/api)", errSchema.Properties["code"].Enum, apiCodes(t))

	// Bodies: each route's schemas against its Go types (each type once).
	seen := map[reflect.Type]bool{}
	for p, op := range ops {
		types, ok := routeTypes[p]
		if !ok {
			t.Errorf("%s: not in the test's routeTypes", p)
			continue
		}
		var req, resp *openAPISchema
		if op.RequestBody != nil {
			if c, ok := op.RequestBody.Content["application/json"]; ok {
				req = &c.Schema
			}
		}
		for _, media := range []string{"application/json", "application/x-ndjson"} {
			if c, ok := op.Responses["200"].Content[media]; ok {
				resp = &c.Schema
			}
		}
		checkBody(t, doc, p+" request", req, types[0], seen)
		checkBody(t, doc, p+" response", resp, types[1], seen)
	}
	for p := range routeTypes {
		if _, ok := ops[p]; !ok {
			t.Errorf("routeTypes has %s, the document does not", p)
		}
	}
}

// checkBody checks a route's body schema against its Go type v (nil: the
// body is not a Go type's JSON; a schema is then a byte stream or any
// value, and names no component).
func checkBody(t *testing.T, doc openAPIDoc, what string, s *openAPISchema, v any, seen map[reflect.Type]bool) {
	t.Helper()
	if v == nil {
		if s != nil && (s.Ref != "" || s.Items != nil && s.Items.Ref != "") {
			t.Errorf("%s: the document names a schema, the test's routeTypes none", what)
		}
		return
	}
	if s == nil {
		t.Errorf("%s: the document describes no JSON body, the code has %T", what, v)
		return
	}
	checkSchema(t, doc, what, *s, reflect.TypeOf(v), seen)
}

// checkSchema checks s against the Go type typ: a struct's schema (a
// $ref) has exactly its json fields, each checked in turn.
func checkSchema(t *testing.T, doc openAPIDoc, what string, s openAPISchema, typ reflect.Type, seen map[reflect.Type]bool) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if s.Ref != "" {
		name := strings.TrimPrefix(s.Ref, "#/components/schemas/")
		c, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("%s: %s is not in components/schemas", what, s.Ref)
			return
		}
		s = c
		what = name
	}
	switch {
	case typ == reflect.TypeFor[json.RawMessage]() || typ.Kind() == reflect.Struct && typ.PkgPath() == "time":
		return
	case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.Uint8:
		// encoding/json writes a []byte as a base64 string.
		if s.Items != nil {
			t.Errorf("%s: %s is a base64 string in JSON, an array in the document", what, typ)
		}
		return
	case typ.Kind() == reflect.Slice:
		if s.Items == nil {
			t.Errorf("%s: %s is an array in Go, not in the document", what, typ)
			return
		}
		checkSchema(t, doc, what+"[]", *s.Items, typ.Elem(), seen)
	case typ.Kind() == reflect.Map:
		if s.AdditionalProperties == nil {
			t.Errorf("%s: %s is a map in Go, not in the document", what, typ)
			return
		}
		checkSchema(t, doc, what+"{}", *s.AdditionalProperties, typ.Elem(), seen)
	case typ.Kind() == reflect.Struct:
		if seen[typ] {
			return
		}
		seen[typ] = true
		fields := map[string]reflect.Type{}
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			fields[name] = f.Type
		}
		var goNames, docNames []string
		for n := range fields {
			goNames = append(goNames, n)
		}
		for n := range s.Properties {
			docNames = append(docNames, n)
		}
		sameSet(t, what+" fields (document, "+typ.String()+")", docNames, goNames)
		for n, ft := range fields {
			if ps, ok := s.Properties[n]; ok {
				checkSchema(t, doc, what+"."+n, ps, ft, seen)
			}
		}
	}
}

// apiCodes are the values of pkg/api's Code* constants, read from its
// source.
func apiCodes(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../pkg/api/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, "Code") || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Fatalf("%s is not a string literal", n.Name)
					}
					v, _ := strconv.Unquote(lit.Value)
					codes = append(codes, v)
				}
			}
		}
	}
	if len(codes) < 10 {
		t.Fatalf("read %d codes from pkg/api: the reading is broken", len(codes))
	}
	return codes
}

// sameSet fails unless doc and code hold the same names, saying which
// are in one only.
func sameSet(t *testing.T, what string, doc, code []string) {
	t.Helper()
	in := func(s []string) map[string]bool {
		m := map[string]bool{}
		for _, v := range s {
			m[v] = true
		}
		return m
	}
	d, c := in(doc), in(code)
	var onlyDoc, onlyCode []string
	for v := range d {
		if !c[v] {
			onlyDoc = append(onlyDoc, v)
		}
	}
	for v := range c {
		if !d[v] {
			onlyCode = append(onlyCode, v)
		}
	}
	sort.Strings(onlyDoc)
	sort.Strings(onlyCode)
	if len(onlyDoc)+len(onlyCode) > 0 {
		t.Errorf("%s: only in the document %q; only in the code %q", what, onlyDoc, onlyCode)
	}
}

// GET /v1/openapi.json answers the document, to the operator and to a
// platform key alike.
func TestOpenAPIServed(t *testing.T) {
	books, err := platform.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h := &handler{log: slog.New(slog.DiscardHandler), tenancy: &Tenancy{Books: books}}
	key := func(*http.Request) (record.Address, bool) { return record.Sum([]byte("platform A")), true }
	for name, m := range map[string]http.Handler{"operator": h.mux(Operator, routes, nil), "platform": h.mux(Platform, routes, key)} {
		w := httptest.NewRecorder()
		m.ServeHTTP(w, httptest.NewRequest("GET", "/v1/openapi.json", nil))
		if w.Code != http.StatusOK || !bytes.Equal(w.Body.Bytes(), api.OpenAPI()) || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s: status %d, %d bytes, %q: want the document", name, w.Code, w.Body.Len(), w.Header().Get("Content-Type"))
		}
	}
}

// The TypeScript client (clients/typescript) and the document agree:
// each interface of runrecordd.d.ts has exactly the properties of its
// schema (Error is ApiError), every schema but the peer routes' has its
// interface, and every route the client calls (its routes table) is in
// the document, logs excepted until the daemon serves it.
func TestTypeScriptClient(t *testing.T) {
	doc := readOpenAPI(t)
	dts, err := os.ReadFile("../../clients/typescript/runrecordd.d.ts")
	if err != nil {
		t.Fatal(err)
	}
	iface := regexp.MustCompile(`(?m)^export interface (\w+) \{\n((?:  .*\n)*)\}`)
	prop := regexp.MustCompile(`(?m)^  "?([\w-]+)"?\??: `)
	seen := map[string]bool{}
	for _, m := range iface.FindAllStringSubmatch(string(dts), -1) {
		name := m[1]
		if name == "ApiError" {
			name = "Error"
		}
		s, ok := doc.Components.Schemas[name]
		if !ok {
			continue // the client's own (LogOptions)
		}
		seen[name] = true
		var props, want []string
		for _, p := range prop.FindAllStringSubmatch(m[2], -1) {
			props = append(props, p[1])
		}
		for p := range s.Properties {
			want = append(want, p)
		}
		sameSet(t, "runrecordd.d.ts "+m[1]+" (the code: the interface)", want, props)
	}
	for name := range doc.Components.Schemas {
		if !seen[name] && !strings.HasPrefix(name, "Peer") {
			t.Errorf("schema %s has no interface in runrecordd.d.ts", name)
		}
	}
	js, err := os.ReadFile("../../clients/typescript/runrecordd.js")
	if err != nil {
		t.Fatal(err)
	}
	used := regexp.MustCompile(`"((?:GET|POST|DELETE) /v1/[^"]*)"`).FindAllStringSubmatch(string(js), -1)
	if len(used) < 10 {
		t.Fatalf("read %d routes from runrecordd.js: the reading is broken", len(used))
	}
	for _, u := range used {
		method, path, _ := strings.Cut(u[1], " ")
		if _, ok := doc.Paths[path][strings.ToLower(method)]; !ok && u[1] != "GET /v1/runs/{id}/logs" {
			t.Errorf("runrecordd.js calls %s, which the document does not have", u[1])
		}
	}
}
