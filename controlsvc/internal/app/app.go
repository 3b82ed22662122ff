// Package app assembles the control service from its parts and runs it: the
// Redis client, the limiter, the decision service, the HTTP server, config
// reloads. main only parses flags and calls it; tests start it in-process.
package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/admin"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/connlimit"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/decision"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/leanhttp"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/memlimit"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/metrics"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/rls"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/server"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/changes"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/overrides"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/ruleset"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/summary"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/usage"
)

// App is a running control service.
type App struct {
	cfgPath string
	lookup  func(string) (string, bool)
	cfg     *config.Config // as loaded at start; listen and redis settings need a restart
	log     *slog.Logger

	rdb       redis.UniversalClient // nil: redis_enabled = false
	svc       *decision.Service
	srv       *server.Server
	overrides *overrides.Store
	ruleset   *ruleset.Store
	limiter   *limiter.Limiter  // nil without Redis
	local     *memlimit.Limiter // counts while Redis is away (fail_open)
	usage     *usage.Recorder
	summary   *summary.Recorder
	metrics   *metrics.Metrics
	http      *http.Server
	lean      *leanhttp.Server // serves the decision route, hands the rest to http
	ln        net.Listener
	rls       *rls.Service // Envoy's rate limit service protocol
	grpc      *grpc.Server // nil unless grpc_listen is set
	grpcLn    net.Listener

	// reloadMu guards file and runtime: the policy is always compiled from
	// the two together.
	reloadMu sync.Mutex
	file     *config.Config   // the file and environment, as last loaded
	runtime  ruleset.Snapshot // rules and tiers managed at runtime
	refused  int64            // a shared version that did not compile
	version  atomic.Int64
	onReload func(error)
	onChange func(version int64)
}

// OnReload registers f to be called after every reload attempt with its
// result (tests await reloads with it). Call it before Serve.
func (a *App) OnReload(f func(error)) { a.onReload = f }

// New builds the service from cfg. path and lookup are kept for reloads
// (path may be empty). It does not need Redis to be up: a Redis that is down
// at start is handled like one that fails later, by the failure mode.
func New(cfg *config.Config, path string, lookup func(string) (string, bool), log *slog.Logger) (*App, error) {
	st, err := openState(cfg, log)
	if err != nil {
		return nil, err
	}
	a := &App{cfgPath: path, lookup: lookup, cfg: cfg, log: log, rdb: st.rdb, file: cfg, limiter: st.limiter}
	var pool func() *redis.PoolStats
	if st.rdb != nil {
		pool = st.rdb.PoolStats
	}
	a.metrics = metrics.New(pool)
	pol, err := policy.Compile(&cfg.Spec, a.nextVersion())
	if err != nil {
		return nil, fmt.Errorf("compile config: %w", err)
	}
	a.overrides, a.ruleset, a.local = st.overrides, st.ruleset, memlimit.New(cfg.Replicas, time.Now)
	a.usage = usage.NewRecorder(st.usage, st.trail, log)
	a.summary = summary.NewRecorder(st.summary, log)
	a.svc = decision.New(decision.Deps{Counters: st.counters, Local: a.local, Keys: st.keys, Overrides: a.overrides, Replays: st.replays, Usage: a.usage, Summary: a.summary, Trail: st.trail, Metrics: a.metrics, Log: log, Now: time.Now,
		BreakerThreshold: cfg.RedisBreakerThreshold, BreakerCooldown: time.Duration(cfg.RedisBreakerCooldownMs) * time.Millisecond}, pol, decision.SettingsOf(cfg))
	a.metrics.RegisterBreaker(a.svc.BreakerOpen)
	rc, err := loadRLS(cfg)
	if err != nil {
		return nil, err
	}
	a.rls = rls.New(rls.Deps{Counters: st.counters, Checker: a.svc, Local: a.local, Observe: a.metrics, Log: log, Now: time.Now,
		BreakerThreshold: cfg.RedisBreakerThreshold, BreakerCooldown: time.Duration(cfg.RedisBreakerCooldownMs) * time.Millisecond}, rc, rlsSettings(cfg))
	ops := admin.New(admin.Deps{Keys: st.keys, Rules: a.ruleset, Trail: st.trail, Usage: usage.NewReader(st.usage), Summary: summary.NewReader(st.summary), Policy: a.svc.Policy, Metrics: a.metrics, Log: log, Now: time.Now,
		Validate: a.validateRuntime, Changed: func(ctx context.Context) { a.refresh(ctx, -1) }})
	a.srv = server.New(server.Deps{Service: a.svc, Admin: ops, Metrics: a.metrics, Config: cfg, Log: log, Now: time.Now})
	// Every request reaches the handler, whose answers close a connection
	// without a credential (net/http would answer OPTIONS * itself and keep
	// it open: an outsider held a listener that way), and a request head
	// is at most maxHeaderBytes (net/http's default, 1 MiB, let one
	// address hold a gigabyte of unfinished heads).
	a.http = &http.Server{Handler: a.srv.Handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		DisableGeneralOptionsHandler: true, MaxHeaderBytes: maxHeaderBytes}
	a.lean = a.srv.LeanServer(a.http)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if st.limiter != nil {
		if err := st.limiter.Load(ctx); err != nil {
			log.Warn("redis not reachable at start; scripts load on first use", "err", err)
		}
	}
	a.refresh(ctx, -1)
	redisURL := "" // none used
	if st.rdb != nil {
		redisURL = config.RedactURL(cfg.RedisURL)
	}
	log.Info("control service ready", "redis_topology", st.topology, "redis_url", redisURL,
		"failure_mode", cfg.FailureMode, "tiers", len(cfg.Tiers), "rules", len(cfg.Rules), "admin_api", cfg.AdminToken != "")
	return a, nil
}

