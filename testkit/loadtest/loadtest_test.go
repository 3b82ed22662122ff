package loadtest

import (
	"context"
	"net/http"
	"net/http/httptest"
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
