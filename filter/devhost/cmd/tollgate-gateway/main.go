// Command tollgate-gateway is a development host: an HTTP proxy that runs the
// Tollgate filter under wazero for every request. Envoy is the production
// host; this one needs nothing but Go.
//
//	tollgate-gateway -wasm build/tollgate.wasm -plugin-config filter/plugin-config.example.json \
//	  -listen 127.0.0.1:8080 -upstream http://127.0.0.1:9000 -cluster controlsvc=http://127.0.0.1:8081
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/gateway"
	"github.com/tollgate-rl/tollgate/shared/identity"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "tollgate-gateway:", err)
		os.Exit(1)
	}
}

type clusters map[string]*url.URL

func (c clusters) String() string { return fmt.Sprint(map[string]*url.URL(c)) }

func (c clusters) Set(s string) error {
	name, u, err := gateway.ParseCluster(s)
	if err != nil {
		return err
	}
	c[name] = u
	return nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("tollgate-gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	wasmPath := fs.String("wasm", "build/tollgate.wasm", "the filter module")
	configPath := fs.String("plugin-config", "filter/plugin-config.example.json", "the plugin configuration (JSON)")
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve on")
	upstream := fs.String("upstream", "", "URL allowed requests are forwarded to")
	vms := fs.Int("vms", runtime.GOMAXPROCS(0), "filter VMs (Envoy: one per worker)")
	noFilter := fs.Bool("no-filter", false, "forward without the filter (benchmark baseline)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	hops := fs.Int("xff-trusted-hops", 0, "trusted proxies in front of the gateway, each appending to X-Forwarded-For\n"+
		"(as Envoy's xff_num_trusted_hops with use_remote_address: true); 0 trusts only the peer address")
	clusterCA := fs.String("cluster-ca", "", "PEM CA that https clusters' certificates must chain to")
	clusterCert := fs.String("cluster-cert", "", "PEM client certificate callouts present (with -cluster-key)")
	clusterKey := fs.String("cluster-key", "", "PEM private key of -cluster-cert")
	cl := clusters{}
	fs.Var(cl, "cluster", "NAME=URL of a cluster the filter may call (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	up, err := url.Parse(*upstream)
	if err != nil || up.Scheme == "" || up.Host == "" {
		return fmt.Errorf("-upstream %q: an http(s) URL is required", *upstream)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	if *hops < 0 || *hops > identity.MaxTrustedHops {
		return fmt.Errorf("-xff-trusted-hops %d: must be in 0..%d", *hops, identity.MaxTrustedHops)
	}
	cfg := gateway.Config{Upstream: up, Clusters: cl, VMs: *vms, NoFilter: *noFilter, Log: log, XFFTrustedHops: *hops}
	if cfg.ClusterTLS, err = clusterTLS(*clusterCA, *clusterCert, *clusterKey); err != nil {
		return err
	}
	if !*noFilter {
		if cfg.Wasm, err = os.ReadFile(*wasmPath); err != nil {
			return fmt.Errorf("read -wasm: %w", err)
		}
		if cfg.PluginConfig, err = os.ReadFile(*configPath); err != nil {
			return fmt.Errorf("read -plugin-config: %w", err)
		}
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	g, err := gateway.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer g.Close(context.Background())
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := g.HTTPServer()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	names := make([]string, 0, len(cl))
	for n := range cl {
		names = append(names, n)
	}
	log.Info("gateway listening", "addr", ln.Addr().String(), "upstream", up.String(), "clusters", strings.Join(names, ","), "vms", *vms, "filter", !*noFilter)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// clusterTLS is the TLS of callouts to https clusters: a CA to verify the
// service with, and a client certificate for a service that asks for one
// (mutual TLS). nil with no flag set: the system's roots, no certificate.
func clusterTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("-cluster-cert and -cluster-key go together")
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("-cluster-ca: %w", err)
		}
		t.RootCAs = x509.NewCertPool()
		if !t.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-cluster-ca: no PEM certificate in %s", caFile)
		}
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("-cluster-cert: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}
