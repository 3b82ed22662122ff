// Package envoy holds the Envoy and Istio configurations that load the
// filter; its tests check them against Envoy's own v3 protos, since Envoy
// itself cannot be installed here.
package envoy

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3ext "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"

	// Typed configs the bootstraps use, registered for Any resolution.
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/tollgate-rl/tollgate/filter/pluginconf"
)

type validator interface{ ValidateAll() error }

// load reads a bootstrap strictly: unknown fields and unresolvable typed
// configs are errors, as they are for Envoy.
func load(t *testing.T, path string) *bootstrapv3.Bootstrap {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var b bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, &b); err != nil {
		t.Fatalf("%s does not load as a v3 Bootstrap: %v", path, err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &b
}

// validateAny unpacks a typed config and runs its own validation, which the
// enclosing message's validation does not reach.
func validateAny(t *testing.T, name string, a interface {
	UnmarshalNew() (proto.Message, error)
}) proto.Message {
	t.Helper()
	m, err := a.UnmarshalNew()
	if err != nil {
		t.Fatalf("%s: typed config: %v", name, err)
	}
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return m
}

func TestBootstraps(t *testing.T) {
	for _, tt := range []struct {
		file    string
		filters []string
		jwt     bool
	}{
		{"envoy.yaml", []string{"envoy.filters.http.wasm", "envoy.filters.http.router"}, false},
		{"envoy-jwt.yaml", []string{"envoy.filters.http.jwt_authn", "envoy.filters.http.wasm", "envoy.filters.http.router"}, true},
		{"envoy-mtls.yaml", []string{"envoy.filters.http.wasm", "envoy.filters.http.router"}, false},
	} {
		t.Run(tt.file, func(t *testing.T) {
			b := load(t, tt.file)
			clusters := map[string]bool{}
			for _, c := range b.GetStaticResources().GetClusters() {
				clusters[c.GetName()] = true
			}
			ls := b.GetStaticResources().GetListeners()
			if len(ls) != 1 {
				t.Fatalf("%d listeners", len(ls))
			}
			var plugin *pluginconf.Config
			for _, fc := range ls[0].GetFilterChains() {
				for _, f := range fc.GetFilters() {
					hcm, ok := validateAny(t, f.GetName(), f.GetTypedConfig()).(*hcmv3.HttpConnectionManager)
					if !ok {
						t.Fatalf("filter %s is not an http_connection_manager", f.GetName())
					}
					checkTrustBoundary(t, hcm)
					for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
						for _, r := range vh.GetRoutes() {
							if c := r.GetRoute().GetCluster(); !clusters[c] {
								t.Fatalf("route to undefined cluster %q", c)
							}
						}
					}
					var names []string
					for _, hf := range hcm.GetHttpFilters() {
						names = append(names, hf.GetName())
						m := validateAny(t, hf.GetName(), hf.GetTypedConfig())
						if w, ok := m.(*wasmv3.Wasm); ok {
							plugin = checkWasm(t, w)
						}
						if j, ok := m.(*jwtauthnv3.JwtAuthentication); ok {
							checkTokenPlace(t, j)
						}
					}
					if !reflect.DeepEqual(names, tt.filters) {
						t.Fatalf("http filters %v, want %v", names, tt.filters)
					}
				}
			}
			if plugin == nil {
				t.Fatal("no wasm filter")
			}
			if !clusters[plugin.ControlCluster] {
				t.Fatalf("the plugin calls cluster %q, which the bootstrap does not define", plugin.ControlCluster)
			}
			if plugin.XFFTrustedHops != 0 || plugin.TrustXRealIP {
				t.Fatal("the plugin reads client-written address headers; the shipped trust setting lives in Envoy")
			}
			if tt.jwt != (plugin.JWT != nil) {
				t.Fatalf("jwt in plugin config: %v", plugin.JWT != nil)
			}
		})
	}
}

