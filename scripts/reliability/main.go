// Command reliability is `make reliability`: faults injected one at a time
// under a bounded load through the whole path, and one row per fault.
//
// It starts Redis (append-only file, fsync always), two control-service
// replicas behind one cluster (an in-process balancer that retries a
// refused connection on the other replica, as Envoy's cluster does with
// retry_on connect-failure), the gateway running the filter (fail_open, 2
// VMs, leases) and an upstream that records each request's decision. Three
// hundred callers send requests from 32 clients, ten of them hard enough to
// stay at their limit. Each fault runs while the load runs; a row reports
// the answers by class, client-visible errors, latency, the time until
// decisions come from Redis again, what the callers at their limit were
// admitted beyond it, and the admin state (rules, keys, overrides, audit
// entries) lost. It exits non-zero when a row breaks its bound.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/gateway"
	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "reliability:", err)
		os.Exit(1)
	}
}

// The load: callers and the limit of their tier.
const (
	callers    = 300
	hotCallers = 10 // these ask far more than the limit
	tierLimit  = 60 // per minute
	clients    = 32
)

var (
	decisionToken = "reliability-decision-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-0123456789abcdef"
	adminToken    = "reliability-admin-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-0123456789abcdefghij"
)

func run() error {
	controlBin := flag.String("controlsvc", "bin/controlsvc", "the control service binary")
	wasmPath := flag.String("wasm", "build/tollgate.wasm", "the filter module")
	phase := flag.Duration("phase", 6*time.Second, "how long each fault's load runs")
	modes := flag.String("modes", "fail_open,fail_closed", "failure modes to run the faults under, one stack each")
	topologies := flag.String("topologies", "single,sentinel,cluster", "Redis topologies to run the faults on")
	soakFor := flag.Duration("soak", 0, "instead of the faults, a soak this long with 10,000 callers (make soak)")
	flag.Parse()
	if *soakFor > 0 {
		return soak(*controlBin, *wasmPath, *soakFor)
	}
	failed := false
	for _, mode := range strings.Split(*modes, ",") {
		for _, topology := range strings.Split(*topologies, ",") {
			broke, err := runMode(mode, topology, *controlBin, *wasmPath, *phase)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", mode, topology, err)
			}
			failed = failed || broke
		}
	}
	fmt.Printf("Bounds: no client-visible error (a transport error, a 5xx other than fail_closed's 503); \"beyond\" is what the %d callers\n"+
		"at their limit were admitted past it (a phase may touch two of their minute windows: past 2 x %d each): 0 while every part\n"+
		"is up and always under fail_closed; under fail_open during an outage at most 2 x %d each (the filter's fallback, share 1\n"+
		"of the last seen limit, and the replicas' local counting, the limit over two); no rule, key, override or audit entry lost.\n",
		hotCallers, tierLimit, tierLimit)
	if failed {
		return errors.New("a bound broke")
	}
	return nil
}

