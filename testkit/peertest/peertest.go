// Package peertest runs envoyproxy/ratelimit, the reference rate limit
// service, as its real binary on loopback ports against a given Redis, for
// tests that hold Tollgate's answers against its.
package peertest

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Module is the peer's command and the version `make peer` builds: the
// commit Envoy Gateway 1.6 and 1.7 ship.
const Module = "github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36"

// Peer is a running envoyproxy/ratelimit.
type Peer struct {
	// GRPCAddr serves envoy.service.ratelimit.v3.RateLimitService; HTTP is
	// its JSON and health listener ("http://127.0.0.1:port").
	GRPCAddr, HTTP string
	cmd            *exec.Cmd
	out            *lockedBuffer
}

// Binary finds the peer's binary: $TOLLGATE_PEER_BIN, or bin/service_cmd
// at the root of the checkout (which `make peer`, and so `make test`,
// builds). It fails the test with how to get it.
func Binary(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("TOLLGATE_PEER_BIN"); p != "" {
		return p
	}
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			p := filepath.Join(dir, "bin", "service_cmd")
			if _, err := os.Stat(p); err != nil {
				tb.Fatalf("envoyproxy/ratelimit is not built (%s): run `make peer` (GOBIN=$PWD/bin go install %s), or set TOLLGATE_PEER_BIN", p, Module)
			}
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatalf("no go.work above the test's directory: set TOLLGATE_PEER_BIN to envoyproxy/ratelimit's service_cmd (go install %s)", Module)
		}
		dir = parent
	}
}

// Start runs the peer with configs (file name -> YAML) against redisAddr
// (loopback) and waits until it answers its health check. It stops with
// the test.
func Start(tb testing.TB, redisAddr string, configs map[string]string) *Peer {
	tb.Helper()
	p, err := Run(Binary(tb), redisAddr, tb.TempDir(), configs)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Stop)
	return p
}

// Run starts the peer's binary bin with configs (file name -> YAML) in a
// runtime directory under root, against redisAddr (loopback), and waits
// (bounded) until it answers its health check. Benchmarks use it; tests
// use Start. Stop ends it.
func Run(bin, redisAddr, root string, configs map[string]string) (*Peer, error) {
	conf := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		return nil, err
	}
	for name, yaml := range configs {
		if err := os.WriteFile(filepath.Join(conf, name), []byte(yaml), 0o600); err != nil {
			return nil, err
		}
	}
	var ports [3]int
	for i := range ports {
		var err error
		if ports[i], err = freePort(); err != nil {
			return nil, err
		}
	}
	p := &Peer{GRPCAddr: "127.0.0.1:" + strconv.Itoa(ports[1]), HTTP: "http://127.0.0.1:" + strconv.Itoa(ports[0]), out: &lockedBuffer{}}
	p.cmd = exec.Command(bin)
	p.cmd.Env = append(os.Environ(), "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		"PORT="+strconv.Itoa(ports[0]), "GRPC_PORT="+strconv.Itoa(ports[1]), "DEBUG_PORT="+strconv.Itoa(ports[2]),
		"USE_STATSD=false", "LOG_LEVEL=warn", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr, "REDIS_POOL_SIZE=64",
		"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start envoyproxy/ratelimit: %w", err)
	}
	client := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := client.Get(p.HTTP + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("envoyproxy/ratelimit did not become healthy: %v\n%s", err, p.out.String())
		}
		time.Sleep(50 * time.Millisecond) // polling a process we do not control
	}
}

// Pid is the peer's process id (benchmarks read its CPU time).
func (p *Peer) Pid() int { return p.cmd.Process.Pid }

// Stop kills the peer and waits for it.
func (p *Peer) Stop() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// Log is what the peer wrote.
func (p *Peer) Log() string { return p.out.String() }

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 1<<20 {
		return len(p), nil // keep the start; a runaway log must not fill memory
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.b.String())
}
