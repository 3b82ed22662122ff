package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/gateway"
	"github.com/tollgate-rl/tollgate/shared/wire"
	"github.com/tollgate-rl/tollgate/testkit/llmdemo"
	"github.com/tollgate-rl/tollgate/testkit/redistest"
	"github.com/tollgate-rl/tollgate/testkit/windowtest"
)

const llmRules = `
[[tiers]]
name = "free"
limit = 100000000
window_seconds = 3600

[[rules]]
id = "llm_tokens"
path = "/v1/chat/completions"
scope = "ip"
algorithm = "fixed_window"
limit = 1000000
window_seconds = 3600
cost = 5000
cost_from = "response_json:usage.total_tokens"
`

// llmGateway is the gateway (two VMs, leases on) in front of the demo
// OpenAI-compatible upstream, and its control service.
type llmGateway struct {
	url string
	ctl *control
	g   *gateway.Gateway
	// ahead moves the filter's clock forward (a lease's expiry, without
	// waiting for it).
	ahead atomic.Int64
}

func startLLMGateway(t *testing.T, config string) *llmGateway {
	t.Helper()
	r := redistest.Start(t)
	l := &llmGateway{ctl: startControl(t, r.Addr, config)}
	up := httptest.NewServer(llmdemo.Handler())
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	ctlURL, _ := url.Parse("http://" + l.ctl.addr)
	l.url, l.g = serveGatewayOf(t, gateway.Config{
		Wasm: wasmBytes, Upstream: upURL, Clusters: map[string]*url.URL{"controlsvc": ctlURL}, VMs: 2, CompilationCache: compCache, XFFTrustedHops: 1,
		PluginConfig: []byte(`{"control_cluster":"controlsvc","decision_token":"` + decisionToken + `","timeout_ms":2000,"lease":{"request":5}}`),
		Now:          func() time.Time { return time.Now().Add(time.Duration(l.ahead.Load())) },
	})
	return l
}

// chat sends one chat completion through the gateway as ip, reporting
// tokens completion tokens; stream asks for server-sent events with usage.
func chat(gw, ip string, tokens int, stream bool) (*http.Response, []byte, error) {
	body := `{"model":"demo","messages":[{"role":"user","content":"abcd"}]}` // 2 prompt tokens
	if stream {
		body = `{"model":"demo","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"abcd"}]}`
	}
	req, _ := http.NewRequest(http.MethodPost, gw+llmdemo.Path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", ip)
	req.Header.Set(llmdemo.TokensHeader, strconv.Itoa(tokens))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// Concurrent streamed and JSON answers through the gateway's two VMs, with
// leases: a request is admitted on the lease's pool of the budget's tokens
// and its answer paid from it (what the pool lacks goes to the service).
// Once the leases are handed back, the counter is the sum of the usage the
// answers reported, exactly: the last answer's X-RateLimit-Remaining (its
// lease's pool counted as the caller's) is the budget less every token
// reported.
func TestTokenBudgetExactThroughTheGateway(t *testing.T) {
	l := startLLMGateway(t, llmRules)
	const ip = "203.0.113.80"
	var mu sync.Mutex
	var sum int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				tokens := 10 + 37*g + i
				resp, body, err := chat(l.url, ip, tokens, (g+i)%2 == 0)
				if err != nil || resp.StatusCode != 200 {
					t.Errorf("chat: %v %v %s", err, resp, body)
					return
				}
				if (g+i)%2 == 0 && !bytes.Contains(body, []byte(`"total_tokens":`+strconv.Itoa(tokens+2))) {
					t.Errorf("the stream lost its usage event: %s", body)
				}
				mu.Lock()
				sum += int64(tokens + 2)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	host := l.g.Host()
	paid, charges := host.Counter("tollgate_lease_paid_cost_total"), host.Counter("tollgate_charges_total")
	if paid == 0 || charges >= 80 {
		t.Fatalf("leases paid %d tokens, %d charges sent of 80 answers: the leases paid nothing", paid, charges)
	}
	// The status names the deciding rule: the token budget's counter,
	// with the leases' unspent pools still out.
	st := status(t, l.ctl, "ip:"+ip, llmdemo.Path)
	if used := 1_000_000 - st.Remaining; st.RuleID != "llm_tokens" || used < sum {
		t.Fatalf("the counter spent %d (%+v); the answers reported %d", used, st, sum)
	}
	// Past the leases' TTL the next request hands the pools back and is
	// paid from its own lease.
	l.ahead.Store(int64(2 * time.Second))
	resp, _, err := chat(l.url, ip, 5, false)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("last chat: %v %v", err, resp)
	}
	// Its headers left before its body's usage was read: they count every
	// answer before it and its own admission (1 of its 7 tokens).
	if got := resp.Header.Get("X-RateLimit-Remaining"); got != strconv.FormatInt(1_000_000-sum-1, 10) {
		t.Logf("paid %d charges %d failures %d unreported %d hits %d", paid, charges, host.Counter("tollgate_charge_failures_total"), host.Counter("tollgate_charges_unreported_total"), host.Counter("tollgate_lease_hits_total"))
		t.Fatalf("X-RateLimit-Remaining %s; the answers before reported %d of 1000000", got, sum)
	}
	if host.Counter("tollgate_lease_paid_cost_total") != paid+6 {
		t.Fatal("the last answer was not paid from its lease")
	}
}

// A budget is spent, goes below zero on the answer that crosses it, and
// refuses until it refills; a JSON answer's X-RateLimit-Remaining is the
// balance at its admission (its headers go before its body is read: Envoy
// gives a filter holding them no body). A stream asked for without usage is charged
// the rule's cost for an unreported answer: no way around the budget.
func TestTokenBudgetThroughTheGateway(t *testing.T) {
	gw := startLLMGateway(t, strings.NewReplacer("limit = 1000000\n", "limit = 1000\n", "cost = 5000", "cost = 1000").Replace(llmRules)).url
	resp, _, err := chat(gw, "203.0.113.81", 598, false)
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "999" {
		t.Fatalf("first answer: %v %v, remaining %q, want 999 (1000 less its admission)", err, resp, resp.Header.Get("X-RateLimit-Remaining"))
	}
	resp, _, _ = chat(gw, "203.0.113.81", 898, false) // 900 of 400: into debt
	if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "399" {
		t.Fatalf("the answer crossing the budget: %d, remaining %q, want 399 (1000 - 600 - its admission)", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
	}
	resp, body, _ := chat(gw, "203.0.113.81", 1, false)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("in debt: %d %s", resp.StatusCode, body)
	}
	// Without include_usage a stream reports nothing: charged the rule's
	// cost (1000, the whole budget).
	req, _ := http.NewRequest(http.MethodPost, gw+llmdemo.Path, strings.NewReader(`{"stream":true,"messages":[]}`))
	req.Header.Set("X-Forwarded-For", "203.0.113.82")
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	events := 0
	sc := bufio.NewScanner(sresp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
	}
	sresp.Body.Close()
	if sresp.StatusCode != 200 || events < 2 {
		t.Fatalf("stream: %d, %d events", sresp.StatusCode, events)
	}
	if resp, body, _ := chat(gw, "203.0.113.82", 1, false); resp.StatusCode != 429 {
		t.Fatalf("after a stream that reported no usage: %d %s, want 429", resp.StatusCode, body)
	}
}

// status reads a caller's counter through the decision API.
func status(t *testing.T, ctl *control, id, endpoint string) wire.StatusResponse {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+ctl.addr+wire.PathStatus+"/"+id+endpoint, nil)
	req.Header.Set("Authorization", "Bearer "+decisionToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st wire.StatusResponse
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status: %d %v", resp.StatusCode, err)
	}
	return st
}

