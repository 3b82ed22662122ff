package app_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/testkit/windowtest"
)

// A token budget: cost_from response_json. The check admits at 1 and lists
// the rule; the charge spends what the response reported less that 1; the
// balance may go below zero, and the caller is refused until it refills. In
// Redis and in memory alike.
const tokenRules = `
[[tiers]]
name = "free"
limit = 100000
window_seconds = 60

[[rules]]
id = "tokens"
path = "/v1/chat/*"
scope = "user"
algorithm = "fixed_window"
limit = 1000
window_seconds = 3600
cost = 300
cost_from = "response_json:usage.total_tokens"
`

func chargeBody(user string, items ...any) map[string]any {
	return map[string]any{"user_id": user, "endpoint": "/v1/chat/completions", "method": "POST", "charges": items}
}

func TestTokenBudget(t *testing.T) {
	for _, mode := range []string{"redis", "memory"} {
		t.Run(mode, func(t *testing.T) {
			env := map[string]string{}
			if mode == "memory" {
				env["TOLLGATE_REDIS_ENABLED"] = "false"
			}
			s := startService(t, tokenRules, env)
			check := map[string]any{"user_id": "alice", "endpoint": "/v1/chat/completions", "method": "POST"}
			r := s.check(check)
			m := r.json(t)
			if r.status != 200 || num(t, m, "remaining") != 999 || num(t, m["lease"].(map[string]any), "granted") != 0 {
				t.Fatalf("admission: %d %s", r.status, r.body)
			}
			if cs, _ := m["charges"].([]any); len(cs) != 1 || cs[0].(map[string]any)["cost_from"] != "response_json:usage.total_tokens" {
				t.Fatalf("charges: %s", r.body)
			}
			ch := s.do("POST", "/v1/rate-limit/charge", chargeBody("alice", map[string]any{"rule_id": "tokens", "cost": 400}))
			res := ch.json(t)["results"].([]any)[0].(map[string]any)
			if ch.status != 200 || num(t, res, "charged") != 399 || num(t, res, "remaining") != 600 || num(t, res, "limit") != 1000 {
				t.Fatalf("charge: %d %s", ch.status, ch.body)
			}
			// A response that reports nothing costs the rule's cost (300).
			s.check(check)
			ch = s.do("POST", "/v1/rate-limit/charge", chargeBody("alice", map[string]any{"rule_id": "tokens", "unreported": "missing"}))
			if res := ch.json(t)["results"].([]any)[0].(map[string]any); num(t, res, "charged") != 299 || num(t, res, "remaining") != 300 {
				t.Fatalf("unreported: %s", ch.body)
			}
			// An error answer that reports no usage costs its admission only.
			s.check(check)
			ch = s.do("POST", "/v1/rate-limit/charge", chargeBody("alice", map[string]any{"rule_id": "tokens", "unreported": "error"}))
			if res := ch.json(t)["results"].([]any)[0].(map[string]any); num(t, res, "charged") != 0 || num(t, res, "remaining") != 299 {
				t.Fatalf("an error answer: %s", ch.body)
			}
			// Into debt: 1 + 900 of a balance of 299.
			s.check(check)
			ch = s.do("POST", "/v1/rate-limit/charge", chargeBody("alice", map[string]any{"rule_id": "tokens", "cost": 900}))
			if res := ch.json(t)["results"].([]any)[0].(map[string]any); num(t, res, "charged") != 899 || num(t, res, "remaining") != 0 {
				t.Fatalf("into debt: %s", ch.body)
			}
			if r := s.check(check); r.status != 429 {
				t.Fatalf("admitted in debt: %d %s", r.status, r.body)
			}
			// The debt stops at minus a hundred capacities: of 199,999
			// more, 99,399 go on (the balance was -601).
			ch = s.do("POST", "/v1/rate-limit/charge", chargeBody("alice", map[string]any{"rule_id": "tokens", "cost": 200_000}))
			if res := ch.json(t)["results"].([]any)[0].(map[string]any); num(t, res, "charged") != 99_399 || num(t, res, "clamped") != 100_600 {
				t.Fatalf("at the floor: %s", ch.body)
			}
			// Another caller's budget is whole.
			if r := s.check(map[string]any{"user_id": "bob", "endpoint": "/v1/chat/completions"}); r.status != 200 {
				t.Fatalf("bob: %d %s", r.status, r.body)
			}
			// Usage counts the tokens: 1 + 399, 1 + 299, 1, 1 + 899, 99,399 more.
			if err := s.app.FlushUsage(context.Background()); err != nil {
				t.Fatal(err)
			}
			u := s.admin("GET", "/admin/v1/usage/alice", nil)
			if !strings.Contains(string(u.body), `"total_requests":101000`) {
				t.Fatalf("usage: %s", u.body)
			}
		})
	}
}

