package filtertest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// admitted starts a request the service admits under a rule whose cost
// the response reports (costFrom), and returns its stream.
func (e *env) admitted(costFrom string) *wasmhost.Stream {
	e.t.Helper()
	return e.admittedFor(wire.Charge{RuleID: "tokens", CostFrom: costFrom})
}

// admittedFor is admitted with the check's charge c.
func (e *env) admittedFor(c wire.Charge) *wasmhost.Stream {
	e.t.Helper()
	s, _ := e.start(req{method: "POST", path: "/v1/chat/completions", headers: wasmhost.Headers{{"accept-encoding", "gzip, br"}}})
	d := wire.CheckResponse{Allowed: true, Limit: 10000, Remaining: 9999, ResetAt: epoch.Unix() + 60, Strategy: "fixed_window",
		WindowSeconds: 60, RuleID: "tokens", Identity: "ip:198.51.100.7", Charges: []wire.Charge{c}}
	b, _ := json.Marshal(d)
	e.answer(0, "200", string(b))
	if !s.Resumed {
		e.t.Fatal("admission did not resume the request")
	}
	if _, ok := s.RequestHeaders.Get("accept-encoding"); ok {
		e.t.Error("the upstream is still offered encoded answers: a gzip body reports no usage the filter can read")
	}
	return s
}

// upstream runs a response through the filter as Envoy does: its headers,
// then, unless the filter holds them, its body in chunks (none: the headers
// end it). It returns the headers' and the last chunk's actions (the last
// Continue when no chunk passed). A response whose headers are held gets
// its body from passBody, once the filter resumed it.
func upstream(t *testing.T, s *wasmhost.Stream, headers wasmhost.Headers, chunks ...string) (hdr, last wasmhost.Action) {
	t.Helper()
	ctx := context.Background()
	if _, ok := headers.Get(":status"); !ok {
		headers = append(wasmhost.Headers{{":status", "200"}}, headers...)
	}
	hdr, err := s.OnResponseHeaders(ctx, headers, len(chunks) == 0)
	if err != nil {
		t.Fatal(err)
	}
	if hdr == wasmhost.Pause {
		return hdr, wasmhost.Continue
	}
	return hdr, passBody(t, s, chunks...)
}

// passBody passes a response's chunks through the filter; it returns the last
// chunk's action.
func passBody(t *testing.T, s *wasmhost.Stream, chunks ...string) (last wasmhost.Action) {
	t.Helper()
	for i, c := range chunks {
		var err error
		if last, _, err = s.OnResponseBody(context.Background(), []byte(c), i == len(chunks)-1); err != nil {
			t.Fatal(err)
		}
	}
	return last
}

// charged returns the pending charge's one item and answers it: the rule
// has remaining left after it.
func (e *env) charged(remaining int64) wire.ChargeItem {
	e.t.Helper()
	cs := e.vms[0].PendingCallouts()
	if len(cs) != 1 || cs[0].Headers.Value(":path") != wire.PathCharge {
		e.t.Fatalf("pending callouts %v, want one charge (logs %v)", cs, e.vms[0].Logs())
	}
	var r wire.ChargeRequest
	if err := json.Unmarshal(cs[0].Body, &r); err != nil || len(r.Charges) != 1 {
		e.t.Fatalf("charge %s: %v", cs[0].Body, err)
	}
	if r.UserID != "ip:198.51.100.7" || r.Endpoint != "/v1/chat/completions" || r.Method != "POST" || r.ClientAddress != "" || cs[0].Headers.Value("authorization") != "Bearer t0ken-for-tests" {
		e.t.Errorf("the charge names another request than the check: %s %v", cs[0].Body, cs[0].Headers)
	}
	b, _ := json.Marshal(wire.ChargeResponse{Results: []wire.ChargeResult{{RuleID: "tokens", Charged: 1, Limit: 10000, Remaining: remaining,
		ResetAt: epoch.Unix() + 60, Strategy: "fixed_window", WindowSeconds: 60}}})
	if err := e.vms[0].Respond(context.Background(), cs[0].Token, wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "200"}}, Body: b}); err != nil {
		e.t.Fatal(err)
	}
	return r.Charges[0]
}

const chargeConfig = `{"control_cluster":"controlsvc","lease":{"request":0},"decision_token":"t0ken-for-tests"}`