// checkTrustBoundary: the shipped connection manager decides the client
// address from the peer alone and normalises paths before any filter reads
// them, so neither a forged X-Forwarded-For nor another spelling of a path
// (or of a header name) gets past the limiter.
func checkTrustBoundary(t *testing.T, hcm *hcmv3.HttpConnectionManager) {
	t.Helper()
	if !hcm.GetUseRemoteAddress().GetValue() || hcm.GetXffNumTrustedHops() != 0 {
		t.Fatalf("use_remote_address %v, xff_num_trusted_hops %d: want true, 0", hcm.GetUseRemoteAddress().GetValue(), hcm.GetXffNumTrustedHops())
	}
	if !hcm.GetNormalizePath().GetValue() || !hcm.GetMergeSlashes() ||
		hcm.GetPathWithEscapedSlashesAction() != hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT {
		t.Fatalf("path normalisation off: normalize_path %v merge_slashes %v escaped slashes %v",
			hcm.GetNormalizePath().GetValue(), hcm.GetMergeSlashes(), hcm.GetPathWithEscapedSlashesAction())
	}
	if hcm.GetCommonHttpProtocolOptions().GetHeadersWithUnderscoresAction() != corev3.HttpProtocolOptions_REJECT_REQUEST {
		t.Fatal("headers with underscores are allowed")
	}
}

// checkWasm checks the filter's VM and parses its plugin configuration with
// the filter's own parser.
func checkWasm(t *testing.T, w *wasmv3.Wasm) *pluginconf.Config {
	t.Helper()
	c := w.GetConfig()
	if got := c.GetVmConfig().GetCode().GetLocal().GetFilename(); got != "build/tollgate.wasm" {
		t.Fatalf("vm code %q, want build/tollgate.wasm", got)
	}
	if c.GetFailOpen() || c.GetFailurePolicy() != wasmv3ext.FailurePolicy_FAIL_RELOAD {
		t.Fatalf("failure_policy %v, fail_open %v: a crashed VM must be reloaded, never let traffic through unlimited",
			c.GetFailurePolicy(), c.GetFailOpen())
	}
	sv := &wrapperspb.StringValue{}
	if err := c.GetConfiguration().UnmarshalTo(sv); err != nil {
		t.Fatalf("plugin configuration is not a StringValue: %v", err)
	}
	pc, err := pluginconf.Parse([]byte(sv.GetValue()))
	if err != nil {
		t.Fatalf("embedded plugin configuration: %v", err)
	}
	return pc
}

// envoy.yaml embeds exactly filter/plugin-config.example.json, the file
// `make run` uses.
func TestBootstrapEmbedsTheExampleConfig(t *testing.T) {
	b := load(t, "envoy.yaml")
	hcm, _ := validateAny(t, "hcm", b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig()).(*hcmv3.HttpConnectionManager)
	w, _ := validateAny(t, "wasm", hcm.GetHttpFilters()[0].GetTypedConfig()).(*wasmv3.Wasm)
	sv := &wrapperspb.StringValue{}
	if err := w.GetConfig().GetConfiguration().UnmarshalTo(sv); err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("../filter/plugin-config.example.json")
	if err != nil {
		t.Fatal(err)
	}
	var a, e any
	if json.Unmarshal([]byte(sv.GetValue()), &a) != nil || json.Unmarshal(example, &e) != nil || !reflect.DeepEqual(a, e) {
		t.Fatalf("envoy.yaml's plugin configuration differs from filter/plugin-config.example.json:\n%s", sv.GetValue())
	}
}

