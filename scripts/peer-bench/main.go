// Command peer-bench measures the control service against envoyproxy/ratelimit
// side by side: both run as their own processes on the same Redis (already
// started, loopback), each takes the same bounded load from the same load
// generator, one after the other, for the given number of rounds. It prints
// decisions per second, p50/p99, the service's CPU per decision (from
// /proc/<pid>/stat) and Redis's (from INFO cpu), and the ratios. `make bench`
// runs it.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/testkit/loadtest"
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
	name    string
	cmd     *exec.Cmd
	url     string
	body    func(i int64) string
	headers map[string]string
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
	defer stop(tg.cmd)
	targets := []*target{tg}
	if *peerBin != "" {
		peer, err := startPeer(*peerBin, *redisAddr, dir, *callers)
		if err != nil {
			return err
		}
		defer stop(peer.cmd)
		targets = append(targets, peer)
	}
	fmt.Printf("Decisions side by side: %d per run, %d clients, %d callers, Redis %s\n", *requests, *concurrency, *callers, *redisAddr)
	best := map[string]float64{} // lowest CPU µs per decision (service + Redis)
	for r := 0; r < *rounds; r++ {
		for _, t := range targets {
			cpu0, err := procCPU(t.cmd.Process.Pid)
			if err != nil {
				return err
			}
			red0, err := redisCPU(*redisAddr)
			if err != nil {
				return err
			}
			res, err := loadtest.Run(context.Background(), loadtest.Config{
				Requests: *requests, Concurrency: *concurrency, MaxTime: *maxTime,
				Request: func(i int64) (*http.Request, error) {
					req, err := http.NewRequest(http.MethodPost, t.url, strings.NewReader(t.body(i)))
					for k, v := range t.headers {
						req.Header.Set(k, v)
					}
					return req, err
				},
			})
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			cpu1, err := procCPU(t.cmd.Process.Pid)
			if err != nil {
				return err
			}
			red1, err := redisCPU(*redisAddr)
			if err != nil {
				return err
			}
			n := float64(res.Requests)
			svc := (cpu1 - cpu0).Seconds() * 1e6 / n
			red := (red1 - red0).Seconds() * 1e6 / n
			fmt.Printf("%-22s %v  service %.0f µs + Redis %.0f µs CPU per decision\n", t.name, res, svc, red)
			if v, ok := best[t.name]; !ok || svc+red < v {
				best[t.name] = svc + red
			}
		}
	}
	if p, ok := best["envoyproxy/ratelimit"]; ok {
		fmt.Printf("decisions per CPU second, Tollgate / envoyproxy/ratelimit (best runs): %.2f\n", p/best["tollgate"])
	}
	return nil
}

func startTollgate(bin, redisAddr, dir string, callers int64) (*target, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "tollgate.toml")
	if err := os.WriteFile(cfg, []byte("[[tiers]]\nname = \"free\"\nlimit = 1000000000\nwindow_seconds = 60\n"), 0o600); err != nil {
		return nil, err
	}
	token := fmt.Sprintf("peer-bench-%d-0123456789abcdefghijklmnop", time.Now().UnixNano())
	cmd := exec.Command(bin, "-config", cfg)
	cmd.Env = append(os.Environ(), "TOLLGATE_LISTEN="+addr, "TOLLGATE_REDIS_URL=redis://"+redisAddr+"/0",
		"TOLLGATE_DECISION_TOKEN="+token, "TOLLGATE_LOG_LEVEL=error")
	if err := start(cmd, "http://"+addr+"/health"); err != nil {
		return nil, err
	}
	return &target{name: "tollgate", cmd: cmd, url: "http://" + addr + "/v1/rate-limit/check",
		body: func(i int64) string {
			return fmt.Sprintf(`{"user_id":"bench-%d","endpoint":"/api/v1/items"}`, i%callers)
		},
		headers: map[string]string{"Authorization": "Bearer " + token}}, nil
}

// startPeer runs envoyproxy/ratelimit with one descriptor: a per-user limit
// as large as Tollgate's, over its HTTP JSON endpoint.
func startPeer(bin, redisAddr, dir string, callers int64) (*target, error) {
	conf := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		return nil, err
	}
	yaml := "domain: bench\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1000000000\n"
	if err := os.WriteFile(filepath.Join(conf, "config.yaml"), []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	var ports [3]string
	for i := range ports {
		a, err := freeAddr()
		if err != nil {
			return nil, err
		}
		_, ports[i], _ = net.SplitHostPort(a)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		"PORT="+ports[0], "GRPC_PORT="+ports[1], "DEBUG_PORT="+ports[2], "USE_STATSD=false", "LOG_LEVEL=error",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr, "REDIS_POOL_SIZE=64",
		"RUNTIME_ROOT="+filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false")
	base := "http://127.0.0.1:" + ports[0]
	if err := start(cmd, base+"/healthcheck"); err != nil {
		return nil, err
	}
	return &target{name: "envoyproxy/ratelimit", cmd: cmd, url: base + "/json",
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
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("INFO cpu\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		return 0, fmt.Errorf("INFO cpu: %q %v", head, err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(head[1:]))
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	var total float64
	for _, line := range strings.Split(string(body), "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second)), nil
}