// runMode starts a stack in one failure mode, runs every fault and prints
// the table; it reports whether a row broke its bound.
func runMode(mode, topology, controlBin, wasmPath string, phase time.Duration) (bool, error) {
	dir, err := os.MkdirTemp("", "reliability")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	st := &stack{dir: dir, controlBin: controlBin, mode: mode}
	switch topology {
	case "sentinel":
		st.sentinelAddr = freeAddr()
	case "cluster":
		st.clusterAddrs = []string{}
	}
	defer st.stop()
	if err := st.start(wasmPath); err != nil {
		return false, err
	}
	if err := st.seedAdminState(); err != nil {
		return false, fmt.Errorf("admin state: %w", err)
	}
	before, err := st.adminState()
	if err != nil {
		return false, err
	}
	killBoth := func() error {
		return errors.Join(st.controls[0].signal(syscall.SIGKILL), st.controls[1].signal(syscall.SIGKILL))
	}
	startBoth := func() error { return errors.Join(st.controls[0].start(), st.controls[1].start()) }
	after := func(d time.Duration, f func() error) func() error {
		return func() error { time.Sleep(d); return f() }
	}
	cut := func(how int32) func() error { return func() error { st.balancer.cut.Store(how); return nil } }
	slow := func(d time.Duration) func() error {
		return func() error { st.redisProxy.delay.Store(int64(d)); return nil }
	}
	faults := []fault{
		{name: "none (baseline)", inject: func() error { return nil }},
		{name: "one of two replicas SIGKILLed", inject: func() error { return st.controls[0].signal(syscall.SIGKILL) }, repair: st.controls[0].start},
		{name: "both replicas SIGKILLed, restarted after 2 s", inject: killBoth, repair: after(2*time.Second, startBoth), outage: true},
		{name: "both replicas SIGTERMed (drain) and restarted", inject: func() error {
			return errors.Join(st.controls[0].stopGracefully(), st.controls[1].stopGracefully())
		}, repair: startBoth, outage: true},
		{name: "network to the service refused for 3 s", inject: cut(netRefused), repair: after(3*time.Second, cut(netUp)), outage: true},
		{name: "network to the service black-holed for 3 s", inject: cut(netBlackHoled), repair: after(3*time.Second, cut(netUp)), outage: true},
		{name: "Redis SIGKILLed, restarted from its AOF after 2 s", inject: func() error { return st.redis.signal(syscall.SIGKILL) },
			repair: after(2*time.Second, st.redis.start), outage: true},
		{name: "Redis CLIENT PAUSE 3 s", inject: func() error { return redisCmd(st.redisAddr, "CLIENT", "PAUSE", "3000") },
			repair: after(3*time.Second, func() error { return nil }), outage: true},
		{name: "Redis 50 ms slower for 3 s", inject: slow(50 * time.Millisecond), repair: after(3*time.Second, slow(0))},
		{name: "Redis 2 s slower for 3 s", inject: slow(2 * time.Second), repair: after(3*time.Second, slow(0)), outage: true},
		{name: "config reload and admin changes under load", inject: st.adminBurst},
	}
	if topology == "cluster" {
		faults = []fault{
			{name: "none (baseline, Cluster)", inject: func() error { return nil }},
			{name: "a Cluster master SIGKILLed, its replica promoted", inject: st.killClusterMaster,
				repair: func() error { return st.awaitClusterOK(st.clusterAddrs[st.clusterSurvivor]) }, outage: true},
		}
	}
	if topology == "sentinel" {
		_, masterPort, _ := net.SplitHostPort(st.redisAddr)
		faults = []fault{
			{name: "none (baseline, Sentinel)", inject: func() error { return nil }},
			{name: "Redis master SIGKILLed, Sentinel promotes", inject: func() error { return st.redis.signal(syscall.SIGKILL) },
				repair: func() error { return st.awaitFailover(masterPort) }, outage: true},
		}
	}
	fmt.Printf("Faults under load, %s, %s Redis: %d callers (%d at their limit of %d a minute), %d clients, %v a fault, 2 replicas\n\n",
		mode, topology, callers, hotCallers, tierLimit, clients, phase)
	fmt.Printf("%-50s %7s %6s %6s %5s %5s %6s %8s %8s %8s %9s %8s %5s\n",
		"fault", "sent", "2xx", "429", "503", "other", "errors", "p50", "p99", "max", "recovery", "beyond", "lost")
	failed := false
	for _, f := range faults {
		r, err := st.measure(f, phase)
		if err != nil {
			return false, fmt.Errorf("%s: %w", f.name, err)
		}
		after, err := st.adminState()
		if err != nil {
			return false, fmt.Errorf("%s: admin state: %w\nthe first replica's log ends:\n%s", f.name, err, tailOf(st.controls[0].logPath, 15))
		}
		r.lost = before.lost(after)
		before = after
		fmt.Println(r.row())
		if why := r.broken(mode); why != "" {
			failed = true
			fmt.Printf("  BOUND BROKEN: %s (first refusal: %s)\n", why, r.sample)
		}
	}
	fmt.Println()
	return failed, nil
}

// phases numbers the phases of a run: each phase's callers are its own
// (10.<phase>.x.y), so no phase starts with callers an earlier one spent.
var phases atomic.Int64

type fault struct {
	name   string
	inject func() error
	repair func() error // nil: nothing to repair
	// outage: the service or Redis cannot decide for a while, so the
	// documented fallbacks admit beyond the limit (bounded); otherwise
	// nothing beyond it is admitted.
	outage bool
}

// stack is every process and server of the run.
type stack struct {
	dir, controlBin string
	mode            string // failure_mode of the service and the filter
	redis           *proc
	redisAddr       string
	redisProxy      *tcpProxy
	// sentinel: the replicas reach Redis through a Sentinel that watches
	// redis (the master) and redisReplica.
	sentinel, redisReplica *proc
	sentinelAddr           string
	// cluster: six nodes, three masters each with a replica.
	clusterNodes    []*proc
	clusterAddrs    []string
	clusterSurvivor int // a node the master kill left up
	controls        [2]*proc
	balancer        *balancer
	upstream        *recorder
	gateway         *gateway.Gateway
	gatewayURL      string
	servers         []*http.Server
	cfgPath         string
}