// A lease under a response-cost rule: beside the tokens every rule grants
// (requests: the tier's limits), a pool of that rule's own tokens
// (charge_granted). The filter admits a request on one of each and pays the
// response's cost from the pool first, reporting what it spent; what it
// hands back goes back to each counter. Only for a filter that says it
// reads the responses (lease_charges); never under two such rules or an
// estimate.
func TestTokenBudgetLease(t *testing.T) {
	s := startService(t, tokenRules, nil)
	check := map[string]any{"user_id": "dave", "endpoint": "/v1/chat/completions", "method": "POST", "lease": 5, "lease_charges": true}
	lease := func(m map[string]any) (int64, int64) {
		l := m["lease"].(map[string]any)
		cg, _ := l["charge_granted"].(float64)
		return num(t, l, "granted"), int64(cg)
	}
	// Under several rules a counter's first request gets no lease (a
	// client walking paths would strand tokens in leases): the second does.
	if g, cg := lease(s.check(check).json(t)); g != 0 || cg != 0 {
		t.Fatalf("a fresh counter's lease: %d and %d", g, cg)
	}
	m := s.check(check).json(t)
	// 5 requests of the tier's limits; 5 requests' worth of 300 tokens
	// (the rule's cost), at most a tenth of the 998 left after admission.
	if g, cg := lease(m); g != 5 || cg != 99 || num(t, m, "remaining") != 899 || m["rule_id"] != "tokens" {
		t.Fatalf("lease: granted %d and %d, remaining %d; want 5, 99 and 899: %v", g, cg, num(t, m, "remaining"), m)
	}
	// The filter admitted one request on the lease and paid its answer
	// (60 tokens) from the pool: 60 spent; 4 and 39 handed back.
	check["returned"], check["charge_returned"], check["spent"] = 4, 39, 60
	at, _ := m["lease"].(map[string]any)["leased_at"].(float64)
	check["leased_at"] = int64(at)
	check["charge_leased_at"] = int64(m["lease"].(map[string]any)["charge_leased_at"].(float64))
	m = s.check(check).json(t)
	if g, cg := lease(m); g != 5 || cg != 93 || num(t, m, "remaining") != 844 {
		t.Fatalf("refill: granted %d and %d, remaining %d; want 5, 93 (of 938-1) and 844", g, cg, num(t, m, "remaining"))
	}
	if err := s.app.FlushUsage(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Usage counts tokens: 1, 1, the 60 the lease paid, 1.
	if u := s.admin("GET", "/admin/v1/usage/dave", nil); !strings.Contains(string(u.body), `"total_requests":63`) {
		t.Fatalf("usage: %s", u.body)
	}
	// A filter that does not read responses on a lease hit gets none.
	r := s.check(map[string]any{"user_id": "erin", "endpoint": "/v1/chat/completions", "lease": 5})
	if g, cg := lease(r.json(t)); g != 0 || cg != 0 {
		t.Fatalf("without lease_charges: granted %d and %d", g, cg)
	}
	for name, config := range map[string]string{
		"two response costs": tokenRules + "\n[[rules]]\nid = \"per_address\"\npath = \"/v1/chat/*\"\nscope = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 100000\nwindow_seconds = 60\ncost_from = \"response_header:x-tokens\"\n",
		"estimate":           strings.Replace(tokenRules, "cost = 300", "cost = 300\nestimate_from = \"request_header:x-max-tokens\"", 1),
	} {
		s := startService(t, config, nil)
		delete(check, "returned")
		delete(check, "spent")
		delete(check, "charge_returned")
		check["client_address"] = "203.0.113.9"
		s.check(check)
		r := s.check(check)
		if g, cg := lease(r.json(t)); r.status != 200 || g != 0 || cg != 0 {
			t.Fatalf("%s: %d, granted %d and %d: %s", name, r.status, g, cg, r.body)
		}
	}
}

// Concurrent admissions and charges of one caller: the counter is exactly
// the sum of what the responses reported.
func TestTokenBudgetExactUnderConcurrency(t *testing.T) {
	s := startService(t, strings.Replace(tokenRules, "limit = 1000\nwindow_seconds = 3600", "limit = 1000000\nwindow_seconds = 3600", 1), nil)
	var sum atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 25 {
				if st := s.checkStatus(map[string]any{"user_id": "carol", "endpoint": "/v1/chat/completions"}); st != 200 {
					t.Errorf("check: %d", st)
					return
				}
				n := 1 + rng.Int64N(2000)
				r, err := s.tryDo("POST", "/v1/rate-limit/charge", chargeBody("carol", map[string]any{"rule_id": "tokens", "cost": n}))
				if err != nil || r.status != 200 || strings.Contains(string(r.body), `"error"`) {
					t.Errorf("charge: %v %v", r, err)
					return
				}
				sum.Add(n)
			}
		}()
	}
	wg.Wait()
	// A charge of 1 (the admission's own) spends nothing and reads the
	// rule's counter.
	r := s.do("POST", "/v1/rate-limit/charge", chargeBody("carol", map[string]any{"rule_id": "tokens", "cost": 1}))
	res := r.json(t)["results"].([]any)[0].(map[string]any)
	if used := 1_000_000 - num(t, res, "remaining"); num(t, res, "charged") != 0 || used != sum.Load() {
		t.Fatalf("the counter spent %d; the responses reported %d", used, sum.Load())
	}
}

