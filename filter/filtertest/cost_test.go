package filtertest

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
)

// The filter sends what a rule's cost_from reads: the body's size (0 when
// the headers end the request, Content-Length when it is one plain number,
// nothing when unknown) and the configured cost headers, a repeated one
// joined so that the service refuses it, a long one cut.
func TestCostSignalsInTheCheck(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0},"cost_headers":["x-tokens","x-units"]}`, 1)
	long := strings.Repeat("9", 100)
	for _, tc := range []struct {
		name    string
		r       req
		bytes   *int64
		headers map[string]string
	}{
		{"no body", req{}, ptr(int64(0)), nil},
		{"content-length", req{body: true, headers: wasmhost.Headers{{"content-length", "1234"}}}, ptr(int64(1234)), nil},
		{"chunked", req{body: true, headers: wasmhost.Headers{{"transfer-encoding", "chunked"}}}, nil, nil},
		{"signed length", req{body: true, headers: wasmhost.Headers{{"content-length", "+5"}}}, nil, nil},
		{"two lengths", req{body: true, headers: wasmhost.Headers{{"content-length", "5"}, {"content-length", "6"}}}, nil, nil},
		{"a cost header", req{headers: wasmhost.Headers{{"X-Tokens", "250"}, {"x-other", "1"}}}, ptr(int64(0)), map[string]string{"x-tokens": "250"}},
		{"a repeated cost header", req{headers: wasmhost.Headers{{"x-tokens", "1"}, {"x-units", "2"}, {"x-tokens", "500"}}}, ptr(int64(0)), map[string]string{"x-tokens": "1,500", "x-units": "2"}},
		{"a long cost header", req{headers: wasmhost.Headers{{"x-units", long}}}, ptr(int64(0)), map[string]string{"x-units": long[:64]}},
		// Upstreams that read headers CGI-style (PHP, Rack) see X_Units as
		// X-Units: so does the filter, and both spellings are a repeat.
		{"a cost header spelled with underscores", req{headers: wasmhost.Headers{{"X_Units", "10"}}}, ptr(int64(0)), map[string]string{"x-units": "10"}},
		{"both spellings", req{headers: wasmhost.Headers{{"x-units", "1"}, {"x_units", "10"}}}, ptr(int64(0)), map[string]string{"x-units": "1,10"}},
	} {
		s, _ := e.start(tc.r)
		_, body := e.callout(0)
		if !reflect.DeepEqual(body.BodyBytes, tc.bytes) || !reflect.DeepEqual(body.CostHeaders, tc.headers) {
			t.Errorf("%s: sent body_bytes %v, cost_headers %v; want %v, %v", tc.name, deref(body.BodyBytes), body.CostHeaders, deref(tc.bytes), tc.headers)
		}
		e.answer(0, "200", decision(true, 5, 0, 0))
		_ = s
	}
	// Cost headers are configured as lower-case names, at most 8, once each.
	ctx := context.Background()
	for cfg, want := range map[string]string{
		`{"cost_headers":["X-Tokens"]}`:                          "cost_headers[0]",
		`{"cost_headers":["a","a"]}`:                             "cost_headers[1]",
		`{"cost_headers":["a b"]}`:                               "cost_headers[0]",
		`{"cost_headers":["a","b","c","d","e","f","g","h","i"]}`: "cost_headers:",
	} {
		h, err := wasmhost.New(ctx, wasmBytes, wasmhost.Options{PluginConfig: []byte(cfg), Clusters: []string{"controlsvc"}, CompilationCache: compCache, WASI: envoyWASI})
		if err != nil {
			t.Fatal(err)
		}
		_, err = h.NewVM(ctx)
		h.Close(ctx)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want a refusal naming %s", cfg, err, want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}