// The README's token budget demo, on the example configuration the
// `make run` service loads, through the gateway with leases: each request
// holds the reserve of 500 until its answer of 402 tokens is charged and
// the rest handed back, so three answers leave 294 and the fourth request
// is refused by llm_tokens (the only limit of 1,500), naming what is left
// (the filter sent each charge back with its reserve: without the
// hand-backs nothing would be).
func TestReadmeTokenBudgetDemo(t *testing.T) {
	config, err := os.ReadFile("../controlsvc/tollgate.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	l := startLLMGateway(t, string(config))
	windowtest.RoomInMinute(t) // llm_tokens counts a minute
	for i := range 5 {
		req, _ := http.NewRequest(http.MethodPost, l.url+llmdemo.Path, strings.NewReader(`{"model":"demo","messages":[{"role":"user","content":"hello"}]}`))
		req.Header.Set("X-Forwarded-For", "203.0.113.90")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case i < 3 && resp.StatusCode != 200:
			t.Fatalf("answer %d: %d %s", i+1, resp.StatusCode, body)
		case i >= 3 && (resp.StatusCode != 429 || !bytes.Contains(body, []byte(`"limit":1500`)) || resp.Header.Get("X-RateLimit-Limit") != "1500"),
			i == 3 && resp.Header.Get("X-RateLimit-Remaining") != "294":
			t.Fatalf("request %d: %d %s %v, want refused by llm_tokens (limit 1500) with 294 left", i+1, resp.StatusCode, body, resp.Header)
		}
	}
}

// The proxy's own answers to a request the filter admitted (its body past
// the buffer: 413; the upstream down: 502) pass the filter's response
// path, as a router's local reply passes Envoy's encoder filters: the
// filter sees an error answer reporting no usage, and the request costs
// its admission, its reserve handed back (written past the filter, the
// charge was a cut stream's: 1,000 tokens for a 413, attack 61 B2).
func TestProxyAnswersThroughTheFilter(t *testing.T) {
	config, err := os.ReadFile("../controlsvc/tollgate.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	l := startLLMGateway(t, string(config))
	windowtest.RoomInMinute(t) // a hand-back goes into its own minute only
	big := `{"model":"demo","pad":"` + strings.Repeat("x", 2<<20) + `","messages":[{"role":"user","content":"hello"}]}`
	req, _ := http.NewRequest(http.MethodPost, l.url+llmdemo.Path, strings.NewReader(big))
	req.Header.Set("X-Forwarded-For", "203.0.113.93")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body past the buffer: %d, want 413", resp.StatusCode)
	}
	// The charge leaves with the stream's end: await it.
	left := int64(-1)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, r := range status(t, l.ctl, "ip:203.0.113.93", llmdemo.Path).Rules {
			if r.RuleID == "llm_tokens" {
				left = r.Remaining
			}
		}
		if left == 1499 {
			return
		}
	}
	t.Fatalf("after the 413: llm_tokens at %d, want 1,499 (the admission's 1)", left)
}