// Hostile and broken charges: each refused with the field named, or
// answered per rule, never charged at will.
func TestChargeBadInput(t *testing.T) {
	s := startService(t, tokenRules+`
[[rules]]
id = "plain"
path = "/v1/*"
scope = "ip"
algorithm = "fixed_window"
limit = 100
window_seconds = 60
`, nil)
	nine := make([]any, 9)
	for i := range nine {
		nine[i] = map[string]any{"rule_id": "tokens", "cost": 1}
	}
	for _, tc := range []struct {
		name  string
		body  any
		field string
	}{
		{"no charges", chargeBody("alice"), "charges"},
		{"nine charges", chargeBody("alice", nine...), "charges"},
		{"negative cost", chargeBody("alice", map[string]any{"rule_id": "tokens", "cost": -5}), "charges[0].cost"},
		{"cost past 2^53", chargeBody("alice", map[string]any{"rule_id": "tokens", "cost": int64(1) << 54}), "charges[0].cost"},
		{"fractional cost", chargeBody("alice", map[string]any{"rule_id": "tokens", "cost": 1.5}), "cost"},
		{"cost and a reason", chargeBody("alice", map[string]any{"rule_id": "tokens", "cost": 5, "unreported": "cut"}), "charges[0].unreported"},
		{"neither", chargeBody("alice", map[string]any{"rule_id": "tokens"}), "charges[0].unreported"},
		{"an unknown reason", chargeBody("alice", map[string]any{"rule_id": "tokens", "unreported": "<script>"}), "charges[0].unreported"},
		{"no rule", chargeBody("alice", map[string]any{"cost": 5}), "charges[0].rule_id"},
		{"at_least beside a cost", chargeBody("alice", map[string]any{"rule_id": "tokens", "cost": 5, "at_least": 5}), "charges[0].at_least"},
		{"at_least of an answer not cut", chargeBody("alice", map[string]any{"rule_id": "tokens", "unreported": "missing", "at_least": 5}), "charges[0].at_least"},
		{"a negative at_least", chargeBody("alice", map[string]any{"rule_id": "tokens", "unreported": "cut", "at_least": -5}), "charges[0].at_least"},
		{"a negative reserve", chargeBody("alice", map[string]any{"rule_id": "tokens", "cost": 5, "reserved": -1, "reserved_at": 5}), "charges[0].reserved"},
		{"a reserve past 2^53", chargeBody("alice", map[string]any{"rule_id": "tokens", "cost": 5, "reserved": int64(1) << 54, "reserved_at": 5}), "charges[0].reserved"},
		{"a reserve from no stretch", chargeBody("alice", map[string]any{"rule_id": "tokens", "cost": 5, "reserved": 10}), "charges[0].reserved_at"},
		{"no caller", map[string]any{"endpoint": "/v1/chat/x", "charges": []any{map[string]any{"rule_id": "tokens", "cost": 5}}}, "user_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := s.do("POST", "/v1/rate-limit/charge", tc.body)
			if r.status != 400 || !strings.Contains(string(r.body), tc.field) {
				t.Fatalf("%d %s, want 400 naming %s", r.status, r.body, tc.field)
			}
		})
	}
	// A rule that takes no cost from the response, or one that does not
	// match the request, is not charged: the answer says so per rule.
	r := s.do("POST", "/v1/rate-limit/charge", map[string]any{"user_id": "ip:192.0.2.9", "endpoint": "/v1/other", "charges": []any{
		map[string]any{"rule_id": "plain", "cost": 50}, map[string]any{"rule_id": "tokens", "cost": 50}}})
	if r.status != 200 || strings.Count(string(r.body), "takes no cost from the response") != 2 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	st := s.do("GET", "/v1/rate-limit/status/ip:192.0.2.9/v1/other", nil).json(t)
	if num(t, st, "remaining") != 100 || st["rule_id"] != "plain" {
		t.Fatalf("a refused charge spent: %v", st)
	}
	// Without the decision credential nobody charges (it would spend any
	// caller's budget it names).
	open := startService(t, tokenRules, map[string]string{"TOLLGATE_DECISION_TOKEN": ""})
	r = open.do("POST", "/v1/rate-limit/charge", chargeBody("alice", map[string]any{"rule_id": "tokens", "cost": 5}))
	if r.status != 403 || !strings.Contains(string(r.body), "charges") {
		t.Fatalf("untrusted charge: %d %s", r.status, r.body)
	}
	// So no charge follows an untrusted check: it spends what an
	// unreported answer costs (300 of 1,000) at admission, and names no
	// charge (an outsider's 51 checks of a token-less service went
	// through the budget at one token each).
	admitted := 0
	for range 10 {
		r := open.check(map[string]any{"user_id": "alice", "endpoint": "/v1/chat/completions", "method": "POST"})
		switch {
		case r.status == 200 && r.json(t)["charges"] == nil:
			admitted++
		case r.status != 429:
			t.Fatalf("untrusted check: %d %s", r.status, r.body)
		}
	}
	if admitted != 3 {
		t.Fatalf("%d of 10 untrusted checks admitted, want 3 (1,000 tokens, 300 an answer)", admitted)
	}
}

// An estimate from the request (estimate_from: a max_tokens the client
// declares) is what must be left to admit: admission still spends 1.
func TestTokenBudgetEstimate(t *testing.T) {
	s := startService(t, strings.Replace(tokenRules, `cost_from = "response_json:usage.total_tokens"`,
		`cost_from = "response_json:usage.total_tokens"`+"\nestimate_from = \"request_header:x-max-tokens\"", 1), nil)
	check := func(maxTokens string) *response {
		return s.check(map[string]any{"user_id": "erin", "endpoint": "/v1/chat/completions", "cost_headers": map[string]string{"x-max-tokens": maxTokens}})
	}
	if r := check("800"); r.status != 200 || num(t, r.json(t), "remaining") != 999 {
		t.Fatalf("admission: %d %s", r.status, r.body)
	}
	s.do("POST", "/v1/rate-limit/charge", chargeBody("erin", map[string]any{"rule_id": "tokens", "cost": 700})) // 300 left
	if r := check("301"); r.status != 429 {
		t.Fatalf("an estimate above what is left: %d %s", r.status, r.body)
	}
	if r := check("300"); r.status != 200 || num(t, r.json(t), "remaining") != 299 {
		t.Fatalf("an estimate that fits: %d %s, want admitted spending 1", r.status, r.body)
	}
	// Violations count tokens under such a rule: the refused request asked
	// for 301; its audit event says so.
	if err := s.app.FlushUsage(context.Background()); err != nil {
		t.Fatal(err)
	}
	if u := s.admin("GET", "/admin/v1/usage/erin", nil); !strings.Contains(string(u.body), `"violations":301`) {
		t.Fatalf("usage: %s", u.body)
	}
	if a := s.admin("GET", "/admin/v1/audit?type=violation", nil); !strings.Contains(string(a.body), `"rule_id":"tokens","cost":301`) {
		t.Fatalf("audit: %s", a.body)
	}
	for v, want := range map[string]string{"lots": "is not a whole number", "-1": "is not a whole number", "1001": "more than rule tokens can ever have left"} {
		if r := check(v); r.status != 400 || !strings.Contains(string(r.body), want) || !strings.Contains(string(r.body), `x-max-tokens`) {
			t.Errorf("estimate %q: %d %s", v, r.status, r.body)
		}
	}
}

