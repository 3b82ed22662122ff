// Command controlsvc is Tollgate's control service: the authoritative
// rate-limit decisions (Redis Lua), the admin API, /health and /metrics.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	// Calendar quotas name IANA time zones; the image has no zoneinfo.
	_ "time/tzdata"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/app"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/rls"
)

func main() {
	app.TuneGC(os.LookupEnv)
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "controlsvc:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("controlsvc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	defaultPath, _ := os.LookupEnv(config.ConfigEnv)
	path := fs.String("config", defaultPath, "TOML config file (or TOLLGATE_CONFIG); TOLLGATE_* variables override it")
	check := fs.Bool("check-config", false, "validate the configuration and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.Load(*path, os.LookupEnv)
	if err != nil {
		return err
	}
	unknown := config.UnknownEnv(os.Environ())
	if *check {
		for _, name := range unknown {
			fmt.Fprintf(stdout, "warning: %s is not a Tollgate setting (misspelt?)\n", name)
		}
		fmt.Fprintf(stdout, "config OK: %d tiers, %d rules, default tier %q, failure mode %s\n",
			len(cfg.Tiers), len(cfg.Rules), cfg.DefaultTier, cfg.FailureMode)
		if cfg.RLSConfig != "" {
			rc, err := rls.Load(cfg.RLSConfig)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "rate limit service config OK: domains %s\n", strings.Join(rc.Domains(), ", "))
		}
		for _, st := range config.Settings {
			fmt.Fprintf(stdout, "  %s = %s\n", st.Field, st.Value(cfg))
		}
		return nil
	}
	log := newLogger(stderr, cfg.LogLevel)
	for _, name := range unknown {
		log.Warn("environment variable is not a Tollgate setting (misspelt?)", "name", name)
	}
	a, err := app.New(cfg, *path, os.LookupEnv, log)
	if err != nil {
		return err
	}
	if err := a.Listen(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				_ = a.Reload()
			}
		}
	}()
	if err := a.WatchConfig(ctx); err != nil {
		log.Warn("config file changes will not reload automatically; SIGHUP still does", "err", err)
	}
	return a.Serve(ctx)
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}))
}