func (st *stack) start(wasmPath string) error {
	ctx := context.Background()
	wasm, err := os.ReadFile(wasmPath)
	if err != nil {
		return fmt.Errorf("%w (run make build)", err)
	}
	st.redisAddr = freeAddr()
	_, port, _ := net.SplitHostPort(st.redisAddr)
	st.redis = &proc{name: "redis", bin: "redis-server", args: []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
		"--appendfsync", "always", "--dir", st.dir}, ready: "tcp://" + st.redisAddr, logPath: filepath.Join(st.dir, "redis.log")}
	if err := st.redis.start(); err != nil {
		return err
	}
	if st.redisProxy, err = newTCPProxy(st.redisAddr); err != nil {
		return err
	}
	redisURL := "redis://" + st.redisProxy.addr() + "/0"
	if st.sentinelAddr != "" {
		if err := st.startSentinel(port); err != nil {
			return err
		}
		redisURL = "redis-sentinel://" + st.sentinelAddr + "/0?master=tollgate"
	}
	if st.clusterAddrs != nil {
		if err := st.startCluster(); err != nil {
			return err
		}
		redisURL = "redis-cluster://" + strings.Join(st.clusterAddrs, ",")
	}
	st.cfgPath = filepath.Join(st.dir, "tollgate.toml")
	if err := os.WriteFile(st.cfgPath, []byte(tomlConfig(100)), 0o600); err != nil {
		return err
	}
	var backends []string
	for i := range st.controls {
		addr := freeAddr()
		backends = append(backends, "http://"+addr)
		st.controls[i] = &proc{name: fmt.Sprintf("controlsvc-%d", i), bin: st.controlBin, args: []string{"-config", st.cfgPath},
			env: []string{"TOLLGATE_LISTEN=" + addr, "TOLLGATE_REDIS_URL=" + redisURL, "TOLLGATE_FAILURE_MODE=" + st.mode, "TOLLGATE_DECISION_TOKEN=" + decisionToken,
				"TOLLGATE_ADMIN_TOKEN=" + adminToken, "TOLLGATE_REPLICAS=2", "TOLLGATE_REDIS_BREAKER_COOLDOWN_MS=200", "TOLLGATE_LOG_LEVEL=warn"},
			ready: "http://" + addr + "/health", logPath: filepath.Join(st.dir, fmt.Sprintf("controlsvc-%d.log", i))}
		if err := st.controls[i].start(); err != nil {
			return err
		}
	}
	st.balancer = &balancer{backends: backends, client: &http.Client{Timeout: 2 * time.Second}}
	lb := st.serve(st.balancer)
	st.upstream = &recorder{}
	up := st.serve(st.upstream)
	plugin := fmt.Sprintf(`{"control_cluster":"controlsvc","decision_token":%q,"timeout_ms":1000,"failure_mode":%q,"lease":{"request":10},"breaker":{"failures":5,"cooldown_ms":200}}`, decisionToken, st.mode)
	upURL, _ := url.Parse(up)
	lbURL, _ := url.Parse(lb)
	st.gateway, err = gateway.New(ctx, gateway.Config{Wasm: wasm, PluginConfig: []byte(plugin), Upstream: upURL,
		Clusters: map[string]*url.URL{"controlsvc": lbURL}, VMs: 2, XFFTrustedHops: 1})
	if err != nil {
		return err
	}
	st.gatewayURL = st.serve(st.gateway)
	return nil
}

// tomlConfig is the file both replicas read: the callers' tier, and
// another tier whose limit the reload fault changes.
func tomlConfig(otherLimit int) string {
	return fmt.Sprintf("[[tiers]]\nname = \"free\"\nlimit = %d\nwindow_seconds = 60\nalgorithm = \"fixed_window\"\nper_endpoint = false\n\n"+
		"[[tiers]]\nname = \"other\"\nlimit = %d\nwindow_seconds = 60\n", tierLimit, otherLimit)
}

func (st *stack) serve(h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	st.servers = append(st.servers, srv)
	go srv.Serve(ln)
	return "http://" + ln.Addr().String()
}

func (st *stack) stop() {
	for _, s := range st.servers {
		s.Close()
	}
	if st.gateway != nil {
		st.gateway.Close(context.Background())
	}
	for _, c := range st.controls {
		if c != nil {
			c.signal(syscall.SIGKILL)
		}
	}
	for _, p := range append([]*proc{st.sentinel, st.redisReplica}, st.clusterNodes...) {
		if p != nil {
			p.signal(syscall.SIGKILL)
		}
	}
	if st.redis != nil {
		st.redis.signal(syscall.SIGKILL)
	}
}