// A stream cut after it reported usage costs at least that (the filter
// sends it as at_least), the rule's cost when more: a client that read a
// 10,401-token answer whole and reset the connection paid 1,000 (attack
// 63 S1).
func TestChargeOfACutStream(t *testing.T) {
	s := startService(t, tokenRules, nil)
	check := map[string]any{"user_id": "sid", "endpoint": "/v1/chat/completions", "method": "POST"}
	for _, tc := range []struct {
		atLeast, charged, remaining int64
	}{
		{700, 699, 300}, // more than the rule's cost (300)
		{10, 299, 0},    // less: the rule's cost
	} {
		if r := s.check(check); r.status != 200 {
			t.Fatalf("admission: %d %s", r.status, r.body)
		}
		ch := s.do("POST", "/v1/rate-limit/charge", chargeBody("sid", map[string]any{"rule_id": "tokens", "unreported": "cut", "at_least": tc.atLeast}))
		if res := ch.json(t)["results"].([]any)[0].(map[string]any); num(t, res, "charged") != tc.charged || num(t, res, "remaining") != tc.remaining {
			t.Fatalf("a stream cut at least %d: %s, want charged %d with %d left", tc.atLeast, ch.body, tc.charged, tc.remaining)
		}
	}
}

// With Redis down under fail_open a charge carrying an API key that cannot
// be looked up is its caller's, as the check was (an outsider's: each
// charge was refused and lost, and a made-up key made every answer cost
// its admission only).
func TestRedisDownChargeWithAnUnverifiableKey(t *testing.T) {
	s := startService(t, strings.Replace(tokenRules, `scope = "user"`, `scope = "ip"`, 1),
		map[string]string{"TOLLGATE_REDIS_BREAKER_COOLDOWN_MS": "50", "TOLLGATE_FAILURE_MODE": "fail_open"})
	s.redis.Stop()
	key := func(c byte) string { return "ak_live_" + strings.Repeat(string(c), 43) }
	check := map[string]any{"user_id": "ip:198.51.100.30", "endpoint": "/v1/chat/completions", "method": "POST", "api_key": key('a')}
	if r := s.check(check); r.status != 200 {
		t.Fatalf("admission: %d %s", r.status, r.body)
	}
	body := chargeBody("ip:198.51.100.30", map[string]any{"rule_id": "tokens", "cost": 1000})
	body["api_key"] = key('b')
	if ch := s.do("POST", "/v1/rate-limit/charge", body); ch.status != 200 {
		t.Fatalf("charge: %d %s", ch.status, ch.body)
	}
	check["api_key"] = key('c')
	if r := s.check(check); r.status != 429 {
		t.Fatalf("after a charge of the whole budget: %d %s", r.status, r.body)
	}
}

// With Redis down a replica counts in memory, and the charges of a
// caller's answers may reach another replica than their checks (an
// outsider's round robin over two replicas: 750 answers against a budget
// that allowed 4). An admission counted in memory spends what an
// unreported response costs, so the answers a replica admits are bounded
// by its share of the budget with no charge at all.
func TestRedisDownResponseCostAdmissions(t *testing.T) {
	// 1000 an hour over two replicas: 500 here; an answer that reports
	// nothing costs 300.
	s := startService(t, tokenRules, map[string]string{"TOLLGATE_REDIS_BREAKER_COOLDOWN_MS": "50", "TOLLGATE_FAILURE_MODE": "fail_open", "TOLLGATE_REPLICAS": "2"})
	s.redis.Stop()
	if admitted := degradedAdmissions(t, s, map[string]any{"user_id": "dave", "endpoint": "/v1/chat/completions", "method": "POST"}, 10); admitted != 1 {
		t.Fatalf("%d answers admitted with no charge reaching this replica, want 1 (300 of its 500)", admitted)
	}
}

// With Redis down under fail_open, a charge that hands a reserve back is
// lost, never counted in memory as another admission (attack 58 F7: an
// answer that used 10 tokens cost its caller an admission's 400 here).
func TestRedisDownReserveHandBack(t *testing.T) {
	s := startService(t, reserveRules(400), map[string]string{"TOLLGATE_REDIS_BREAKER_COOLDOWN_MS": "50", "TOLLGATE_FAILURE_MODE": "fail_open"})
	check := map[string]any{"user_id": "dora", "endpoint": "/v1/chat/completions", "method": "POST"}
	r := s.check(check)
	if r.status != 200 {
		t.Fatalf("admission: %d %s", r.status, r.body)
	}
	c := r.json(t)["charges"].([]any)[0].(map[string]any)
	s.redis.Stop()
	ch := s.do("POST", "/v1/rate-limit/charge", chargeBody("dora", map[string]any{"rule_id": "tokens", "cost": 10, "reserved": c["reserved"], "reserved_at": c["reserved_at"]}))
	if !strings.Contains(string(ch.body), "not handed back") {
		t.Errorf("a hand-back that could not reach Redis: %s, want it said", ch.body)
	}
	// In memory each admission spends the reserve (400 of 1,000): two.
	if admitted := degradedAdmissions(t, s, check, 5); admitted != 2 {
		t.Fatalf("%d admitted in memory after a hand-back, want 2 (400 of 1,000 each)", admitted)
	}
}

