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
	bin := Binary(tb)
	root := tb.TempDir()
	conf := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		tb.Fatal(err)
	}
	for name, yaml := range configs {
		if err := os.WriteFile(filepath.Join(conf, name), []byte(yaml), 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	var ports [3]int
	for i := range ports {
		ports[i] = freePort(tb)
	}
	p := &Peer{GRPCAddr: "127.0.0.1:" + strconv.Itoa(ports[1]), HTTP: "http://127.0.0.1:" + strconv.Itoa(ports[0]), out: &lockedBuffer{}}
	p.cmd = exec.Command(bin)
	p.cmd.Env = append(os.Environ(), "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		"PORT="+strconv.Itoa(ports[0]), "GRPC_PORT="+strconv.Itoa(ports[1]), "DEBUG_PORT="+strconv.Itoa(ports[2]),
		"USE_STATSD=false", "LOG_LEVEL=warn", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr, "REDIS_POOL_SIZE=16",
		"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		tb.Fatalf("start envoyproxy/ratelimit: %v", err)
	}
	tb.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	})
	client := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := client.Get(p.HTTP + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("envoyproxy/ratelimit did not become healthy: %v\n%s", err, p.out.String())
		}
		time.Sleep(50 * time.Millisecond) // polling a process we do not control
	}
}

// Log is what the peer wrote.
func (p *Peer) Log() string { return p.out.String() }

func freePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
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
