package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/app"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// Credentials of the service under test (as long as the service requires).
const (
	adminToken    = "test-admin-token-0123456789abcdefghij"
	decisionToken = "test-decision-token-0123456789abcdefgh"
)

// service is a control service running in-process against a real Redis.
type service struct {
	t       testing.TB
	app     *app.App
	base    string
	redis   *redistest.Server
	rdb     *redis.Client
	cfgPath string
	logs    *syncBuffer
	reloads chan error
	// applied receives each shared-state version the replica applied.
	applied chan int64
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startService runs the service with the given TOML (and env on top), on a
// free loopback port, against a fresh redis-server (none when env sets
// TOLLGATE_REDIS_ENABLED=false: see inMemory).
func startService(t testing.TB, toml string, env map[string]string) *service {
	t.Helper()
	if env["TOLLGATE_REDIS_ENABLED"] == "false" {
		// A URL where nothing listens: nothing may dial it.
		return startServiceOn(t, nil, "redis://127.0.0.1:1/0", toml, env)
	}
	r := redistest.Start(t)
	return startServiceOn(t, r, "redis://"+r.Addr+"/0", toml, env)
}

func startServiceOn(t testing.TB, r *redistest.Server, redisURL, toml string, env map[string]string) *service {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "tollgate.toml")
	if err := os.WriteFile(path, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{
		"TOLLGATE_LISTEN":           "127.0.0.1:0",
		"TOLLGATE_REDIS_URL":        redisURL,
		"TOLLGATE_ADMIN_TOKEN":      adminToken,
		"TOLLGATE_DECISION_TOKEN":   decisionToken,
		"TOLLGATE_REDIS_TIMEOUT_MS": "300",
	}
	for k, v := range env {
		vars[k] = v
	}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	cfg, err := config.Load(path, lookup)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a, err := app.New(cfg, path, lookup, log)
	if err != nil {
		t.Fatal(err)
	}
	reloads := make(chan error, 16)
	a.OnReload(func(err error) { reloads <- err })
	applied := make(chan int64, 256)
	a.OnChange(func(v int64) {
		select {
		case applied <- v:
		default: // a test that does not read them must not block the replica
		}
	})
	if err := a.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	s := &service{t: t, app: a, base: "http://" + a.Addr(), redis: r, cfgPath: path, logs: logs, reloads: reloads, applied: applied}
	if r != nil {
		s.rdb = redis.NewClient(&redis.Options{Addr: r.Addr})
		t.Cleanup(func() { s.rdb.Close() })
	}
	return s
}

// response is an HTTP answer read whole.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r *response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body is not JSON (%v): %s", err, r.body)
	}
	return m
}

// errorCode returns error.code of an envelope.
func (r *response) errorCode(t *testing.T) string {
	t.Helper()
	e, ok := r.json(t)["error"].(map[string]any)
	if !ok {
		t.Fatalf("no error envelope: %s", r.body)
	}
	if id, _ := e["request_id"].(string); id == "" {
		t.Fatalf("envelope without request_id: %s", r.body)
	}
	code, _ := e["code"].(string)
	return code
}

var client = &http.Client{Timeout: 10 * time.Second}

func (s *service) do(method, path string, body any, header ...string) *response {
	s.t.Helper()
	r, err := s.tryDo(method, path, body, header...)
	if err != nil {
		s.t.Fatal(err)
	}
	return r
}

// tryDo is do for goroutines other than the test's own, which must not call
// t.Fatal: it returns the error instead.
func (s *service) tryDo(method, path string, body any, header ...string) (*response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	// The filter's credential unless the test says otherwise: most tests
	// speak for the filter. A test that sends X-Admin-Token speaks for an
	// operator, who sends one credential header.
	if !slices.Contains(header, "X-Admin-Token") {
		req.Header.Set("Authorization", "Bearer "+decisionToken)
	}
	// A name given twice is sent twice (the first replaces the default).
	given := map[string]bool{}
	for i := 0; i+1 < len(header); i += 2 {
		if given[http.CanonicalHeaderKey(header[i])] {
			req.Header.Add(header[i], header[i+1])
			continue
		}
		given[http.CanonicalHeaderKey(header[i])] = true
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// checkStatus is a check's status from a spawned goroutine: a transport
// error is reported with t.Error (safe there) and counted as status 0.
func (s *service) checkStatus(body any) int {
	r, err := s.tryDo(http.MethodPost, "/v1/rate-limit/check", body)
	if err != nil {
		s.t.Error(err)
		return 0
	}
	return r.status
}

func (s *service) check(body any) *response {
	s.t.Helper()
	return s.do(http.MethodPost, "/v1/rate-limit/check", body)
}

func (s *service) admin(method, path string, body any) *response {
	s.t.Helper()
	return s.do(method, path, body, "Authorization", "Bearer "+adminToken)
}

// dbsize is the number of keys in Redis.
func (s *service) dbsize() int64 {
	s.t.Helper()
	n, err := s.rdb.DBSize(context.Background()).Result()
	if err != nil {
		s.t.Fatal(err)
	}
	return n
}

func num(t *testing.T, m map[string]any, k string) int64 {
	t.Helper()
	f, ok := m[k].(float64)
	if !ok {
		t.Fatalf("%s is %T (%v), want a number", k, m[k], m[k])
	}
	return int64(f)
}