// degradedAdmissions sends check n times with Redis down and counts those
// admitted in memory (degraded); every other answer must be a refusal.
func degradedAdmissions(t *testing.T, s *service, check map[string]any, n int) int {
	t.Helper()
	admitted := 0
	for i := range n {
		r := s.check(check)
		switch {
		case r.status == 200 && r.json(t)["degraded"] == true:
			admitted++
		case r.status != 429:
			t.Fatalf("check %d: %d %s", i, r.status, r.body)
		}
	}
	return admitted
}

// A lease's pool goes back only to the window it came from, by its own
// stamp (charge_leased_at), whichever rule decided: beside a request rule
// that decides (fewer left), an LLM pool's tokens handed back after the
// pool's window ended must not come back into the next one (an outsider
// drained the request rule to push its reset out and got 20,600 tokens of
// a 15,000 budget), and the tier's buckets, full again within moments,
// must not take the pool's hand-back with them.
func TestLeaseHandBackAfterItsWindow(t *testing.T) {
	s := startService(t, `
[[tiers]]
name = "free"
limit = 60
window_seconds = 60
algorithm = "token_bucket"
`+tokenRules[strings.Index(tokenRules, "[[rules]]"):], nil)
	for _, tc := range []struct {
		name   string
		shift  int64 // added to the pool's stamp (µs) when handing back
		wantCG int64
	}{
		{"in its window", 0, 93},                // the 39 come back: a tenth of 938-1
		{"after its window", 3_600_000_000, 89}, // nothing comes back: a tenth of 899-1
	} {
		t.Run(tc.name, func(t *testing.T) {
			check := map[string]any{"user_id": "erin-" + tc.name, "endpoint": "/v1/chat/completions", "method": "POST", "lease": 5, "lease_charges": true}
			s.check(check)
			m := s.check(check).json(t)
			l := m["lease"].(map[string]any)
			at, _ := l["leased_at"].(float64)
			chargeAt, _ := l["charge_leased_at"].(float64)
			if m["rule_id"] == "tokens" || l["charge_granted"] != 99.0 {
				t.Fatalf("want a lease decided by the tier, with 99 of the pool: %v", m)
			}
			now := time.Now().UnixMicro()
			if int64(chargeAt)%3_600_000_000 != 0 || int64(chargeAt) > now || int64(chargeAt) <= now-3_600_000_000 {
				t.Fatalf("charge_leased_at %v at %d: want the start of the pool's hour", chargeAt, now)
			}
			if int64(at) > now {
				t.Fatalf("leased_at %v at %d: want a moment the tier's buckets were full since", at, now)
			}
			// The stamp of the hour after: a later window's (the service
			// chose the hour by its clock) credits nothing either.
			check["returned"], check["charge_returned"], check["spent"] = 4, 39, 60
			check["leased_at"], check["charge_leased_at"] = int64(at), int64(chargeAt)+tc.shift
			m = s.check(check).json(t)
			if cg, _ := m["lease"].(map[string]any)["charge_granted"].(float64); int64(cg) != tc.wantCG {
				t.Fatalf("the next lease's pool: %v; want %d", m, tc.wantCG)
			}
		})
	}
}

// A charge is paid by the key that was valid when its request was
// admitted, though the key was revoked since: an outsider timed a burst
// of answers to end after its key's expiry, every charge was refused,
// and 5,600 tokens were served against a budget of 1,500. A key no one
// issued is still refused.
func TestChargeOfAKeyRevokedSince(t *testing.T) {
	s := startService(t, tokenRules, nil)
	mk := func() string {
		r := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "kate"})
		if r.status != 201 && r.status != 200 {
			t.Fatalf("new key: %d %s", r.status, r.body)
		}
		return r.json(t)["api_key"].(string)
	}
	old, other := mk(), mk()
	check := map[string]any{"user_id": "ip:198.51.100.40", "endpoint": "/v1/chat/completions", "method": "POST", "api_key": old}
	if r := s.check(check); r.status != 200 {
		t.Fatalf("admission: %d %s", r.status, r.body)
	}
	if r := s.admin("POST", "/admin/v1/api-keys/"+old+"/revoke", nil); r.status != 200 {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	body := chargeBody("ip:198.51.100.40", map[string]any{"rule_id": "tokens", "cost": 1000})
	body["api_key"] = old
	if ch := s.do("POST", "/v1/rate-limit/charge", body); ch.status != 200 {
		t.Fatalf("the charge of a key revoked since its admission: %d %s", ch.status, ch.body)
	}
	check["api_key"] = other // the same user's budget, spent by the charge
	if r := s.check(check); r.status != 429 {
		t.Fatalf("after a charge of the whole budget: %d %s", r.status, r.body)
	}
	body["api_key"] = "ak_live_" + strings.Repeat("z", 43)
	if ch := s.do("POST", "/v1/rate-limit/charge", body); ch.status == 200 {
		t.Fatalf("a charge with a key no one issued: %d %s", ch.status, ch.body)
	}
}

// reserveRules is tokenRules with a reserve of n.
func reserveRules(n int) string {
	return strings.Replace(tokenRules, `cost_from = "response_json:usage.total_tokens"`,
		`cost_from = "response_json:usage.total_tokens"`+"\nreserve = "+strconv.Itoa(n), 1)
}

// modes runs f against Redis and against the in-memory limiter
// (redis_enabled = false), which hold reserves alike.
func modes(t *testing.T, f func(t *testing.T, env map[string]string)) {
	for _, mode := range []string{"redis", "memory"} {
		t.Run(mode, func(t *testing.T) {
			env := map[string]string{}
			if mode == "memory" {
				env["TOLLGATE_REDIS_ENABLED"] = "false"
			}
			f(t, env)
		})
	}
}

