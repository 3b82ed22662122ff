package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(good, []byte("[[tiers]]\nname = \"free\"\nlimit = 10\nwindow_seconds = 60\n"), 0o600)
	os.WriteFile(bad, []byte("[[tiers]]\nname = \"free\"\nlimit = 10\nwindow_seconds = 7200\n"), 0o600)
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"-config", good, "-check-config"}, &out, &errOut); err != nil {
		t.Fatalf("good config: %v", err)
	}
	if !strings.Contains(out.String(), "config OK: 1 tiers") {
		t.Fatalf("output %q", out.String())
	}
	// Every effective setting is printed; secrets only as set or empty.
	if !strings.Contains(out.String(), "  redis_timeout_ms = 200\n") || !strings.Contains(out.String(), "  admin_token = (empty)\n") {
		t.Fatalf("output lacks the effective settings: %q", out.String())
	}
	err := run(context.Background(), []string{"-config", bad, "-check-config"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "tiers[0].window_seconds") || !strings.Contains(err.Error(), bad) {
		t.Fatalf("bad config: %v", err)
	}
	if err := run(context.Background(), []string{"-nope"}, &out, &errOut); err == nil {
		t.Fatal("unknown flag accepted")
	}
}

// SIGHUP reloads without any change to the file, so only the signal can
// have caused the reload this test sees.
func TestSIGHUPReloads(t *testing.T) {
	r := redistest.Start(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	t.Setenv("TOLLGATE_LISTEN", addr)
	t.Setenv("TOLLGATE_REDIS_URL", "redis://"+r.Addr+"/0")
	path := filepath.Join(t.TempDir(), "tollgate.toml")
	os.WriteFile(path, []byte("[[tiers]]\nname = \"free\"\nlimit = 10\nwindow_seconds = 60\n"), 0o600)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() { done <- run(ctx, []string{"-config", path}, io.Discard, &logs) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	metric := func() string {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, `tollgate_config_reloads_total{result="success"}`) {
				return line
			}
		}
		return "none"
	}
	// Wait for the server to answer (no readiness signal crosses run's
	// boundary but the port), bounded.
	for i := 0; i < 200 && metric() == ""; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if got := metric(); got != "none" {
		t.Fatalf("before SIGHUP: %q", got)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200 && metric() == "none"; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if got := metric(); got != `tollgate_config_reloads_total{result="success"} 1` {
		t.Fatalf("after SIGHUP: %q", got)
	}
}

// -check-config refuses credentials an attacker could guess, naming the
// setting and never echoing the value.
func TestCheckConfigRefusesShortTokens(t *testing.T) {
	for _, tc := range []struct{ env, field string }{
		{"TOLLGATE_ADMIN_TOKEN", "admin_token"},
		{"TOLLGATE_DECISION_TOKEN", "decision_token[0]"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(tc.env, "a")
			var out, errOut bytes.Buffer
			err := run(context.Background(), []string{"-check-config"}, &out, &errOut)
			if err == nil || !strings.Contains(err.Error(), tc.field+": is 1 bytes") {
				t.Fatalf("got %v; want an error naming %s", err, tc.field)
			}
		})
	}
}