// maxHeaderBytes bounds a request head on the HTTP listener: Envoy's own
// default (60 KiB) and a little; the decision and admin APIs' heads are
// under a kilobyte.
const maxHeaderBytes = 64 << 10

// usageFlush is how often usage counts and violations are written: each
// flush writes four commands per identity seen, so under many callers a
// shorter interval costs Redis more than the decisions do.
const usageFlush = time.Second

// FlushUsage writes the usage counts and the summary gathered so far
// (tests read them).
func (a *App) FlushUsage(ctx context.Context) error {
	if err := a.usage.Flush(ctx); err != nil {
		return err
	}
	return a.summary.Flush(ctx)
}

func (a *App) nextVersion() string { return strconv.FormatInt(a.version.Add(1), 10) }

// Listen binds the configured address.
func (a *App) Listen() error {
	cl, err := a.listen(a.cfg.Listen, "http")
	if err != nil {
		return fmt.Errorf("listen on %s: %w", a.cfg.Listen, err)
	}
	var ln net.Listener = cl
	t, err := a.cfg.TLS()
	if err != nil {
		ln.Close()
		return fmt.Errorf("tls: %w", err)
	}
	if t != nil {
		// The lean route and net/http both read the connection after its
		// handshake; a client without the CA's certificate gets no further.
		ln = tls.NewListener(ln, t)
	}
	a.ln = ln
	if err := a.listenGRPC(); err != nil {
		ln.Close()
		return err
	}
	return nil
}

// listen binds addr with the connection bounds (connlimit): at most
// max_connections_per_address from one peer, and the listener's share of
// the file descriptors (HTTP and gRPC each half of three quarters).
func (a *App) listen(addr, name string) (*connlimit.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := connlimit.New(ln, a.cfg.MaxConnectionsPerAddress, connlimit.DefaultTotal(2))
	a.metrics.RegisterConnections(name, l.Refused.Load, l.Open)
	return l, nil
}

// Addr is the bound address (after Listen).
func (a *App) Addr() string { return a.ln.Addr().String() }

// Service is the decision service (tests inspect it).
func (a *App) Service() *decision.Service { return a.svc }

// Metrics are the service's metrics (tests read them).
func (a *App) Metrics() *metrics.Metrics { return a.metrics }

