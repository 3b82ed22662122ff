// Command peer-bench measures the control service against envoyproxy/ratelimit
// side by side: both run as their own processes on the same Redis (already
// started, loopback), each takes the same bounded load from the same load
// generator, one after the other, for the given number of rounds. It prints
// decisions per second, p50/p99, the service's CPU per decision (from
// /proc/<pid>/stat) and Redis's (from INFO cpu), what each Redis command
// costs (INFO commandstats), and the ratios. Then it sends requests through
// the gateway running the filter, leases on, and prints the control plane's
// CPU (service + Redis) per 1,000 requests admitted, next to the peer's,
// which needs one call per request. `make bench` runs it.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/gateway"
	"github.com/tollgate-rl/tollgate/shared/wire"
	"github.com/tollgate-rl/tollgate/testkit/loadtest"
	"github.com/tollgate-rl/tollgate/testkit/peertest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "peer-bench:", err)
		os.Exit(1)
	}
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat.
const clockTicks = 100

type target struct {
	name     string
	grpcAddr string // Envoy's rate limit service protocol
	token    string // the decision token (Tollgate)
	pid      int    // the service's process, for its CPU time
	halt     func() // stops it
	url      string
	body     func(i int64) string
	headers  map[string]string
}

func run() error {
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address (loopback)")
	peerBin := flag.String("peer", "", "envoyproxy/ratelimit's service_cmd binary")
	controlBin := flag.String("controlsvc", "bin/controlsvc", "the control service binary")
	requests := flag.Int64("requests", 20000, "decisions per run")
	concurrency := flag.Int("c", 32, "concurrent clients")
	callers := flag.Int64("callers", 1000, "distinct callers")
	rounds := flag.Int("rounds", 2, "runs of each service")
	maxTime := flag.Duration("max-time", 30*time.Second, "stop one run after this long")
	wasmPath := flag.String("wasm", "build/tollgate.wasm", "the filter module, for the gateway run (\"\": none)")
	lease := flag.Int64("lease", 100, "tokens per lease in the gateway run")
	gwCallers := flag.Int64("gateway-callers", 100, "distinct callers in the gateway run")
	flag.Parse()
	host, _, err := net.SplitHostPort(*redisAddr)
	if err != nil || (host != "127.0.0.1" && host != "::1" && host != "localhost") {
		return fmt.Errorf("-redis %s: benchmarks only run against loopback", *redisAddr)
	}
	dir, err := os.MkdirTemp("", "peer-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	tg, err := startTollgate(*controlBin, *redisAddr, dir, *callers)
	if err != nil {
		return err
	}
	defer tg.halt()
	targets := []*target{tg}
	if *peerBin != "" {
		peer, err := startPeer(*peerBin, *redisAddr, dir, *callers)
		if err != nil {
			return err
		}
		defer peer.halt()
		targets = append(targets, peer)
	}
	fmt.Printf("Decisions side by side: %d per run, %d clients, %d callers, Redis %s\n", *requests, *concurrency, *callers, *redisAddr)
	best := map[string]float64{} // lowest CPU µs per decision (service + Redis)
	for r := 0; r < *rounds; r++ {
		for _, t := range targets {
			cpu, err := decide(t, *redisAddr, loadtest.Config{Requests: *requests, Concurrency: *concurrency, MaxTime: *maxTime})
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			if v, ok := best[t.name]; !ok || cpu < v {
				best[t.name] = cpu
			}
		}
	}
	if p, ok := best["envoyproxy/ratelimit"]; ok {
		fmt.Printf("decisions per CPU second, Tollgate / envoyproxy/ratelimit (best runs): %.2f\n", p/best["tollgate"])
	}
	fmt.Printf("\nThe same over Envoy's rate limit service protocol (gRPC ShouldRateLimit, %d connections), same descriptors\n", grpcConns)
	bestGRPC := map[string]float64{}
	for r := 0; r < *rounds; r++ {
		for _, t := range targets {
			cpu, err := decideGRPC(t, *redisAddr, *requests, *concurrency, *callers, *maxTime)
			if err != nil {
				return fmt.Errorf("%s over gRPC: %w", t.name, err)
			}
			if v, ok := bestGRPC[t.name]; !ok || cpu < v {
				bestGRPC[t.name] = cpu
			}
		}
	}
	if p, ok := bestGRPC["envoyproxy/ratelimit"]; ok {
		fmt.Printf("gRPC decisions per CPU second, Tollgate / envoyproxy/ratelimit (best runs): %.2f\n", p/bestGRPC["tollgate"])
	}
	if *wasmPath == "" {
		return nil
	}
	perK, calls, err := throughGateway(tg, *redisAddr, *wasmPath, *requests, *concurrency, *gwCallers, *lease, *maxTime)
	if err != nil {
		return fmt.Errorf("gateway run: %w", err)
	}
	fmt.Printf("Through the gateway with the filter (lease %d, %d callers): %.0f control service calls and %.2f ms control-plane CPU (service + Redis) per 1,000 requests admitted\n",
		*lease, *gwCallers, calls, perK)
	if p, ok := best["envoyproxy/ratelimit"]; ok {
		fmt.Printf("envoyproxy/ratelimit, one call per request: %.2f ms per 1,000 requests (%.0fx Tollgate's)\n", p, p/perK)
	}
	return nil
}

// usage is what a service and Redis have spent so far.
type usage struct {
	service, redis time.Duration
	commands       cmdStats
}

func usageOf(pid int, redisAddr string) (u usage, err error) {
	if u.service, err = procCPU(pid); err != nil {
		return u, err
	}
	if u.redis, err = redisCPU(redisAddr); err != nil {
		return u, err
	}
	u.commands, err = commandStats(redisAddr)
	return u, err
}

// decide runs one bounded load of decisions against t, prints what it took,
// and returns the CPU (service + Redis) in µs per decision.
func decide(t *target, redisAddr string, load loadtest.Config) (float64, error) {
	before, err := usageOf(t.pid, redisAddr)
	if err != nil {
		return 0, err
	}
	load.Request = func(i int64) (*http.Request, error) {
		req, err := http.NewRequest(http.MethodPost, t.url, strings.NewReader(t.body(i)))
		for k, v := range t.headers {
			req.Header.Set(k, v)
		}
		return req, err
	}
	res, err := loadtest.Run(context.Background(), load)
	if err != nil {
		return 0, err
	}
	after, err := usageOf(t.pid, redisAddr)
	if err != nil {
		return 0, err
	}
	n := float64(res.Requests)
	svc := (after.service - before.service).Seconds() * 1e6 / n
	red := (after.redis - before.redis).Seconds() * 1e6 / n
	fmt.Printf("%-22s %v  service %.0f µs + Redis %.0f µs CPU per decision\n", t.name, res, svc, red)
	fmt.Printf("%-22s Redis commands per decision: %s\n", "", after.commands.since(before.commands, n))
	return svc + red, nil
}

// throughGateway sends requests through the gateway running the filter in
// front of the Tollgate service t, leases on, and returns the control
// plane's CPU (service + Redis) in ms and its calls per 1,000 admitted
// requests.
func throughGateway(t *target, redisAddr, wasmPath string, requests int64, concurrency int, callers, lease int64, maxTime time.Duration) (perK, calls float64, err error) {
	ctx := context.Background()
	wasm, err := os.ReadFile(wasmPath)
	if err != nil {
		return 0, 0, err
	}
	ctl, _ := url.Parse(strings.TrimSuffix(t.url, wire.PathCheck))
	up, err := startUpstream()
	if err != nil {
		return 0, 0, err
	}
	defer up.Close()
	config := fmt.Sprintf(`{"control_cluster":"controlsvc","decision_token":%q,"timeout_ms":1000,"lease":{"request":%d}}`, t.token, lease)
	g, err := gateway.New(ctx, gateway.Config{Wasm: wasm, PluginConfig: []byte(config), Upstream: &url.URL{Scheme: "http", Host: up.Addr().String()},
		Clusters: map[string]*url.URL{"controlsvc": ctl}, VMs: 2, XFFTrustedHops: 1})
	if err != nil {
		return 0, 0, err
	}
	defer g.Close(ctx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, err
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	cpu0, err := procCPU(t.pid)
	if err != nil {
		return 0, 0, err
	}
	red0, err := redisCPU(redisAddr)
	if err != nil {
		return 0, 0, err
	}
	cmd0, err := commandStats(redisAddr)
	if err != nil {
		return 0, 0, err
	}
	res, err := loadtest.Run(ctx, loadtest.Config{
		Requests: requests, Concurrency: concurrency, MaxTime: maxTime,
		Request: func(i int64) (*http.Request, error) {
			r, err := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/api/v1/items", nil)
			if err == nil {
				// Callers behind one trusted proxy (the load generator).
				r.Header.Set("X-Forwarded-For", fmt.Sprintf("198.51.%d.%d", i%callers/250, i%callers%250+1))
			}
			return r, err
		},
	})
	if err != nil {
		return 0, 0, err
	}
	cpu1, err := procCPU(t.pid)
	if err != nil {
		return 0, 0, err
	}
	red1, err := redisCPU(redisAddr)
	if err != nil {
		return 0, 0, err
	}
	cmd1, err := commandStats(redisAddr)
	if err != nil {
		return 0, 0, err
	}
	admitted := float64(res.Requests - res.Failures)
	if admitted <= 0 {
		return 0, 0, fmt.Errorf("no request was admitted: %v", res)
	}
	fmt.Printf("%-22s %v\n", "tollgate via gateway", res)
	scripts := cmd1["evalsha"].calls - cmd0["evalsha"].calls
	return (cpu1 - cpu0 + red1 - red0).Seconds() * 1e3 * 1000 / admitted, float64(scripts) * 1000 / admitted, nil
}

// startUpstream is the gateway's upstream: it answers "ok".
func startUpstream() (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return ln, nil
}

func startTollgate(bin, redisAddr, dir string, callers int64) (*target, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "tollgate.toml")
	// One counter per decision, as the peer's per-user descriptor: the tier
	// counts across paths (a per-endpoint tier, the default, would also
	// count the path, two counters a decision, work the peer is not doing).
	if err := os.WriteFile(cfg, []byte("[[tiers]]\nname = \"free\"\nlimit = 1000000000\nwindow_seconds = 60\nper_endpoint = false\n"), 0o600); err != nil {
		return nil, err
	}
	rlsConfig := filepath.Join(dir, "rls.yaml")
	if err := os.WriteFile(rlsConfig, []byte(benchYAML), 0o600); err != nil {
		return nil, err
	}
	grpcAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	token := fmt.Sprintf("peer-bench-%d-0123456789abcdefghijklmnop", time.Now().UnixNano())
	cmd := exec.Command(bin, "-config", cfg)
	cmd.Env = append(os.Environ(), "TOLLGATE_LISTEN="+addr, "TOLLGATE_REDIS_URL=redis://"+redisAddr+"/0",
		"TOLLGATE_DECISION_TOKEN="+token, "TOLLGATE_LOG_LEVEL=error", "TOLLGATE_GRPC_LISTEN="+grpcAddr, "TOLLGATE_RLS_CONFIG="+rlsConfig)
	if err := start(cmd, "http://"+addr+"/health"); err != nil {
		return nil, err
	}
	return &target{name: "tollgate", pid: cmd.Process.Pid, halt: func() { stop(cmd) }, url: "http://" + addr + wire.PathCheck, token: token, grpcAddr: grpcAddr,
		body: func(i int64) string {
			return fmt.Sprintf(`{"user_id":"bench-%d","endpoint":"/api/v1/items"}`, i%callers)
		},
		headers: map[string]string{"Authorization": "Bearer " + token}}, nil
}

// startPeer runs envoyproxy/ratelimit with one descriptor: a per-user limit
// as large as Tollgate's, over its HTTP JSON endpoint and its gRPC one.
func startPeer(bin, redisAddr, dir string, callers int64) (*target, error) {
	p, err := peertest.Run(bin, redisAddr, filepath.Join(dir, "runtime"), map[string]string{"config.yaml": benchYAML})
	if err != nil {
		return nil, err
	}
	return &target{name: "envoyproxy/ratelimit", pid: p.Pid(), halt: p.Stop, url: p.HTTP + "/json", grpcAddr: p.GRPCAddr,
		body: func(i int64) string {
			return fmt.Sprintf(`{"domain":"bench","descriptors":[{"entries":[{"key":"user","value":"bench-%d"}]}]}`, i%callers)
		}}, nil
}

// start runs cmd and waits (bounded) until health answers.
func start(cmd *exec.Cmd, health string) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get(health); err == nil {
			resp.Body.Close()
			return nil
		}
	}
	stop(cmd)
	return fmt.Errorf("%s did not answer %s", cmd.Path, health)
}