// result is one fault's row.
type result struct {
	name                           string
	sent, ok, limited, unavailable int64
	other, errs                    int64
	p50, p99, max                  time.Duration
	recovery                       time.Duration // -1: decisions never came back from Redis
	beyond                         int64         // admitted beyond the limit, callers at their limit
	lost                           string
	outage                         bool
	sample                         string // the first refusal's status and body
}

func (r *result) row() string {
	rec := "-"
	if r.recovery > 0 {
		rec = r.recovery.Round(10 * time.Millisecond).String()
	} else if r.recovery < 0 {
		rec = "never"
	}
	lost := "none"
	if r.lost != "" {
		lost = r.lost
	}
	return fmt.Sprintf("%-50s %7d %6d %6d %5d %5d %6d %8v %8v %8v %9s %8d %5s", r.name, r.sent, r.ok, r.limited, r.unavailable, r.other, r.errs,
		r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), r.max.Round(time.Millisecond), rec, r.beyond, lost)
}

// broken names the bound a row breaks, or "".
func (r *result) broken(mode string) string {
	closed := mode == "fail_closed"
	switch {
	case r.errs > 0 || r.other > 0 || r.unavailable > 0 && (!closed || !r.outage):
		return fmt.Sprintf("%d client-visible errors (transport %d, 503 %d, other %d)", r.errs+r.other+r.unavailable, r.errs, r.unavailable, r.other)
	case closed && r.beyond > 0:
		return fmt.Sprintf("%d admitted beyond the limit under fail_closed", r.beyond)
	case !r.outage && r.beyond > 0:
		return fmt.Sprintf("%d admitted beyond the limit with every part up", r.beyond)
	case r.beyond > int64(hotCallers*2*tierLimit):
		return fmt.Sprintf("%d admitted beyond the limit, more than the fallbacks allow", r.beyond)
	case r.lost != "":
		return "admin state lost: " + r.lost
	case r.recovery < 0:
		return "decisions never came back from Redis"
	}
	return ""
}

// measure runs the load for one phase with the fault injected a third of
// the way in and repaired right after (or when its repair returns).
func (st *stack) measure(f fault, phase time.Duration) (*result, error) {
	r := &result{name: f.name, outage: f.outage}
	// Every phase starts with fresh callers: the minute windows of the last
	// phase must not hide this one's over-admission.
	prefix := phases.Add(1) % 250
	ctx, cancel := context.WithTimeout(context.Background(), phase)
	defer cancel()
	var lat []time.Duration
	var mu sync.Mutex
	var sent, ok2xx, limited, unavailable, other, errs atomic.Int64
	var sampleOnce sync.Once
	admitted := make([]atomic.Int64, hotCallers)
	wg := st.drive(ctx, func(i int64) (int, string) {
		caller := int(i % callers)
		if i%3 == 0 { // a third of the load from the callers at their limit
			caller = int(i % hotCallers)
		}
		return caller, fmt.Sprintf("10.%d.%d.%d", prefix, caller/250, caller%250+1)
	}, func(caller, status int, body []byte, d time.Duration, err error) {
		sent.Add(1)
		if err != nil {
			errs.Add(1)
			return
		}
		if status/100 != 2 {
			sampleOnce.Do(func() { r.sample = fmt.Sprintf("%d %s", status, body) })
		}
		mu.Lock()
		lat = append(lat, d)
		mu.Unlock()
		switch {
		case status/100 == 2:
			ok2xx.Add(1)
			if caller < hotCallers {
				admitted[caller].Add(1)
			}
		case status == 429:
			limited.Add(1)
		case status == 503:
			unavailable.Add(1)
		default:
			other.Add(1)
		}
	})
	probed := st.probe(ctx, fmt.Sprintf("10.%d.9.1", prefix))
	time.Sleep(phase / 3)
	if err := f.inject(); err != nil {
		cancel()
		wg.Wait()
		return nil, err
	}
	repaired := time.Now()
	if f.repair != nil {
		if err := f.repair(); err != nil {
			cancel()
			wg.Wait()
			return nil, err
		}
		repaired = time.Now()
	}
	wg.Wait()
	probed.Wait()
	r.recovery = st.upstream.recoveredAfter(repaired)
	if f.repair == nil {
		r.recovery = 0
	}
	r.sent, r.ok, r.limited, r.unavailable, r.other, r.errs = sent.Load(), ok2xx.Load(), limited.Load(), unavailable.Load(), other.Load(), errs.Load()
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		r.p50, r.p99, r.max = lat[n/2], lat[n*99/100], lat[n-1]
	}
	for i := range admitted {
		// A phase is shorter than the tier's minute: each hot caller may
		// be admitted its limit, plus what a window boundary allows.
		r.beyond += max(admitted[i].Load()-2*tierLimit, 0)
	}
	return r, nil
}