func TestIstioWasmPlugin(t *testing.T) {
	raw, err := os.ReadFile("istio-wasmplugin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			URL          string          `json:"url"`
			Phase        string          `json:"phase"`
			FailStrategy string          `json:"failStrategy"`
			PluginConfig json.RawMessage `json:"pluginConfig"`
			Selector     map[string]any  `json:"selector"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.APIVersion != "extensions.istio.io/v1alpha1" || doc.Kind != "WasmPlugin" || doc.Metadata.Name == "" || doc.Spec.URL == "" || doc.Spec.Selector == nil {
		t.Fatalf("not a WasmPlugin: %+v", doc)
	}
	if doc.Spec.Phase != "AUTHZ" || doc.Spec.FailStrategy != "FAIL_RELOAD" {
		t.Fatalf("phase %q failStrategy %q", doc.Spec.Phase, doc.Spec.FailStrategy)
	}
	pc, err := pluginconf.Parse(doc.Spec.PluginConfig)
	if err != nil {
		t.Fatalf("pluginConfig: %v", err)
	}
	if pc.ControlCluster != "outbound|8081||controlsvc.tollgate.svc.cluster.local" {
		t.Fatalf("control cluster %q", pc.ControlCluster)
	}
}

// A broken bootstrap is caught: the checks above are not vacuous.
func TestValidationCatchesMistakes(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":    `{"static_resources":{"clusters":[{"name":"x","no_such_field":1}]}}`,
		"bad typed config": `{"static_resources":{"listeners":[{"name":"l","address":{"socket_address":{"address":"127.0.0.1","port_value":1}},"filter_chains":[{"filters":[{"name":"h","typed_config":{"@type":"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager","stat_prefx":"x"}}]}]}]}}`,
	} {
		var b bootstrapv3.Bootstrap
		if err := protojson.Unmarshal([]byte(doc), &b); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	var b bootstrapv3.Bootstrap
	_ = protojson.Unmarshal([]byte(`{"static_resources":{"clusters":[{"name":""}]}}`), &b)
	if b.ValidateAll() == nil {
		t.Error("a cluster without a name validated")
	}
}

// envoy-mtls.yaml reaches the control service over mutual TLS: the
// controlsvc cluster presents a client certificate and verifies the
// service's against a CA and a name, at TLS 1.2 or later.
func TestControlServiceOverMutualTLS(t *testing.T) {
	b := load(t, "envoy-mtls.yaml")
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() != "controlsvc" {
			continue
		}
		ts := c.GetTransportSocket()
		if ts == nil {
			t.Fatal("the controlsvc cluster has no transport socket")
		}
		tc, ok := validateAny(t, ts.GetName(), ts.GetTypedConfig()).(*tlsv3.UpstreamTlsContext)
		if !ok {
			t.Fatalf("transport socket %s is not an UpstreamTlsContext", ts.GetName())
		}
		ctx := tc.GetCommonTlsContext()
		if len(ctx.GetTlsCertificates()) != 1 || ctx.GetTlsCertificates()[0].GetCertificateChain().GetFilename() == "" {
			t.Fatal("no client certificate")
		}
		vc := ctx.GetValidationContext()
		if vc.GetTrustedCa().GetFilename() == "" || len(vc.GetMatchTypedSubjectAltNames()) == 0 {
			t.Fatal("the service's certificate is not verified against a CA and a name")
		}
		if ctx.GetTlsParams().GetTlsMinimumProtocolVersion() < tlsv3.TlsParameters_TLSv1_2 {
			t.Fatal("TLS below 1.2 is allowed")
		}
		return
	}
	t.Fatal("no controlsvc cluster")
}

// checkTokenPlace: Envoy takes a token only where the filter reads it (the
// Authorization header, as a bearer token): by default jwt_authn also takes
// an access_token query parameter, which the filter never reads, and a
// signed-in user sending it so would be counted as its address.
func checkTokenPlace(t *testing.T, j *jwtauthnv3.JwtAuthentication) {
	t.Helper()
	for name, p := range j.GetProviders() {
		hs := p.GetFromHeaders()
		if len(hs) != 1 || !strings.EqualFold(hs[0].GetName(), "authorization") || hs[0].GetValuePrefix() != "Bearer " ||
			len(p.GetFromParams()) > 0 || len(p.GetFromCookies()) > 0 {
			t.Errorf("jwt provider %s takes tokens from %v, params %v, cookies %v; want the Authorization header's bearer token only",
				name, hs, p.GetFromParams(), p.GetFromCookies())
		}
	}
}
