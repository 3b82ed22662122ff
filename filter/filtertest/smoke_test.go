package filtertest

import (
	"context"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/wasmhost"
)

func TestSmoke(t *testing.T) {
	ctx := context.Background()
	h, err := wasmhost.New(ctx, wasmBytes, wasmhost.Options{PluginConfig: []byte(`{"control_cluster":"controlsvc"}`), Clusters: []string{"controlsvc"}, CompilationCache: compCache})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(ctx)
	vm, err := h.NewVM(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := vm.NewStream(ctx, wasmhost.Headers{{":method", "GET"}, {":path", "/x?y=1"}, {":authority", "api"}, {"x-tollgate-identity", "forged"}}, map[string]string{"source.address": "192.0.2.7:5555"})
	if err != nil {
		t.Fatal(err)
	}
	act, err := s.OnRequestHeaders(ctx, true)
	if err != nil || act != wasmhost.Pause {
		t.Fatalf("action %v, %v; logs %v", act, err, vm.Logs())
	}
	cs := vm.PendingCallouts()
	if len(cs) != 1 {
		t.Fatalf("callouts %v; logs %v", cs, vm.Logs())
	}
	t.Logf("callout: %s %v %s", cs[0].Cluster, cs[0].Headers, cs[0].Body)
	err = vm.Respond(ctx, cs[0].Token, wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "200"}}, Body: []byte(`{"allowed":true,"limit":100,"remaining":90,"reset_at":1800000000,"retry_after":0,"strategy":"token_bucket","window_seconds":60,"rule_id":"tier_free","lease":{"granted":9,"ttl_ms":1000},"identity":"ip:192.0.2.7","tier":"free"}`)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("resumed %v req %v", s.Resumed, s.RequestHeaders)
	if _, err := s.OnResponseHeaders(ctx, wasmhost.Headers{{":status", "200"}}, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("resp %v", s.ResponseHeaders)
	s.Done(ctx)
	s2, _ := vm.NewStream(ctx, wasmhost.Headers{{":method", "GET"}, {":path", "/x"}, {":authority", "api"}}, map[string]string{"source.address": "192.0.2.7:5555"})
	act, err = s2.OnRequestHeaders(ctx, true)
	t.Logf("second: %v %v req %v callouts %d metrics %v", act, err, s2.RequestHeaders, len(vm.PendingCallouts()), h.Metrics())
}