// probe sends one request every 150 ms from a caller of its own, until
// ctx ends: 40 a phase, under the tier's 60 a minute, so a caller with
// quota left is always asking. Recovery is when a request is decided from
// Redis again: when the load is fast enough that every other caller has
// spent its minute before the repair, only such a caller can show it.
func (st *stack) probe(ctx context.Context, xff string) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		client := &http.Client{Timeout: 5 * time.Second}
		t := time.NewTicker(150 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, st.gatewayURL+"/api/v1/items", nil)
			req.Header.Set("X-Forwarded-For", xff)
			if resp, err := client.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}()
	return &wg
}

// drive sends requests through the gateway from clients workers until ctx
// ends. who names request i's caller and its X-Forwarded-For address;
// answered sees each answer (status 0 and err on a transport error; a
// request cut by the end of ctx is not reported). Wait on the group.
func (st *stack) drive(ctx context.Context, who func(i int64) (int, string), answered func(caller, status int, body []byte, d time.Duration, err error)) *sync.WaitGroup {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				caller, xff := who(next.Add(1))
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, st.gatewayURL+"/api/v1/items", nil)
				req.Header.Set("X-Forwarded-For", xff)
				t0 := time.Now()
				resp, err := client.Do(req)
				d := time.Since(t0)
				if err != nil {
					if ctx.Err() == nil {
						answered(caller, 0, nil, d, err)
					}
					continue
				}
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
				resp.Body.Close()
				answered(caller, resp.StatusCode, body, d, nil)
			}
		}()
	}
	return &wg
}

// recorder is the upstream: it records when requests arrive and whether the
// filter let them through on a decision or degraded.
type recorder struct {
	mu     sync.Mutex
	normal []time.Time // arrivals decided by the service with Redis
}

func (u *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if d := r.Header.Get("x-tollgate-decision"); d != "degraded" {
		u.mu.Lock()
		u.normal = append(u.normal, time.Now())
		u.mu.Unlock()
	}
	io.WriteString(w, "ok")
}

// recoveredAfter is how long after t the first request decided normally
// arrived (-1: none).
func (u *recorder) recoveredAfter(t time.Time) time.Duration {
	u.mu.Lock()
	defer u.mu.Unlock()
	i, _ := slices.BinarySearchFunc(u.normal, t, func(a, b time.Time) int { return a.Compare(b) })
	if i == len(u.normal) {
		return -1
	}
	return max(u.normal[i].Sub(t), time.Millisecond)
}

// balancer is the control service's cluster: round robin over the
// replicas, a refused connection retried on the other one. Its network
// can be cut: every connection refused, or black-holed (nothing answers
// until the caller gives up).
type balancer struct {
	backends []string
	n        atomic.Int64
	client   *http.Client
	cut      atomic.Int32 // 0 up, 1 refused, 2 black-holed
}

const (
	netUp = iota
	netRefused
	netBlackHoled
)

