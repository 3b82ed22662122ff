package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/url"
	"os"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/devhost/gateway"
	"github.com/tollgate-rl/tollgate/testkit/certs"
	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// The filter reaches a control service that requires mutual TLS through a
// cluster that presents the CA's client certificate (Envoy: envoy-mtls.yaml;
// here the gateway's ClusterTLS); a cluster without one gets no decision,
// and a fail_closed filter answers 503.
func TestFilterOverMutualTLS(t *testing.T) {
	c := certs.Make(t)
	pem, err := os.ReadFile(c.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	withCert := func(certFile, keyFile string) *tls.Config {
		cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if certFile != "" {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		return cfg
	}
	health := func(addr string) (*http.Response, error) {
		cl := &http.Client{Transport: &http.Transport{TLSClientConfig: withCert(c.ClientCert, c.ClientKey)}}
		return cl.Get("https://" + addr + "/health")
	}
	r := redistest.Start(t)
	ctl := startControlWith(t, r.Addr, "", health,
		"TOLLGATE_TLS_CERT_FILE="+c.ServerCert, "TOLLGATE_TLS_KEY_FILE="+c.ServerKey, "TOLLGATE_TLS_CLIENT_CA_FILE="+c.CA)
	up := newUpstream(t)
	plugin := `{"control_cluster":"controlsvc","decision_token":"` + decisionToken + `","timeout_ms":2000,"failure_mode":"fail_closed","lease":{"request":0}}`
	gw := func(cfg *tls.Config) string {
		upURL, _ := url.Parse(up.URL)
		ctlURL, _ := url.Parse("https://" + ctl.addr)
		return serveGateway(t, gateway.Config{Wasm: wasmBytes, PluginConfig: []byte(plugin), Upstream: upURL,
			Clusters: map[string]*url.URL{"controlsvc": ctlURL}, VMs: 1, CompilationCache: compCache, ClusterTLS: cfg})
	}
	if res := get(t, gw(withCert(c.ClientCert, c.ClientKey)), "/api/v1/items"); res.status != 200 || res.header.Get("X-Ratelimit-Limit") == "" {
		t.Fatalf("through a cluster with the CA's certificate: %d %s", res.status, res.body)
	}
	for name, cfg := range map[string]*tls.Config{"no client certificate": withCert("", ""), "another CA's certificate": withCert(c.OtherClientCert, c.OtherClientKey)} {
		if res := get(t, gw(cfg), "/api/v1/items"); res.status != 503 {
			t.Errorf("%s: %d %s; want the fail_closed 503", name, res.status, res.body)
		}
	}
}