// The cost a response reports is read where the rule says and charged. A
// cost in the headers holds them for the charge, and they carry
// X-RateLimit-Remaining after it; a cost in the body lets the headers go
// (Envoy passes no body to a filter holding them) and holds the body's end
// for the charge. Hostile and
// broken answers each have a defined charge: the cost they report, or
// "unreported" with why (the service then charges the rule's unreported
// cost), and none breaks the VM.
func TestChargeFromTheResponse(t *testing.T) {
	const body = "response_json:usage.total_tokens"
	big := `{"pad":"` + strings.Repeat("x", 1<<20) + `","usage":{"total_tokens":5}}`
	sse := func(events ...string) []string {
		var out []string
		for _, e := range events {
			out = append(out, "data: "+e+"\n\n")
		}
		return out
	}
	for _, tc := range []struct {
		name, costFrom string
		headers        wasmhost.Headers
		chunks         []string
		cost           int64 // when reported
		unreported     string
		holdsHeaders   bool // the headers wait for the charge
	}{
		{"json usage", body, wasmhost.Headers{{"content-type", "application/json"}}, []string{`{"id":"c1","usage":{"prompt`, `_tokens":3,"total_tokens":120}}`}, 120, "", false},
		{"summed paths", "response_json:usage.input_tokens+usage.output_tokens", wasmhost.Headers{{"content-type", "application/json"}}, []string{`{"usage":{"input_tokens":10,"output_tokens":32}}`}, 42, "", false},
		{"no usage field", body, wasmhost.Headers{{"content-type", "application/json"}}, []string{`{"id":"c1"}`}, 0, wire.UnreportedMissing, false},
		{"negative", body, wasmhost.Headers{{"content-type", "application/json"}}, []string{`{"usage":{"total_tokens":-40}}`}, 0, wire.UnreportedInvalid, false},
		{"a string", body, wasmhost.Headers{{"content-type", "application/json"}}, []string{`{"usage":{"total_tokens":"40"}}`}, 0, wire.UnreportedInvalid, false},
		{"fractional", body, wasmhost.Headers{{"content-type", "application/json"}}, []string{`{"usage":{"total_tokens":12.2}}`}, 13, "", false},
		{"huge", body, wasmhost.Headers{{"content-type", "application/json"}}, []string{`{"usage":{"total_tokens":1e300}}`}, wire.MaxUsage, "", false},
		{"malformed json", body, wasmhost.Headers{{"content-type", "application/json"}}, []string{`{"usage":{"total_tokens":12`}, 0, wire.UnreportedMalformed, false},
		{"not json at all", body, wasmhost.Headers{{"content-type", "text/html"}}, []string{`<html>oops</html>`}, 0, wire.UnreportedMalformed, false},
		{"gzip", body, wasmhost.Headers{{"content-type", "application/json"}, {"content-encoding", "gzip"}}, []string{"\x1f\x8b\x08\x00"}, 0, wire.UnreportedEncoded, true},
		{"past the bound", body, wasmhost.Headers{{"content-type", "application/json"}}, []string{big}, 0, wire.UnreportedTooLarge, false},
		{"no body", body, wasmhost.Headers{{"content-type", "application/json"}}, nil, 0, wire.UnreportedMissing, true},
		{"a header", "response_header:x-usage-total-tokens", wasmhost.Headers{{"X-Usage-Total-Tokens", "77"}}, []string{"anything"}, 77, "", true},
		{"a header missing", "response_header:x-usage-total-tokens", nil, []string{"anything"}, 0, wire.UnreportedMissing, true},
		{"a header not a number", "response_header:x-usage-total-tokens", wasmhost.Headers{{"x-usage-total-tokens", "lots"}}, nil, 0, wire.UnreportedInvalid, true},
		{"a header with JSON in it", "response_header:x-usage-total-tokens", wasmhost.Headers{{"x-usage-total-tokens", `{"a":1}`}}, nil, 0, wire.UnreportedInvalid, true},
		{"an error without usage", body, wasmhost.Headers{{":status", "503"}, {"content-type", "application/json"}}, []string{`{"error":{"message":"overloaded"}}`}, 0, wire.UnreportedError, false},
		{"an error that is not json", body, wasmhost.Headers{{":status", "400"}, {"content-type", "text/plain"}}, []string{`bad request`}, 0, wire.UnreportedError, false},
		// A proxy's timeout, while the model may still run and bill
		// (Envoy's route timeout answers 504 through the filter): the
		// rule's cost, as a cut stream (attack 54 F4: charged 1).
		{"a gateway timeout", body, wasmhost.Headers{{":status", "504"}, {"content-type", "text/plain"}}, []string{`upstream request timeout`}, 0, wire.UnreportedMalformed, false},
		{"a request timeout", body, wasmhost.Headers{{":status", "408"}, {"content-type", "application/json"}}, []string{`{"error":"timeout"}`}, 0, wire.UnreportedMissing, false},
		{"an error with usage", body, wasmhost.Headers{{":status", "400"}, {"content-type", "application/json"}}, []string{`{"usage":{"total_tokens":9}}`}, 9, "", false},
		{"a stream", body, wasmhost.Headers{{"content-type", "text/event-stream; charset=utf-8"}},
			sse(`{"choices":[{"delta":{"content":"Hi"}}]}`, `{"choices":[],"usage":{"total_tokens":21}}`, `[DONE]`), 21, "", false},
		{"a stream without usage", body, wasmhost.Headers{{"content-type", "text/event-stream"}}, sse(`{"choices":[]}`, `[DONE]`), 0, wire.UnreportedMissing, false},
		// An outsider's stop sequence, echoed in the last event, pushed it
		// past the bound: the sum lost its output tokens.
		{"a sum's last part in an event past the bound", "response_json:message.usage.input_tokens+usage.output_tokens", wasmhost.Headers{{"content-type", "text/event-stream"}},
			sse(`{"type":"message_start","message":{"usage":{"input_tokens":10}}}`, `{"type":"message_delta","delta":{"stop_sequence":"`+strings.Repeat("x", 70000)+`"},"usage":{"output_tokens":390}}`), 0, wire.UnreportedMalformed, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, chargeConfig, 1)
			s := e.admitted(tc.costFrom)
			hdr, last := upstream(t, s, tc.headers, tc.chunks...)
			if (hdr == wasmhost.Pause) != tc.holdsHeaders {
				t.Fatalf("headers: %v, want held %v", hdr, tc.holdsHeaders)
			}
			// The end waits for the charge, but for a body past the bound:
			// Envoy would reset the response were it buffered further.
			endHeld := !tc.holdsHeaders && len(tc.chunks) > 0 && tc.unreported != wire.UnreportedTooLarge
			if (last == wasmhost.Pause) != endHeld {
				t.Errorf("the last chunk: %v, want held %v", last, endHeld)
			}
			item := e.charged(4321)
			if !s.ResponseResumed && (endHeld || tc.holdsHeaders) {
				t.Fatal("the response was not resumed after the charge's answer")
			}
			if tc.holdsHeaders && passBody(t, s, tc.chunks...) != wasmhost.Continue && len(tc.chunks) > 0 {
				t.Errorf("the body was held after the charge was answered")
			}
			switch {
			case tc.unreported != "" && (item.Cost != nil || item.Unreported != tc.unreported):
				t.Errorf("charged %v %q, want unreported %q", deref(item.Cost), item.Unreported, tc.unreported)
			case tc.unreported == "" && (item.Cost == nil || *item.Cost != tc.cost):
				t.Errorf("charged %v %q, want %d", deref(item.Cost), item.Unreported, tc.cost)
			}
			want := "9999" // the headers went before the charge: where the admission left the caller
			if tc.holdsHeaders {
				want = "4321" // after the charge
			}
			if got := s.ResponseHeaders.Value("x-ratelimit-remaining"); got != want {
				t.Errorf("X-RateLimit-Remaining %q, want %s", got, want)
			}
			if err := e.vms[0].Broken(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The reserve an admission holds goes back with its charge, as the check
// named it, for the service to hand back what the response did not use;
// one out of range is not sent (it stays spent: under-admission only).
func TestChargeCarriesTheReserve(t *testing.T) {
	const at = int64(1795676400000001)
	for _, tc := range []struct {
		name         string
		reserved, at int64
		want         [2]int64
	}{
		{"a reserve", 3999, at, [2]int64{3999, at}},
		{"none", 0, 0, [2]int64{0, 0}},
		{"negative", -5, at, [2]int64{0, 0}},
		{"past 2^53", 1 << 54, at, [2]int64{0, 0}},
		{"from no stretch", 3999, 0, [2]int64{0, 0}},
		{"from a stretch past any clock", 3999, wire.MaxLeasedAt + 1, [2]int64{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, chargeConfig, 1)
			s := e.admittedFor(wire.Charge{RuleID: "tokens", CostFrom: "response_json:usage.total_tokens", Reserved: tc.reserved, ReservedAt: tc.at})
			upstream(t, s, wasmhost.Headers{{"content-type", "application/json"}}, `{"usage":{"total_tokens":120}}`)
			item := e.charged(4321)
			if got := [2]int64{item.Reserved, item.ReservedAt}; got != tc.want || item.Cost == nil || *item.Cost != 120 {
				t.Errorf("charged %v with reserve %v, want 120 with %v", deref(item.Cost), got, tc.want)
			}
			if err := e.vms[0].Broken(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A response cut before its cost was read (the stream ended first) is
// charged as "cut", from the root context, after the stream is gone.
func TestChargeOfACutResponse(t *testing.T) {
	const total = "response_json:usage.total_tokens"
	for _, tc := range []struct {
		name, costFrom, stream string
		cost, atLeast          int64 // cost: reported (0: unreported cut)
	}{
		{"cut before its usage", total, "data: {\"choices\":[]}\n\ndata: {\"usa", 0, 0},
		// Read whole and reset before the stream's end: at least what it
		// reported (attack 63 S1: 10,401 tokens read, the rule's 1,000
		// charged).
		{"cut after its usage", total, "data: {\"choices\":[]}\n\ndata: {\"usage\":{\"total_tokens\":10401}}\n\n", 0, 10401},
		// Finished ("[DONE]"), its usage is final: an honest client that
		// closes at once pays what it got, not the rule's cost.
		{"cut after [DONE]", total, "data: {\"usage\":{\"total_tokens\":401}}\n\ndata: [DONE]\n\n", 401, 0},
		{"a sum cut after its first part", "response_json:message.usage.input_tokens+usage.output_tokens",
			"data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10000}}}\n\ndata: {\"type\":\"content\"", 0, 10000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, chargeConfig, 1)
			s := e.admitted(tc.costFrom)
			if _, err := s.OnResponseHeaders(context.Background(), wasmhost.Headers{{":status", "200"}, {"content-type", "text/event-stream"}}, false); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.OnResponseBody(context.Background(), []byte(tc.stream), false); err != nil {
				t.Fatal(err)
			}
			if err := s.Done(context.Background()); err != nil {
				t.Fatal(err)
			}
			item := e.charged(0)
			switch {
			case tc.cost > 0 && (item.Cost == nil || *item.Cost != tc.cost || item.Unreported != ""):
				t.Fatalf("charged %v %q, want %d reported", deref(item.Cost), item.Unreported, tc.cost)
			case tc.cost == 0 && (item.Cost != nil || item.Unreported != wire.UnreportedCut || item.AtLeast != tc.atLeast):
				t.Fatalf("charged %v %q at least %d, want unreported cut at least %d", deref(item.Cost), item.Unreported, item.AtLeast, tc.atLeast)
			}
		})
	}
}

// A request under no such rule reads no body and sends no charge; a lost
// charge is counted, never retried into a loop, and lets the response go.
func TestNoChargeWithoutResponseCost(t *testing.T) {
	e := newEnv(t, chargeConfig, 1)
	s, _ := e.start(req{})
	e.answer(0, "200", decision(true, 5, 0, 0))
	reads := e.vms[0].HostCalls("proxy_get_buffer_bytes")
	hdr, last := upstream(t, s, wasmhost.Headers{{"content-type", "application/json"}}, `{"usage":{"total_tokens":5}}`)
	if hdr != wasmhost.Continue || last != wasmhost.Continue {
		t.Fatalf("a plain response was held: %v %v", hdr, last)
	}
	e.noCallout(0)
	if e.vms[0].HostCalls("proxy_get_buffer_bytes") != reads {
		t.Fatal("a plain response's body was read")
	}
	// The service refuses the charge: the response goes on, the loss counted.
	s = e.admitted("response_header:x-usage")
	upstream(t, s, wasmhost.Headers{{"x-usage", "9"}})
	c := e.vms[0].PendingCallouts()[0]
	if err := e.vms[0].Respond(context.Background(), c.Token, wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "503"}}}); err != nil {
		t.Fatal(err)
	}
	if !s.ResponseResumed || e.host.Counter("tollgate_charge_failures_total") != 1 {
		t.Fatalf("resumed %v, failures %d", s.ResponseResumed, e.host.Counter("tollgate_charge_failures_total"))
	}
}

// A lease with a pool of the budget's tokens: a request admitted on it
// reads its response, whose cost the pool pays (no charge sent) as far as
// it can, the rest charged at the service. An answer whose pool names no
// charge rule (or two) is not kept: its requests could go uncharged.
func TestChargesThroughTheLease(t *testing.T) {
	const pooled = `{"control_cluster":"controlsvc","lease":{"request":3},"decision_token":"t0ken-for-tests"}`
	chat := req{method: "POST", path: "/v1/chat/completions"}
	answer := func(charges []wire.Charge, pool int64) string {
		d := wire.CheckResponse{Allowed: true, Limit: 10000, Remaining: 9000, ResetAt: epoch.Unix() + 60, Strategy: "fixed_window",
			WindowSeconds: 60, RuleID: "tokens", Identity: "ip:198.51.100.7", Charges: charges,
			Lease: wire.Lease{Granted: 3, TTLMs: 1000, ChargeGranted: pool}}
		b, _ := json.Marshal(d)
		return string(b)
	}
	tokens := []wire.Charge{{RuleID: "tokens", CostFrom: "response_header:x-tokens"}}

	e := newEnv(t, pooled, 1)
	e.start(chat)
	if c, _ := e.callout(0); !strings.Contains(string(c.Body), `"lease_charges":true`) {
		t.Fatalf("the check does not say the filter pays responses from leases: %s", c.Body)
	}
	e.answer(0, "200", answer(tokens, 100))
	// Admitted on the lease (1 of 100), the answer's 40 paid from it.
	s, act := e.start(chat)
	if act != wasmhost.Continue {
		t.Fatal("not admitted on the lease")
	}
	upstream(t, s, wasmhost.Headers{{"x-tokens", "40"}})
	e.noCallout(0)
	if got := s.ResponseHeaders.Value("x-ratelimit-remaining"); got != "9060" {
		t.Errorf("X-RateLimit-Remaining %q, want 9060 (9000 and the pool's 60)", got)
	}
	// The next answer's 500 is more than the pool's 59: 441 charged.
	s, _ = e.start(chat)
	upstream(t, s, wasmhost.Headers{{"x-tokens", "500"}})
	if item := e.charged(0); item.Cost == nil || *item.Cost != 441 {
		t.Fatalf("charged %v, want 441 (500 less the 59 the pool paid)", deref(item.Cost))
	}
	if got := e.host.Counter("tollgate_lease_paid_cost_total"); got != 39+59 {
		t.Errorf("the pools paid %d tokens, want %d", got, 39+59)
	}
	// The pool spent, the lease admits no more: the request tokens left go
	// back with the next check, and what was spent is reported.
	e.start(chat)
	c, _ := e.callout(0)
	var back wire.CheckRequest
	if err := json.Unmarshal(c.Body, &back); err != nil || back.Returned != 1 || back.ChargeReturned != 0 || back.Spent != 2+39+59 {
		t.Fatalf("the check after the pool: %s (%v)", c.Body, err)
	}

	for name, bad := range map[string]string{
		"a pool without a charge":  answer(nil, 100),
		"a pool under two charges": answer(append(tokens, wire.Charge{RuleID: "other", CostFrom: "response_header:x-other"}), 100),
		"charges without a pool":   answer(tokens, 0),
	} {
		e := newEnv(t, pooled, 1)
		e.start(chat)
		e.answer(0, "200", bad)
		if _, act := e.start(chat); act != wasmhost.Pause {
			t.Errorf("%s: a request was admitted on the lease", name)
		}
	}
}

// A stream has one response, and one charge: response headers passed a
// second time (a host that ran its own answer through the filter after
// the upstream's: the development gateway did, when the client went while
// the filter held the headers) charge nothing more (attack 62 C1: charged
// twice, 1,500 for 1,000).
func TestOneChargeAStream(t *testing.T) {
	e := newEnv(t, chargeConfig, 1)
	s := e.admitted("response_header:x-usage-total-tokens")
	if hdr, _ := upstream(t, s, wasmhost.Headers{{"x-usage-total-tokens", "77"}}); hdr != wasmhost.Pause {
		t.Fatalf("headers: %v, want held for the charge", hdr)
	}
	if _, err := s.OnResponseHeaders(context.Background(), wasmhost.Headers{{":status", "502"}}, true); err != nil {
		t.Fatal(err)
	}
	if item := e.charged(4321); item.Cost == nil || *item.Cost != 77 {
		t.Fatalf("charged %v, want 77 once", deref(item.Cost))
	}
	e.noCallout(0)
}