func (b *balancer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch b.cut.Load() {
	case netRefused:
		http.Error(w, "upstream connect error or disconnect/reset before headers: connection refused", http.StatusServiceUnavailable)
		return
	case netBlackHoled:
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	first := int(b.n.Add(1))
	var last error
	for k := 0; k < len(b.backends); k++ {
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, b.backends[(first+k)%len(b.backends)]+r.URL.RequestURI(), bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := b.client.Do(req)
		if err != nil {
			last = err
			continue
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
		resp.Body.Close()
		return
	}
	http.Error(w, "no healthy upstream: "+last.Error(), http.StatusServiceUnavailable)
}

// proc is a process the run starts, kills and starts again.
type proc struct {
	name, bin, ready, logPath string
	args, env                 []string
	cmd                       *exec.Cmd
	done                      chan struct{}
}

func (p *proc) start() error {
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	p.cmd = exec.Command(p.bin, p.args...)
	p.cmd.Env = append(os.Environ(), p.env...)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.done = make(chan struct{})
	go func() { p.cmd.Wait(); log.Close(); close(p.done) }()
	// Ready when it answers (bounded): a process we do not control announces
	// nothing else.
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if strings.HasPrefix(p.ready, "tcp://") {
			if c, err := net.Dial("tcp", strings.TrimPrefix(p.ready, "tcp://")); err == nil {
				c.Close()
				return nil
			}
			continue
		}
		if resp, err := http.Get(p.ready); err == nil {
			resp.Body.Close()
			return nil
		}
	}
	return fmt.Errorf("%s did not become ready (log %s)", p.name, p.logPath)
}

func (p *proc) signal(sig syscall.Signal) error {
	if p.cmd == nil || p.cmd.Process == nil {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	if sig == syscall.SIGKILL {
		<-p.done
	}
	return nil
}

// stopGracefully sends SIGTERM and waits for the drain (bounded).
func (p *proc) stopGracefully() error {
	if err := p.signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(15 * time.Second):
		return fmt.Errorf("%s did not stop within 15 s of SIGTERM", p.name)
	}
}

// admin state: what must survive every fault.
type adminState struct{ rules, keys, overrides, audit int }

func (a adminState) lost(b adminState) string {
	var l []string
	if b.rules < a.rules {
		l = append(l, fmt.Sprintf("rules %d->%d", a.rules, b.rules))
	}
	if b.keys < a.keys {
		l = append(l, fmt.Sprintf("keys %d->%d", a.keys, b.keys))
	}
	if b.overrides < a.overrides {
		l = append(l, fmt.Sprintf("overrides %d->%d", a.overrides, b.overrides))
	}
	if b.audit < a.audit {
		l = append(l, fmt.Sprintf("audit %d->%d", a.audit, b.audit))
	}
	return strings.Join(l, ", ")
}

func (st *stack) adminState() (adminState, error) {
	var s adminState
	var err error
	for _, c := range []struct {
		path string
		n    *int
	}{{"/admin/v1/rate-limit-rules", &s.rules}, {"/admin/v1/api-keys?limit=100", &s.keys}, {"/admin/v1/overrides", &s.overrides}, {"/admin/v1/audit?type=admin&limit=1000", &s.audit}} {
		if *c.n, err = st.count(c.path); err != nil {
			return s, fmt.Errorf("%s: %w", c.path, err)
		}
	}
	return s, nil
}

// count is the number of items of an admin list, page after page (asked
// of the first replica that answers: a fault may have one down).
func (st *stack) count(path string) (int, error) {
	total, page := 0, ""
	for pages := 0; pages < 100; pages++ {
		m, err := st.get(path + page)
		if err != nil {
			return 0, err
		}
		for _, v := range m {
			if l, ok := v.([]any); ok {
				total += len(l)
				break
			}
		}
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		switch {
		case m["next_cursor"] != nil && m["next_cursor"] != "":
			page = sep + "cursor=" + url.QueryEscape(fmt.Sprint(m["next_cursor"]))
		case m["next"] != nil && m["next"] != "":
			page = sep + "since=" + url.QueryEscape(fmt.Sprint(m["next"]))
		default:
			return total, nil
		}
	}
	return 0, fmt.Errorf("%s: more than 100 pages", path)
}

// get reads an admin answer from the first replica that answers.
func (st *stack) get(path string) (map[string]any, error) {
	var last error
	for attempt := 0; attempt < 50; attempt++ {
		for _, b := range st.balancer.backends {
			code, body, err := adminCall(b, http.MethodGet, path, nil)
			if err != nil || code != 200 {
				last = fmt.Errorf("%d %s %v", code, body, err)
				continue
			}
			var m map[string]any
			err = json.Unmarshal(body, &m)
			return m, err
		}
		time.Sleep(100 * time.Millisecond) // replicas restarting after a fault
	}
	return nil, last
}

func adminCall(base, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, b, err
}

// seedAdminState makes what every fault must keep: rules, keys, overrides
// (and their audit entries).
func (st *stack) seedAdminState() error {
	b := st.balancer.backends[0]
	for i := 0; i < 3; i++ {
		if code, body, err := adminCall(b, http.MethodPost, "/admin/v1/rate-limit-rules", map[string]any{"tier_id": 1, "endpoint_pattern": fmt.Sprintf("/seed/%d/**", i),
			"algorithm": "token_bucket", "limit": 10 + i, "window_seconds": 60}); err != nil || code != 201 {
			return fmt.Errorf("rule: %d %s %v", code, body, err)
		}
		if code, body, err := adminCall(b, http.MethodPost, "/admin/v1/api-keys", map[string]any{"user_id": fmt.Sprintf("seed-%d", i), "tier": "free"}); err != nil || code != 201 {
			return fmt.Errorf("key: %d %s %v", code, body, err)
		}
		if code, body, err := adminCall(b, http.MethodPut, "/v1/rate-limit/config", map[string]any{"user_id": fmt.Sprintf("seed-%d", i), "endpoint": "/seed",
			"limit": 5, "window_seconds": 60, "strategy": "fixed_window"}); err != nil || code/100 != 2 {
			return fmt.Errorf("override: %d %s %v", code, body, err)
		}
	}
	return nil
}

// adminBurst reloads the config file (another tier's limit changed, then
// back) and
// makes admin changes on both replicas while the load runs: rules created
// and deleted, keys created and revoked.
func (st *stack) adminBurst() error {
	if err := os.WriteFile(st.cfgPath, []byte(tomlConfig(200)), 0o600); err != nil {
		return err
	}
	for _, b := range st.balancer.backends {
		if err := awaitTierLimit(b, "other", 200); err != nil {
			return err
		}
	}
	for i := 0; i < 20; i++ {
		b := st.balancer.backends[i%2]
		code, body, err := adminCall(b, http.MethodPost, "/admin/v1/rate-limit-rules", map[string]any{"tier_id": 1, "endpoint_pattern": fmt.Sprintf("/burst/%d", i),
			"algorithm": "fixed_window", "limit": 100, "window_seconds": 60})
		if err != nil || code != 201 {
			return fmt.Errorf("burst rule: %d %s %v", code, body, err)
		}
		var rule struct {
			ID json.Number `json:"rule_id"`
		}
		_ = json.Unmarshal(body, &rule)
		if code, body, err := adminCall(st.balancer.backends[(i+1)%2], http.MethodDelete, "/admin/v1/rate-limit-rules/"+rule.ID.String(), nil); err != nil || code != 204 {
			return fmt.Errorf("delete burst rule %s: %d %s %v", rule.ID, code, body, err)
		}
		code, body, err = adminCall(b, http.MethodPost, "/admin/v1/api-keys", map[string]any{"user_id": fmt.Sprintf("burst-%d", i), "tier": "free"})
		if err != nil || code != 201 {
			return fmt.Errorf("burst key: %d %s %v", code, body, err)
		}
		var key struct {
			KeyID string `json:"key_id"`
		}
		_ = json.Unmarshal(body, &key)
		if code, body, err := adminCall(st.balancer.backends[(i+1)%2], http.MethodPost, "/admin/v1/api-keys/"+key.KeyID+"/revoke", nil); err != nil || code/100 != 2 {
			return fmt.Errorf("revoke %s: %d %s %v", key.KeyID, code, body, err)
		}
	}
	return os.WriteFile(st.cfgPath, []byte(tomlConfig(100)), 0o600)
}

// awaitTierLimit asks a replica (bounded) until its tier shows limit: the
// reload took effect there.
func awaitTierLimit(base, tier string, limit int) error {
	for i := 0; i < 100; i++ {
		code, body, err := adminCall(base, http.MethodGet, "/admin/v1/tiers", nil)
		if err == nil && code == 200 {
			var m struct {
				Tiers []struct {
					Name  string `json:"name"`
					Limit int    `json:"limit"`
				} `json:"tiers"`
			}
			if json.Unmarshal(body, &m) == nil {
				for _, t := range m.Tiers {
					if t.Name == tier && t.Limit == limit {
						return nil
					}
				}
			}
		}
		time.Sleep(50 * time.Millisecond) // the replica's watcher announces nothing outside
	}
	return fmt.Errorf("%s: tier %s never showed limit %d after the reload", base, tier, limit)
}

func redisCmd(addr string, args ...string) error {
	v, err := redistest.Do(addr, args...)
	if err != nil {
		return err
	}
	if v != "OK" {
		return fmt.Errorf("redis %v: %v", args, v)
	}
	return nil
}

// startSentinel starts a replica of the Redis on masterPort and a Sentinel
// watching both (quorum 1, down after 1 s), and waits (bounded) until the
// Sentinel knows the replica: a failover needs one to promote.
func (st *stack) startSentinel(masterPort string) error {
	replicaAddr := freeAddr()
	_, rport, _ := net.SplitHostPort(replicaAddr)
	rdir := filepath.Join(st.dir, "replica")
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		return err
	}
	st.redisReplica = &proc{name: "redis-replica", bin: "redis-server", args: []string{"--port", rport, "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
		"--appendfsync", "always", "--dir", rdir, "--replicaof", "127.0.0.1", masterPort}, ready: "tcp://" + replicaAddr, logPath: filepath.Join(st.dir, "replica.log")}
	if err := st.redisReplica.start(); err != nil {
		return err
	}
	_, sport, _ := net.SplitHostPort(st.sentinelAddr)
	conf := filepath.Join(st.dir, "sentinel.conf")
	body := fmt.Sprintf("port %s\nbind 127.0.0.1\nsentinel monitor tollgate 127.0.0.1 %s 1\nsentinel down-after-milliseconds tollgate 1000\nsentinel failover-timeout tollgate 5000\n",
		sport, masterPort)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		return err
	}
	st.sentinel = &proc{name: "sentinel", bin: "redis-sentinel", args: []string{conf}, ready: "tcp://" + st.sentinelAddr, logPath: filepath.Join(st.dir, "sentinel.log")}
	if err := st.sentinel.start(); err != nil {
		return err
	}
	for i := 0; i < 200; i++ {
		if v, err := redistest.Do(st.sentinelAddr, "SENTINEL", "REPLICAS", "tollgate"); err == nil {
			if l, ok := v.([]any); ok && len(l) > 0 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond) // the Sentinel discovers the replica from the master, on its own schedule
	}
	return errors.New("the Sentinel never saw the replica")
}