// A reserve bounds what a caller has in flight: each admission holds the
// reserve (admitted only while that much is left) until its charge, which
// hands back what the response did not use, into the stretch it came from,
// and charges the rest of a larger cost. Admitting on 1 left, an
// outsider's 1,000 requests at once against 2,000 tokens were served 906
// (3.7 million tokens). Every algorithm that takes a charge, in Redis and
// in memory (which held none: 40 of 40 admitted, attack 58 F3).
func TestTokenBudgetReserve(t *testing.T) {
	modes(t, func(t *testing.T, env map[string]string) {
		for _, alg := range []string{"fixed_window", "sliding_window", "token_bucket", "gcra"} {
			t.Run(alg, func(t *testing.T) {
				s := startService(t, strings.Replace(reserveRules(400), `algorithm = "fixed_window"`, `algorithm = "`+alg+`"`, 1), env)
				check := map[string]any{"user_id": "ruth", "endpoint": "/v1/chat/completions", "method": "POST"}
				admit := func(remaining int64) map[string]any {
					t.Helper()
					r := s.check(check)
					m := r.json(t)
					if r.status != 200 || num(t, m, "remaining") != remaining {
						t.Fatalf("admission: %d %s, want 200 with %d left", r.status, r.body, remaining)
					}
					cs, _ := m["charges"].([]any)
					if len(cs) != 1 {
						t.Fatalf("charges: %s", r.body)
					}
					c := cs[0].(map[string]any)
					if num(t, c, "reserved") != 399 || num(t, c, "reserved_at") <= 0 {
						t.Fatalf("the charge names no reserve of 399: %s", r.body)
					}
					return c
				}
				charge := func(c map[string]any, item map[string]any, charged, remaining int64) {
					t.Helper()
					item["rule_id"], item["reserved"], item["reserved_at"] = "tokens", c["reserved"], c["reserved_at"]
					ch := s.do("POST", "/v1/rate-limit/charge", chargeBody(check["user_id"].(string), item))
					res := ch.json(t)["results"].([]any)[0].(map[string]any)
					if ch.status != 200 || num(t, res, "charged") != charged || num(t, res, "remaining") != remaining {
						t.Fatalf("charge %v: %d %s, want charged %d with %d left", item, ch.status, ch.body, charged, remaining)
					}
				}
				a1 := admit(600)
				a2 := admit(200)
				if r := s.check(check); r.status != 429 {
					t.Fatalf("a third request in flight with 200 left of a reserve of 400: %d %s", r.status, r.body)
				}
				// 100 used of the 400 held: 300 back.
				charge(a1, map[string]any{"cost": 100}, 99, 500)
				a3 := admit(100)
				// 900 used of 400 held: 500 more, into debt (-400 shows as 0).
				charge(a2, map[string]any{"cost": 900}, 899, 0)
				if r := s.check(check); r.status != 429 {
					t.Fatalf("admitted in debt: %d %s", r.status, r.body)
				}
				// An error answer costs its admission: 399 back, -1 left.
				charge(a3, map[string]any{"unreported": "error"}, 0, 0)
				if r := s.check(check); r.status != 429 {
					t.Fatalf("admitted with -1 left: %d %s", r.status, r.body)
				}

				// An answer that reports nothing costs at least what it
				// held, whatever the rule's cost (300 here): it may have
				// used all of it (attack 58 F5: the rest handed back,
				// 24,576 tokens against 10,000).
				check["user_id"] = "uma"
				charge(admit(600), map[string]any{"unreported": "cut"}, 399, 600)

				// A rule charged twice in one charge would hand its
				// reserve back twice (attack 58 F9).
				check["user_id"] = "vic"
				c := admit(600)
				item := map[string]any{"rule_id": "tokens", "cost": 1, "reserved": c["reserved"], "reserved_at": c["reserved_at"]}
				if r := s.do("POST", "/v1/rate-limit/charge", chargeBody("vic", item, item)); r.status != 400 || !strings.Contains(string(r.body), "charges[1].rule_id") {
					t.Fatalf("a rule charged twice: %d %s", r.status, r.body)
				}
			})
		}
	})
}

// Beside an estimate, what is held is what must be left: the estimate
// when it is more than the reserve. Holding the reserve only, a client
// declaring what was left each time had 10 requests in flight, 55,000
// tokens against 10,000 (attack 58 F1).
func TestTokenBudgetReserveHoldsTheEstimate(t *testing.T) {
	s := startService(t, strings.Replace(reserveRules(100), "reserve = 100", "reserve = 100\nestimate_from = \"request_header:x-max-tokens\"", 1), nil)
	check := func(maxTokens string) *response {
		return s.check(map[string]any{"user_id": "erin", "endpoint": "/v1/chat/completions", "cost_headers": map[string]string{"x-max-tokens": maxTokens}})
	}
	r := check("800")
	m := r.json(t)
	if r.status != 200 || num(t, m, "remaining") != 200 || num(t, m["charges"].([]any)[0].(map[string]any), "reserved") != 799 {
		t.Fatalf("an estimate of 800: %d %s, want 800 held", r.status, r.body)
	}
	if r := check("201"); r.status != 429 {
		t.Fatalf("a second estimate past what is left: %d %s", r.status, r.body)
	}
	if r := check("50"); r.status != 200 || num(t, r.json(t), "remaining") != 100 {
		t.Fatalf("an estimate below the reserve: %d %s, want the reserve of 100 held", r.status, r.body)
	}
}

