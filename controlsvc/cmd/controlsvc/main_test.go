package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	err := run(context.Background(), []string{"-config", bad, "-check-config"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "tiers[0].window_seconds") || !strings.Contains(err.Error(), bad) {
		t.Fatalf("bad config: %v", err)
	}
	if err := run(context.Background(), []string{"-nope"}, &out, &errOut); err == nil {
		t.Fatal("unknown flag accepted")
	}
}