// Serve answers requests until ctx ends, then shuts down gracefully: no new
// connections, in-flight requests get up to ten seconds.
func (a *App) Serve(ctx context.Context) error {
	bg, stop := context.WithCancel(ctx)
	defer stop()
	usageDone := make(chan struct{})
	summaryDone := make(chan struct{})
	go func() { a.usage.Run(bg, usageFlush); close(usageDone) }()
	go func() { a.summary.Run(bg, usageFlush); close(summaryDone) }()
	if a.rdb != nil {
		w := changes.Subscribe(bg, a.rdb, 2*time.Second, a.log)
		go w.Run(bg, time.Duration(a.cfg.OverrideRefreshMs)*time.Millisecond, a.log, func(v int64) { a.refresh(bg, v) })
	}
	errc := make(chan error, 1)
	go func() { errc <- a.lean.Serve(a.ln) }()
	a.serveGRPC(errc)
	a.log.Info("listening", "addr", a.Addr())
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a.stopGRPC(shutdownCtx)
	err := a.lean.Shutdown(shutdownCtx)
	stop()
	<-usageDone // the last counts are written before Redis closes
	<-summaryDone
	if a.rdb != nil {
		a.limiter.Close()
		if cerr := a.rdb.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	a.log.Info("stopped")
	return nil
}

// Reload re-reads the file and the environment. A bad config is logged and
// counted, and the old one stays live. Settings that need a restart (listen,
// redis_*) are reported when they change.
func (a *App) Reload() (err error) {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	if a.onReload != nil {
		defer func() { a.onReload(err) }()
	}
	cfg, err := config.Load(a.cfgPath, a.lookup)
	var rc *rls.Config
	if err == nil {
		rc, err = loadRLS(cfg)
	}
	if err == nil {
		if err = a.applyLocked(cfg, a.runtime); err == nil {
			a.rls.SetConfig(rc)
			if cfg.Listen != a.cfg.Listen || cfg.RedisURL != a.cfg.RedisURL || cfg.RedisPoolSize != a.cfg.RedisPoolSize || cfg.RedisTimeoutMs != a.cfg.RedisTimeoutMs ||
				cfg.TLSCertFile != a.cfg.TLSCertFile || cfg.TLSKeyFile != a.cfg.TLSKeyFile || cfg.TLSClientCAFile != a.cfg.TLSClientCAFile ||
				cfg.GRPCListen != a.cfg.GRPCListen {
				a.log.Warn("listen, tls and redis settings changed; they take effect on restart")
			}
			a.metrics.ConfigReloads.WithLabelValues("success").Inc()
			a.log.Info("config reloaded", "version", a.svc.Policy().Version(), "tiers", len(cfg.Tiers), "rules", len(cfg.Rules))
			return nil
		}
	}
	a.metrics.ConfigReloads.WithLabelValues("failure").Inc()
	a.log.Error("config reload failed; keeping the previous config", "err", err)
	return err
}

// reloadQuiet is how long the config file must be unchanged before a reload.
const reloadQuiet = 100 * time.Millisecond

// watchTargets are the directories whose changes reload the configuration,
// each with which of its files count: the config file, and the rate limit
// service's file or directory of YAML files.
func (a *App) watchTargets() (map[string]func(string) bool, error) {
	targets := map[string]func(string) bool{}
	file := func(p string) error {
		abs, err := filepath.Abs(p)
		if err != nil {
			return fmt.Errorf("watch config: %w", err)
		}
		dir, prev := filepath.Dir(abs), targets[filepath.Dir(abs)]
		targets[dir] = func(name string) bool { return name == abs || prev != nil && prev(name) }
		return nil
	}
	if a.cfgPath != "" {
		if err := file(a.cfgPath); err != nil {
			return nil, err
		}
	}
	if p := a.cfg.RLSConfig; p != "" {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("watch rls_config: %w", err)
		}
		if !st.IsDir() {
			return targets, file(p)
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, fmt.Errorf("watch rls_config: %w", err)
		}
		prev := targets[abs]
		targets[abs] = func(name string) bool {
			ext := filepath.Ext(name)
			return ext == ".yaml" || ext == ".yml" || prev != nil && prev(name)
		}
	}
	return targets, nil
}

// WatchConfig reloads when the config file changes, until ctx ends. It
// watches the directory, so editors that replace the file are seen too.
func (a *App) WatchConfig(ctx context.Context) error {
	targets, err := a.watchTargets()
	if err != nil || len(targets) == 0 {
		return err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch config: %w", err)
	}
	for dir := range targets {
		if err := w.Add(dir); err != nil {
			w.Close()
			return fmt.Errorf("watch config: %w", err)
		}
	}
	abs := a.cfgPath
	if abs != "" {
		abs, _ = filepath.Abs(abs)
	}
	go func() {
		defer w.Close()
		// Editors and os.WriteFile truncate before they write, and one save
		// is several events: wait until the file has been quiet for a
		// moment, and never reload from an empty file (a save in progress).
		var quiet <-chan time.Time
		tomlChanged := false
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				name := filepath.Clean(ev.Name)
				if match := targets[filepath.Dir(name)]; match != nil && match(name) &&
					ev.Has(fsnotify.Write|fsnotify.Create|fsnotify.Rename|fsnotify.Remove) {
					quiet = time.After(reloadQuiet)
					tomlChanged = tomlChanged || name == abs
				}
			case <-quiet:
				quiet = nil
				if st, err := os.Stat(abs); tomlChanged && err == nil && st.Size() == 0 {
					a.log.Warn("config file is empty; waiting for the write to finish", "path", abs)
					continue
				}
				tomlChanged = false
				_ = a.Reload()
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				a.log.Warn("config watcher", "err", err)
			}
		}
	}()
	return nil
}