// Admissions at once hold a reserve each: of 40 requests at once against
// 1,000 tokens with a reserve of 300, three are admitted.
func TestTokenBudgetReserveUnderConcurrency(t *testing.T) {
	modes(t, func(t *testing.T, env map[string]string) {
		s := startService(t, reserveRules(300), env)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				switch st := s.checkStatus(map[string]any{"user_id": "mallory", "endpoint": "/v1/chat/completions", "method": "POST"}); st {
				case 200:
					admitted.Add(1)
				case 429:
				default:
					t.Errorf("check: %d", st)
				}
			}()
		}
		wg.Wait()
		if n := admitted.Load(); n != 3 {
			t.Fatalf("%d of 40 admitted at once, want 3 (1,000 tokens, 300 held each)", n)
		}
		// What is left reads through a charge of 1 (the admission's own,
		// spending nothing): 1,000 - 3 x 300.
		r := s.do("POST", "/v1/rate-limit/charge", chargeBody("mallory", map[string]any{"rule_id": "tokens", "cost": 1}))
		if res := r.json(t)["results"].([]any)[0].(map[string]any); num(t, res, "remaining") != 100 {
			t.Fatalf("after the refusals: %s, want 100 left", r.body)
		}
	})
}

// A request admitted under a reserve is settled by what it held, whatever
// the rule holds by the time its charge comes: with the reserve removed
// meanwhile, a response that used 100 of its 400 was charged 99 more, the
// 300 it did not use never handed back (attack 58 F6).
func TestTokenBudgetReserveChangedInFlight(t *testing.T) {
	s := startService(t, "", nil)
	m := s.admin("POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/v1/llm/*", "scope": "user", "algorithm": "fixed_window",
		"limit": 1000, "window_seconds": 3600, "cost_from": "response_json:usage.total_tokens", "reserve": 400}).json(t)
	id := fmt.Sprint(m["rule_id"])
	awaitVersion(t, s)
	r := s.check(map[string]any{"user_id": "ines", "endpoint": "/v1/llm/chat", "method": "POST"})
	cs, _ := r.json(t)["charges"].([]any)
	if r.status != 200 || len(cs) != 1 {
		t.Fatalf("admission: %d %s", r.status, r.body)
	}
	c := cs[0].(map[string]any)
	if up := s.admin("PUT", "/admin/v1/rate-limit-rules/"+id, map[string]any{"reserve": 0}); up.status != 200 {
		t.Fatalf("update: %d %s", up.status, up.body)
	}
	awaitVersion(t, s)
	ch := s.do("POST", "/v1/rate-limit/charge", map[string]any{"user_id": "ines", "endpoint": "/v1/llm/chat", "method": "POST", "charges": []any{
		map[string]any{"rule_id": id, "cost": 100, "reserved": c["reserved"], "reserved_at": c["reserved_at"]}}})
	if res := ch.json(t)["results"].([]any)[0].(map[string]any); num(t, res, "remaining") != 900 || num(t, res, "charged") != 99 {
		t.Fatalf("the charge after the reserve was removed: %s, want 900 left (100 used)", ch.body)
	}
}

// A token rule reached only by a form body's method override is checked
// after the headers (override_only): the check holds the reserve and names
// the rule's charge as any admission does. The filter refuses such a
// request (its response cannot be read: the upstream had the headers
// before the body named the method) and its charge, an error answer's
// naming the override, hands the reserve back (attack 59 N1: charged
// nothing, 30 completions spent 31 of 1,000 tokens; attack 61 B1: charged
// a fixed cost, 2 completions were served 450,022).
func TestTokenBudgetOfAnOverride(t *testing.T) {
	s := startService(t, strings.Replace(reserveRules(400), `path = "/v1/chat/*"`, `path = "/v1/chat/*"`+"\nmethods = [\"PUT\"]", 1), nil)
	check := map[string]any{"user_id": "otto", "endpoint": "/v1/chat/completions", "method": "POST", "method_override": "PUT", "override_only": true}
	r := s.check(check)
	m := r.json(t)
	cs, _ := m["charges"].([]any)
	if r.status != 200 || num(t, m, "remaining") != 600 || len(cs) != 1 || num(t, cs[0].(map[string]any), "reserved") != 399 {
		t.Fatalf("the override's check: %d %s, want the reserve held and the charge named", r.status, r.body)
	}
	c := cs[0].(map[string]any)
	ch := s.do("POST", "/v1/rate-limit/charge", map[string]any{"user_id": "otto", "endpoint": "/v1/chat/completions", "method": "POST", "method_override": "PUT",
		"charges": []any{map[string]any{"rule_id": "tokens", "unreported": "error", "reserved": c["reserved"], "reserved_at": c["reserved_at"]}}})
	if res := ch.json(t)["results"].([]any)[0].(map[string]any); num(t, res, "remaining") != 999 {
		t.Fatalf("the refused override's charge: %s, want 999 left", ch.body)
	}
}

// A request another rule refuses holds no reserve: what the token rule
// held for it goes back at once.
func TestTokenBudgetReserveOfARefusedRequest(t *testing.T) {
	s := startService(t, strings.Replace(reserveRules(300), "limit = 100000\nwindow_seconds = 60", "limit = 2\nwindow_seconds = 60", 1), nil)
	windowtest.RoomInMinute(t) // the tier's two a minute
	check := map[string]any{"user_id": "olga", "endpoint": "/v1/chat/completions", "method": "POST"}
	for range 2 {
		if r := s.check(check); r.status != 200 {
			t.Fatalf("admission: %d %s", r.status, r.body)
		}
	}
	r := s.check(check)
	if m := r.json(t); r.status != 429 || m["rule_id"] == "tokens" {
		t.Fatalf("the tier's third request: %d %s, want refused by the tier", r.status, r.body)
	}
	r = s.do("POST", "/v1/rate-limit/charge", chargeBody("olga", map[string]any{"rule_id": "tokens", "cost": 1}))
	// Two requests hold 300 each; the refused one spent its admission's
	// 1 (a rule asked before the one that refuses is spent, as every
	// rule's cost is) and holds nothing more.
	if res := r.json(t)["results"].([]any)[0].(map[string]any); num(t, res, "remaining") != 399 {
		t.Fatalf("after the refusal: %s, want 399 left", r.body)
	}
}

