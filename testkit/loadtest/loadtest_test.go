package loadtest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestRunIsBounded(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1)%10 == 0 {
			w.WriteHeader(500)
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{
		Request:  func(int64) (*http.Request, error) { return http.NewRequest("GET", srv.URL, nil) },
		Requests: 200, Concurrency: 4, MaxTime: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 200 || hits.Load() != 200 || res.Failures != 20 || res.P99 < res.P50 || res.PerSec <= 0 {
		t.Fatalf("%+v (server saw %d)", res, hits.Load())
	}
}

func TestRefusesNonLoopback(t *testing.T) {
	_, err := Run(context.Background(), Config{
		Request:  func(int64) (*http.Request, error) { return http.NewRequest("GET", "http://192.0.2.1/", nil) },
		Requests: 1, Concurrency: 1, MaxTime: time.Second,
	})
	if err != ErrNotLoopback {
		t.Fatalf("got %v", err)
	}
}

// The raw client sends each request's bytes as given and counts answers as
// the net/http one does, reconnecting when the server closes.
func TestRawIsBoundedAndCounts(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := hits.Add(1)
		if r.Header.Get("X-N") == "" || r.Method != http.MethodPost {
			w.WriteHeader(400)
			return
		}
		if n%10 == 0 {
			w.WriteHeader(500)
		}
		if n%7 == 0 {
			w.Header().Set("Connection", "close")
		}
		_, _ = w.Write([]byte("some body"))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	res, err := Run(context.Background(), Config{
		Raw: func(i int64) []byte {
			return fmt.Appendf(nil, "POST / HTTP/1.1\r\nHost: x\r\nX-N: %d\r\nContent-Length: 2\r\n\r\n{}", i)
		},
		Addr: addr, Requests: 200, Concurrency: 4, MaxTime: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 200 || hits.Load() != 200 || res.Failures != 20 || res.P99 < res.P50 || res.PerSec <= 0 {
		t.Fatalf("%+v (server saw %d)", res, hits.Load())
	}
}

func TestRawRefuses(t *testing.T) {
	chunked := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.(http.Flusher).Flush() // no Content-Length: chunked
		_, _ = w.Write([]byte("x"))
	}))
	defer chunked.Close()
	raw := func(int64) []byte { return []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n") }
	for _, tc := range []struct {
		name, addr string
		want       string
	}{
		{"not loopback", "192.0.2.1:80", "only loopback"},
		{"no port", "127.0.0.1", "Addr"},
		{"chunked answer", strings.TrimPrefix(chunked.URL, "http://"), "Content-Length bodies only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Run(context.Background(), Config{Raw: raw, Addr: tc.addr, Requests: 5, Concurrency: 1, MaxTime: 5 * time.Second})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := Run(context.Background(), Config{Raw: raw, Request: func(int64) (*http.Request, error) { return nil, nil }, Addr: "127.0.0.1:1", Requests: 1, Concurrency: 1, MaxTime: time.Second}); err == nil {
		t.Fatal("both Raw and Request: no error")
	}
}