// startCluster starts six cluster nodes (AOF, node timeout 1 s), makes
// them three masters with a replica each, and waits (bounded) until the
// cluster is ok.
func (st *stack) startCluster() error {
	st.clusterAddrs = st.clusterAddrs[:0]
	for i := 0; i < 6; i++ {
		addr := freeAddr()
		_, port, _ := net.SplitHostPort(addr)
		d := filepath.Join(st.dir, "cluster-"+port)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		n := &proc{name: "redis-cluster-" + port, bin: "redis-server", args: []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
			"--appendfsync", "always", "--dir", d, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000"},
			ready: "tcp://" + addr, logPath: filepath.Join(d, "redis.log")}
		if err := n.start(); err != nil {
			return err
		}
		st.clusterNodes = append(st.clusterNodes, n)
		st.clusterAddrs = append(st.clusterAddrs, addr)
	}
	out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, st.clusterAddrs...), "--cluster-replicas", "1", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	return st.awaitClusterOK(st.clusterAddrs[1])
}

// killClusterMaster SIGKILLs the first node that says it is a master.
func (st *stack) killClusterMaster() error {
	for i, a := range st.clusterAddrs {
		if v, err := redistest.Do(a, "ROLE"); err == nil {
			if l, ok := v.([]any); ok && len(l) > 0 && l[0] == "master" {
				st.clusterSurvivor = (i + 1) % len(st.clusterAddrs)
				return st.clusterNodes[i].signal(syscall.SIGKILL)
			}
		}
	}
	return errors.New("no cluster node says it is a master")
}