func stop(cmd *exec.Cmd) {
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// procCPU is the user + system CPU time a process has used.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which may hold spaces) start after ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime/stime", pid)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// redisCPU is Redis's used_cpu_sys + used_cpu_user (INFO cpu).
func redisCPU(addr string) (time.Duration, error) {
	lines, err := redisInfo(addr, "cpu")
	if err != nil {
		return 0, err
	}
	var total float64
	for _, line := range lines {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second)), nil
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct{ calls, usec int64 }

type cmdStats map[string]cmdStat

// commandStats reads INFO commandstats: calls and µs of each command (a
// script's µs include the commands it runs).
func commandStats(addr string) (cmdStats, error) {
	lines, err := redisInfo(addr, "commandstats")
	if err != nil {
		return nil, err
	}
	st := cmdStats{}
	for _, line := range lines {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || name == line {
			continue
		}
		var c cmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				c.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				c.usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		st[name] = c
	}
	return st, nil
}

// since lists, per decision, the commands that ran since before and their
// µs per call, the most called first (commands under one call in 20
// decisions are left out). Tollgate writes usage counts once a second, so
// its last HINCRBY/EXPIRE flush can land in the next run, the peer's: about
// 0.1 command per decision, 0.2 µs of Redis CPU, counted against the peer.
func (after cmdStats) since(before cmdStats, decisions float64) string {
	type row struct {
		name        string
		perDecision float64
		usecPerCall float64
	}
	var rows []row
	for name, a := range after {
		b := before[name]
		if calls := a.calls - b.calls; float64(calls) >= decisions/20 {
			rows = append(rows, row{name, float64(calls) / decisions, float64(a.usec-b.usec) / float64(calls)})
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].perDecision > rows[j].perDecision })
	var parts []string
	for _, r := range rows {
		parts = append(parts, fmt.Sprintf("%s %.2f× %.1f µs", r.name, r.perDecision, r.usecPerCall))
	}
	return strings.Join(parts, ", ")
}

// redisInfo is one INFO section's lines.
func redisInfo(addr, section string) ([]string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("INFO " + section + "\r\n")); err != nil {
		return nil, err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		return nil, fmt.Errorf("INFO %s: %q %v", section, head, err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(head[1:]))
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return strings.Split(string(body), "\r\n"), nil
}