// A refusal for want of a reserve, while the cost alone would pass, is no
// violation for progressive penalties: the caller's own requests in flight
// hold the rest, and their charges hand it back (attack 58 F4: an honest
// client blocked for 64 s, longer with each refusal, with 750 of its 1,000
// tokens left).
func TestTokenBudgetReserveIsNoViolation(t *testing.T) {
	s := startService(t, reserveRules(300)+"\n[penalties]\nenabled = true\nviolation_threshold = 1\n", nil)
	check := map[string]any{"user_id": "hana", "endpoint": "/v1/chat/completions", "method": "POST"}
	held := admitHolding(t, s, check, 3)
	for range 3 {
		if r := s.check(check); r.status != 429 {
			t.Fatalf("a fourth request in flight: %d %s", r.status, r.body)
		}
	}
	settle(s, "hana", held, 50)
	if r := s.check(check); r.status != 200 {
		t.Fatalf("with 850 left and nothing in flight: %d %s, want admitted (no penalty)", r.status, r.body)
	}
}

// A refusal for want of a reserve while the caller's own requests are in
// flight is told to come back within a second (their charges may hand
// some back at any moment: told the window's end, an honest client waited
// 56 s with 750 of its 1,000 tokens left, attack 59 N3); with nothing in
// flight, when the budget refills that far. A settled request's whole
// reserve leaves what is in flight, the part its response used too.
func TestTokenBudgetReserveRetryAfter(t *testing.T) {
	modes(t, func(t *testing.T, env map[string]string) {
		for _, alg := range []string{"fixed_window", "sliding_window", "token_bucket", "gcra"} {
			t.Run(alg, func(t *testing.T) {
				reserveRetryAfter(t, strings.Replace(reserveRules(300), `algorithm = "fixed_window"`, `algorithm = "`+alg+`"`, 1), env)
			})
		}
	})
}

func reserveRetryAfter(t *testing.T, config string, env map[string]string) {
	s := startService(t, config, env)
	check := map[string]any{"user_id": "rita", "endpoint": "/v1/chat/completions", "method": "POST"}
	held := admitHolding(t, s, check, 3)
	if r := s.check(check); r.status != 429 || num(t, r.json(t), "retry_after") > 1 {
		t.Fatalf("refused with three requests in flight: %d %s, want retry_after of a second at most", r.status, r.body)
	}
	settle(s, "rita", held, 300) // each used its whole reserve: nothing comes back
	// Told when the budget has 300 again: the window's end (unless it is
	// a second away), a bucket's refill of 200 (720 s).
	r := s.check(check)
	if m := r.json(t); r.status != 429 || num(t, m, "retry_after") <= 1 && num(t, m, "reset_at")-time.Now().Unix() > 2 {
		t.Fatalf("refused with 100 left and nothing in flight: %d %s, want retry_after at the window's end", r.status, r.body)
	}
}

// admitHolding admits check n times under the token rule and returns each
// admission's charge (its reserved and reserved_at).
func admitHolding(t *testing.T, s *service, check map[string]any, n int) []map[string]any {
	t.Helper()
	var held []map[string]any
	for range n {
		r := s.check(check)
		if r.status != 200 {
			t.Fatalf("admission: %d %s", r.status, r.body)
		}
		held = append(held, r.json(t)["charges"].([]any)[0].(map[string]any))
	}
	return held
}

// settle charges user's admissions held the cost each, with their reserves.
func settle(s *service, user string, held []map[string]any, cost int64) {
	for _, c := range held {
		s.do("POST", "/v1/rate-limit/charge", chargeBody(user, map[string]any{"rule_id": "tokens", "cost": cost, "reserved": c["reserved"], "reserved_at": c["reserved_at"]}))
	}
}

// A reserve handed back after its window ended is not credited to the
// next one: it would be that window's tokens, given twice.
func TestTokenBudgetReserveBackAfterItsWindow(t *testing.T) {
	modes(t, func(t *testing.T, env map[string]string) {
		s := startService(t, strings.Replace(reserveRules(400), "limit = 1000\nwindow_seconds = 3600", "limit = 1000\nwindow_seconds = 1", 1), env)
		check := map[string]any{"user_id": "walt", "endpoint": "/v1/chat/completions", "method": "POST"}
		r := s.check(check)
		m := r.json(t)
		if r.status != 200 || num(t, m, "remaining") != 600 {
			t.Fatalf("admission: %d %s", r.status, r.body)
		}
		c := m["charges"].([]any)[0].(map[string]any)
		// The window ends at reset_at (a whole second; Redis's clock is
		// this machine's).
		time.Sleep(time.Until(time.Unix(num(t, m, "reset_at"), 0)))
		ch := s.do("POST", "/v1/rate-limit/charge", chargeBody("walt", map[string]any{"rule_id": "tokens", "cost": 1,
			"reserved": c["reserved"], "reserved_at": c["reserved_at"]}))
		if res := ch.json(t)["results"].([]any)[0].(map[string]any); num(t, res, "remaining") != 1000 {
			t.Fatalf("a reserve of a window that ended, handed back: %s, want the new window's 1,000 left", ch.body)
		}
	})
}
