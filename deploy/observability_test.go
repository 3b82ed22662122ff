package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

const (
	rulesFile     = "prometheus/tollgate-rules.yaml"
	rulesTestFile = "prometheus/tollgate-rules.test.yaml"
	dashboardFile = "grafana/tollgate-dashboard.json"
)

// The rules are valid, and their unit tests (alerts firing and not) pass.
func TestPrometheusRules(t *testing.T) {
	promtool := tool(t, "promtool", "prometheus")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// metricNames are the series Tollgate exports, read from where they are
// declared: the control service's metrics package, the filter's plugin
// (Envoy exports a Wasm plugin's metrics under their own names), and the
// recording rules.
func metricNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, src := range []struct {
		file string
		re   *regexp.Regexp
	}{
		{"../controlsvc/internal/metrics/metrics.go", regexp.MustCompile(`(?:Name:\s*|NewDesc\()"([a-z_:]+)"`)},
		{"../filter/internal/plugin/plugin.go", regexp.MustCompile(`Define\w+Metric\("([a-z_]+)"\)`)},
		{rulesFile, regexp.MustCompile(`record:\s*([a-z_:0-9]+)`)},
	} {
		b, err := os.ReadFile(src.file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range src.re.FindAllSubmatch(b, -1) {
			names[string(m[1])] = true
		}
	}
	if len(names) < 15 {
		t.Fatalf("found only %d metric names: %v", len(names), names)
	}
	return names
}

// seriesRE finds the metric names an expression reads.
var seriesRE = regexp.MustCompile(`\b((?:tollgate|rate_limiter)[a-z_:0-9]*)`)

// known reports whether name is a declared metric, or one of a histogram's
// series.
func known(names map[string]bool, name string) bool {
	for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && names[base] {
			return true
		}
	}
	return false
}

// The dashboard is valid JSON in Grafana's model, every panel that charts
// something has a query, and every query and rule reads metrics that exist.
func TestDashboardAndRulesReadRealMetrics(t *testing.T) {
	names := metricNames(t)
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title, UID string
		Panels     []struct {
			ID      int
			Type    string
			Title   string
			GridPos struct{ X, Y, W, H int }
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string
			}
		}
	}
	if err := json.Unmarshal(b, &d); err != nil || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard: %v", err)
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W < 1 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q outside the grid: %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" || p.Type == "text" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			checkExpr(t, names, "panel "+p.Title, q.Expr)
		}
	}
	rb, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct{ Record, Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(rb, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			checkExpr(t, names, "rule "+r.Record+r.Alert, r.Expr)
		}
	}
}

func checkExpr(t *testing.T, names map[string]bool, where, expr string) {
	t.Helper()
	found := seriesRE.FindAllString(expr, -1)
	if len(found) == 0 {
		t.Errorf("%s reads no Tollgate metric: %s", where, expr)
	}
	for _, n := range found {
		if !known(names, n) {
			t.Errorf("%s reads %s, which nothing exports", where, n)
		}
	}
}

// A real Prometheus scrapes a running control service, the recording rules
// evaluate, and TollgateRedisDown fires once Redis is stopped.
func TestPrometheusEndToEnd(t *testing.T) {
	prometheus := tool(t, "prometheus", "prometheus")
	r := redistest.Start(t)
	svcAddr, promAddr := freeAddr(t), freeAddr(t)
	dir := t.TempDir()

	cmd := exec.Command(controlsvcBinary(t))
	cmd.Env = []string{"TOLLGATE_LISTEN=" + svcAddr, "TOLLGATE_REDIS_URL=redis://" + r.Addr + "/0",
		"TOLLGATE_REDIS_TIMEOUT_MS=100", "TOLLGATE_REDIS_BREAKER_THRESHOLD=2", "TOLLGATE_REDIS_BREAKER_COOLDOWN_MS=5000"}
	var svcLog bytes.Buffer
	cmd.Stdout, cmd.Stderr = &svcLog, &svcLog
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: tollgate
    static_configs: [{targets: [%q]}]
`, rules, svcAddr)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	prom := exec.Command(prometheus, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	var promLog bytes.Buffer
	prom.Stdout, prom.Stderr = &promLog, &promLog
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prom.Process.Kill(); prom.Wait() })
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\ncontrol service:\n%s\nprometheus:\n%s", append(args, svcLog.String(), promLog.String())...)
	}

	// Decisions for the recording rules to see.
	check := func() {
		resp, err := http.Post("http://"+svcAddr+"/v1/rate-limit/check", "application/json", strings.NewReader(`{"user_id":"u1","endpoint":"/x"}`))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	await := func(what string, tick func(), done func() bool) {
		t.Helper()
		for !done() {
			if ctx.Err() != nil {
				fail("gave up waiting for %s", what)
			}
			tick()
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	query := func(q string) []any {
		resp, err := http.Get("http://" + promAddr + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var out struct {
			Data struct{ Result []any }
		}
		json.NewDecoder(bufio.NewReader(resp.Body)).Decode(&out)
		return out.Data.Result
	}
	await("the scrape of the control service", check, func() bool { return len(query(`up{job="tollgate"} == 1`)) == 1 })
	await("the recording rules", check, func() bool { return len(query(`tollgate:decisions:rate5m{result="allowed"}`)) > 0 })
	if len(query(`ALERTS{alertname="TollgateRedisDown"}`)) != 0 {
		fail("TollgateRedisDown is active while Redis is up")
	}

	r.Stop()
	firing := func() bool {
		resp, err := http.Get("http://" + promAddr + "/api/v1/alerts")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var out struct {
			Data struct {
				Alerts []struct {
					Labels map[string]string
					State  string
				}
			}
		}
		json.NewDecoder(resp.Body).Decode(&out)
		for _, a := range out.Data.Alerts {
			if a.Labels["alertname"] == "TollgateRedisDown" && a.State == "firing" {
				return true
			}
		}
		return false
	}
	await("TollgateRedisDown to fire", check, firing)
}