// awaitClusterOK waits (bounded) until node reports cluster_state:ok.
func (st *stack) awaitClusterOK(node string) error {
	for i := 0; i < 600; i++ {
		if v, err := redistest.Do(node, "CLUSTER", "INFO"); err == nil && strings.Contains(fmt.Sprint(v), "cluster_state:ok") {
			return nil
		}
		time.Sleep(50 * time.Millisecond) // the cluster agrees on its own schedule
	}
	return fmt.Errorf("the cluster never reported ok at %s", node)
}

// awaitFailover waits (bounded) until the Sentinel names a master other
// than old.
func (st *stack) awaitFailover(old string) error {
	for i := 0; i < 600; i++ {
		if v, err := redistest.Do(st.sentinelAddr, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "tollgate"); err == nil {
			if l, ok := v.([]any); ok && len(l) == 2 && fmt.Sprint(l[1]) != old {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("the Sentinel never promoted the replica")
}

// tcpProxy stands between the replicas and Redis; it can add a delay to
// every chunk the replicas send (a slow Redis, or a slow network to it).
type tcpProxy struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // nanoseconds
}

func newTCPProxy(target string) (*tcpProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &tcpProxy{ln: ln, target: target}
	go p.serve()
	return p, nil
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

func (p *tcpProxy) pipe(c net.Conn) {
	defer c.Close()
	s, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		return
	}
	defer s.Close()
	go func() { io.Copy(c, s); c.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if d := time.Duration(p.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			if _, werr := s.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// tailOf is the last n lines of a file.
func tailOf(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
