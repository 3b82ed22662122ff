package app_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/testkit/certs"
)

// With tls_cert_file, tls_key_file and tls_client_ca_file the service speaks
// HTTPS and refuses a client without a certificate its CA signed (the
// filter's Envoy cluster presents one): the decision API's token then
// travels encrypted, to a service that knows its caller. Plain HTTP and a
// certificate of another CA get nothing.
func TestMutualTLS(t *testing.T) {
	c := certs.Make(t)
	s := startService(t, "", map[string]string{"TOLLGATE_TLS_CERT_FILE": c.ServerCert, "TOLLGATE_TLS_KEY_FILE": c.ServerKey, "TOLLGATE_TLS_CLIENT_CA_FILE": c.CA})
	addr := strings.TrimPrefix(s.base, "http://")
	roots := x509.NewCertPool()
	pem, err := os.ReadFile(c.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots.AppendCertsFromPEM(pem)
	client := func(certFile, keyFile string) *http.Client {
		cfg := &tls.Config{RootCAs: roots}
		if certFile != "" {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	check := func(cl *http.Client, scheme string) (int, error) {
		req, _ := http.NewRequest("POST", scheme+"://"+addr+"/v1/rate-limit/check", bytes.NewBufferString(`{"user_id":"u","endpoint":"/x"}`))
		req.Header.Set("Authorization", "Bearer "+decisionToken)
		resp, err := cl.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if status, err := check(client(c.ClientCert, c.ClientKey), "https"); err != nil || status != 200 {
		t.Fatalf("a client with the CA's certificate: %d %v", status, err)
	}
	for name, cl := range map[string]*http.Client{"no certificate": client("", ""), "another CA's certificate": client(c.OtherClientCert, c.OtherClientKey)} {
		if status, err := check(cl, "https"); err == nil {
			t.Errorf("%s: answered %d", name, status)
		}
	}
	if status, err := check(http.DefaultClient, "http"); err == nil && status == 200 {
		t.Error("plain HTTP was answered")
	}
}
