package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/devhost/gateway"
	"github.com/tollgate-rl/tollgate/shared/wire"
	"github.com/tollgate-rl/tollgate/testkit/llmdemo"
	"github.com/tollgate-rl/tollgate/testkit/redistest"
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

// startLLMGateway runs the gateway (two VMs, leases on) in front of the
// demo OpenAI-compatible upstream.
func startLLMGateway(t *testing.T, config string) (gw string, ctl *control) {
	t.Helper()
	r := redistest.Start(t)
	ctl = startControl(t, r.Addr, config)
	up := httptest.NewServer(llmdemo.Handler())
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	ctlURL, _ := url.Parse("http://" + ctl.addr)
	gw = serveGateway(t, gateway.Config{
		Wasm: wasmBytes, Upstream: upURL, Clusters: map[string]*url.URL{"controlsvc": ctlURL}, VMs: 2, CompilationCache: compCache, XFFTrustedHops: 1,
		PluginConfig: []byte(`{"control_cluster":"controlsvc","decision_token":"` + decisionToken + `","timeout_ms":2000,"lease":{"request":5}}`),
	})
	return gw, ctl
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

// Concurrent streamed and JSON answers through the gateway's two VMs: the
// counter equals the sum of the usage the answers reported, exactly.
func TestTokenBudgetExactThroughTheGateway(t *testing.T) {
	gw, ctl := startLLMGateway(t, llmRules)
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
				resp, body, err := chat(gw, ip, tokens, (g+i)%2 == 0)
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
	// The status names the deciding rule: the token budget's counter.
	st := status(t, ctl, "ip:"+ip, llmdemo.Path)
	if used := 1_000_000 - st.Remaining; st.RuleID != "llm_tokens" || used != sum {
		t.Fatalf("the counter spent %d (%+v); the answers reported %d", used, st, sum)
	}
}

// A budget is spent, goes below zero on the answer that crosses it, and
// refuses until it refills; the JSON answer's X-RateLimit-Remaining is the
// balance after its charge. A stream asked for without usage is charged
// the rule's cost for an unreported answer: no way around the budget.
func TestTokenBudgetThroughTheGateway(t *testing.T) {
	gw, _ := startLLMGateway(t, strings.NewReplacer("limit = 1000000\n", "limit = 1000\n", "cost = 5000", "cost = 1000").Replace(llmRules))
	resp, _, err := chat(gw, "203.0.113.81", 598, false)
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "400" {
		t.Fatalf("first answer: %v %v, remaining %q, want 400 (1000 - 600)", err, resp, resp.Header.Get("X-RateLimit-Remaining"))
	}
	resp, _, _ = chat(gw, "203.0.113.81", 898, false) // 900 of 400: into debt
	if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("the answer crossing the budget: %d, remaining %q", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
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
