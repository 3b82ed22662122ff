package filtertest

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// A POST's form body may name its method (_method: Rails, Laravel,
// Symfony, Express). The request is decided on its headers as a POST; its
// body is held whole, and waits while the rules the named method adds are
// checked (override_only): refused, the client gets 429 (Envoy resets the
// upstream request, which got none of the body); admitted, the body goes
// on. An override that names no method, or disagrees with a header's, is
// a 400.
func TestFormBodyMethodOverride(t *testing.T) {
	const urlencoded = "application/x-www-form-urlencoded"
	const multipartCT = "multipart/form-data; boundary=XyZ"
	multipart := "--XyZ\r\nContent-Disposition: form-data; name=\"authenticity_token\"\r\n\r\nt\r\n--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\npatch\r\n--XyZ--\r\n"
	for _, tc := range []struct {
		name, method, contentType string
		headers                   wasmhost.Headers
		chunks                    []string
		checks                    string // the method the second check names ("": none)
		answer                    string // its answer's status
		want                      int    // the client's status (200: the body went on)
		envoy                     bool   // with Content-Length, the bytes with no end and the end alone, as Envoy's HTTP/1 codec passes them
	}{
		{"Envoy's codec: the chunk completing Content-Length is held", "POST", urlencoded, nil, []string{"a=1&_me", "thod=DELETE"}, "DELETE", "429", 429, true},
		{"Envoy's codec, admitted", "POST", urlencoded, nil, []string{"_method=DELETE"}, "DELETE", "200", 200, true},
		{"Envoy's codec, no override", "POST", urlencoded, nil, []string{"a=1", "&b=2"}, "", "", 200, true},
		{"refused", "POST", urlencoded, nil, []string{"a=1&_me", "thod=DELETE"}, "DELETE", "429", 429, false},
		{"admitted", "POST", urlencoded, nil, []string{"a=1&_method=delete"}, "DELETE", "200", 200, false},
		{"multipart", "POST", multipartCT, nil, []string{multipart[:50], multipart[50:]}, "PATCH", "200", 200, false},
		{"multipart refused", "POST", multipartCT, nil, []string{multipart}, "PATCH", "429", 429, false},
		{"its own method", "POST", urlencoded, nil, []string{"_method=post"}, "", "", 200, false},
		{"no override", "POST", urlencoded, nil, []string{"a=1&method=DELETE"}, "", "", 200, false},
		{"no method", "POST", urlencoded, nil, []string{"_method=DE LETE"}, "", "", 400, false},
		{"two methods", "POST", urlencoded, nil, []string{"_method=PUT&_method=DELETE"}, "", "", 400, false},
		{"a header's, disagreeing", "POST", urlencoded, wasmhost.Headers{{"x-http-method-override", "PUT"}}, []string{"_method=DELETE"}, "", "", 400, false},
		{"a header's, agreeing: counted with the headers", "POST", urlencoded, wasmhost.Headers{{"x-http-method-override", "DELETE"}}, []string{"_method=DELETE"}, "", "", 200, false},
		{"not a POST: no framework reads it", "PUT", urlencoded, nil, []string{"_method=DELETE"}, "", "", 200, false},
		{"not a form", "POST", "text/plain", nil, []string{`{"_method":"DELETE"}`, "_method=DELETE"}, "", "", 200, false},
		{"JSON: Laravel reads its fields as a form's", "POST", "application/json", nil, []string{`{"a":{"_method":"PUT"},`, `"_method":"delete"}`}, "DELETE", "429", 429, false},
		{"the service failing: fail_open lets it go", "POST", urlencoded, nil, []string{"_method=DELETE"}, "DELETE", "500", 200, false},
		{"no content type: Rack reads a form", "POST", "", nil, []string{"_method=DELETE"}, "DELETE", "429", 429, false},
		{"a second content type, a form's", "POST", "text/plain", wasmhost.Headers{{"content-type", urlencoded}}, []string{"_method=DELETE"}, "DELETE", "429", 429, false},
		{"multipart/mixed: Rack reads it", "POST", "multipart/mixed; boundary=XyZ", nil, []string{multipart}, "PATCH", "429", 429, false},
		{"a comma ends the media type (Rack, PHP)", "POST", "application/x-www-form-urlencoded,x", nil, []string{"_method=DELETE"}, "DELETE", "429", 429, false},
		{"xboundary= is a boundary to Rack and PHP", "POST", "multipart/form-data; xboundary=XyZ", nil, []string{multipart}, "PATCH", "429", 429, false},
		{"Rack 2's brackets", "POST", urlencoded, nil, []string{"[_method]=DELETE"}, "DELETE", "429", 429, false},
		// Express's body-parser strips a byte order mark; method-override
		// takes an array's first element (an outsider's DELETEs ran 50
		// of 50 past a DELETE rule of 2 either way).
		{"JSON after a byte order mark", "POST", "application/json", nil, []string{"\xEF\xBB", "\xBF{\"_method\":\"DELETE\"}"}, "DELETE", "429", 429, false},
		{"JSON: an array for _method is refused", "POST", "application/json", nil, []string{`{"_method":["DELETE"]}`}, "", "", 400, false},
		// koa-bodyparser reads application/csp-report as JSON, and its
		// form parser reads _method.0 as an array of _method (qs
		// allowDots): 20 of 20 past a DELETE rule of 2 either way.
		{"Koa: csp-report is JSON", "POST", "application/csp-report", nil, []string{`{"_method":"DELETE"}`}, "DELETE", "429", 429, false},
		{"Koa: _method.0", "POST", urlencoded, nil, []string{"_method.0=DELETE"}, "DELETE", "429", 429, false},
		{"JSON named in a parameter (Laravel's isJson reads the whole header)", "POST", "text/plain; x=/json", nil, []string{`{"_method":"DELETE"}`}, "DELETE", "429", 429, false},
		// An outsider's four headers of four boundaries each had sixteen
		// scanners read every byte; more than four readings are refused.
		{"more boundaries than any framework reads: refused unread", "POST", "multipart/form-data; boundary=XyZ; aboundary=-XyZ; cboundary=--XyZ",
			wasmhost.Headers{{"content-type", "multipart/form-data; boundary=---XyZ; dboundary=----XyZ"}}, []string{multipart}, "", "", 400, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0}}`, 1)
			headers := tc.headers
			if tc.envoy {
				headers = append(headers, [2]string{"content-length", strconv.Itoa(len(strings.Join(tc.chunks, "")))})
			}
			if tc.contentType != "" {
				headers = append(wasmhost.Headers{{"content-type", tc.contentType}}, headers...)
			}
			s, _ := e.start(req{method: tc.method, path: "/things/1", headers: headers, body: true})
			e.answer(0, "200", decision(true, 50, 0, 0))
			if !s.Resumed {
				t.Fatal("the headers were not admitted")
			}
			ctx := context.Background()
			var act wasmhost.Action
			var sent []byte
			for i, c := range tc.chunks {
				var out []byte
				var err error
				if act, out, err = s.OnRequestBody(ctx, []byte(c), i == len(tc.chunks)-1 && !tc.envoy); err != nil {
					t.Fatal(err)
				}
				sent = append(sent, out...)
				// A body read for an override is held whole: an upstream
				// given a prefix may act on it when a refusal resets it
				// (Django's development server did).
				if streams := tc.method != "POST" || tc.contentType == "text/plain" && tc.headers == nil; i < len(tc.chunks)-1 && streams != (act == wasmhost.Continue && len(out) == len(c)) {
					t.Fatalf("chunk %d: action %v, %d bytes released; the body is read: %v", i, act, len(out), !streams)
				}
			}
			if tc.envoy {
				if tc.checks != "" && act != wasmhost.Pause {
					t.Fatal("the chunk completing Content-Length went on: the upstream has the whole form before the check")
				}
				end, out, err := s.OnRequestBody(ctx, nil, true)
				if err != nil {
					t.Fatal(err)
				}
				if tc.checks != "" && end != wasmhost.Pause {
					t.Fatal("the end went on while the check was out")
				}
				sent = append(sent, out...)
			}
			if tc.checks != "" {
				if act != wasmhost.Pause {
					t.Fatal("the end went on before the override was checked")
				}
				_, check := e.callout(0)
				if !check.OverrideOnly || check.MethodOverride != tc.checks || check.Method != tc.method || check.Lease != 0 {
					t.Fatalf("second check %+v, want override_only for %s", check, tc.checks)
				}
				body := decision(tc.answer == "200", 50, 0, 0)
				if tc.answer == "500" {
					body = "oops"
				}
				e.answer(0, tc.answer, body)
				if s.Local == nil && s.Resumed {
					sent = append(sent, e.vms[0].ReleaseRequest(s.StreamState)...)
				}
			} else {
				e.noCallout(0)
			}
			got := 200
			if s.Local != nil {
				got = s.Local.Status
			}
			if got != tc.want {
				t.Fatalf("the client got %d, want %d (logs %v)", got, tc.want, e.vms[0].Logs())
			}
			if got == 200 && string(sent) != strings.Join(tc.chunks, "") {
				t.Fatalf("the upstream got %q, want the body as sent", sent)
			}
			if err := e.vms[0].Broken(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A POST body the filter would read for a method override, but cannot
// read as an upstream may, is refused on its headers, before anything is
// counted: compressed (Express's body-parser inflates gzip and deflate),
// in a charset a decoder may read as other than ASCII (body-parser decodes
// any "utf-" one), or with more Content-Type headers than are read.
func TestUnreadableFormBodyRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers wasmhost.Headers
		want    int // 0: not refused (the headers call out)
	}{
		{"gzip", wasmhost.Headers{{"content-type", "application/x-www-form-urlencoded"}, {"content-encoding", "gzip"}}, 415},
		{"deflate, JSON", wasmhost.Headers{{"content-type", "application/json"}, {"Content-Encoding", "identity, deflate"}}, 415},
		{"an underscore spelling (one header to a CGI-style upstream)", wasmhost.Headers{{"content-type", "application/json"}, {"content_encoding", "gzip"}}, 415},
		{"a second Content-Encoding line", wasmhost.Headers{{"content-type", "application/json"}, {"content-encoding", "identity"}, {"content-encoding", "br"}}, 415},
		{"identity", wasmhost.Headers{{"content-type", "application/json"}, {"content-encoding", "Identity"}}, 0},
		{"UTF-16 JSON", wasmhost.Headers{{"content-type", "application/json; charset=utf-16"}}, 415},
		{"UTF-7 in a second Content-Type", wasmhost.Headers{{"content-type", "text/plain"}, {"content-type", "application/json;charset=\"UTF-7\""}}, 415},
		{"UTF-8 JSON", wasmhost.Headers{{"content-type", "application/json; charset=UTF-8"}}, 0},
		{"UCS-2 (iconv's name for UTF-16LE)", wasmhost.Headers{{"content-type", "application/x-www-form-urlencoded; charset=ucs2"}}, 415},
		{"Latin-1 form", wasmhost.Headers{{"content-type", "application/x-www-form-urlencoded; charset=ISO-8859-1"}}, 0},
		{"ISO-8859-2: refused with the sets no client needs", wasmhost.Headers{{"content-type", "application/x-www-form-urlencoded; charset=iso-8859-2"}}, 415},
		{"a compressed body no framework reads a method from", wasmhost.Headers{{"content-type", "image/png"}, {"content-encoding", "gzip"}}, 0},
		// Bytes past ASCII before a parameter: lower-cased by strings.ToLower
		// they changed length, and the search for "boundary=" sliced past
		// the header's end: the guest panicked (a VM lost per request).
		{"bytes past ASCII before boundary=", wasmhost.Headers{{"content-type", "multipart/form-data; x=\xff\xff\xff\xff\xff\xff\xff\xff; boundary=b"}}, 0},
		{"bytes past ASCII before charset=", wasmhost.Headers{{"content-type", "application/json; x=\xff\xff\xff\xff\xff\xff\xff\xff; charset=utf-8"}}, 0},
		{"five Content-Type headers", wasmhost.Headers{{"content-type", "text/plain"}, {"content-type", "text/plain"}, {"content-type", "text/plain"},
			{"content-type", "text/plain"}, {"content-type", "application/x-www-form-urlencoded"}}, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0}}`, 1)
			s, act := e.start(req{method: "POST", path: "/things/1", headers: tc.headers, body: true})
			if tc.want == 0 {
				if act != wasmhost.Pause || s.Local != nil {
					t.Fatalf("refused: %+v", s.Local)
				}
				e.callout(0)
				return
			}
			if s.Local == nil || s.Local.Status != tc.want {
				t.Fatalf("answer %+v, want %d", s.Local, tc.want)
			}
			e.noCallout(0)
		})
	}
}

// Under fail_closed a body override the service could not be asked about
// is a 503, as a request it could not be asked about is.
func TestFormBodyOverrideFailClosed(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0},"failure_mode":"fail_closed"}`, 1)
	s, _ := e.start(req{method: "POST", path: "/things/1", headers: wasmhost.Headers{{"content-type", "application/x-www-form-urlencoded"}}, body: true})
	e.answer(0, "200", decision(true, 50, 0, 0))
	if act, _, err := s.OnRequestBody(context.Background(), []byte("_method=DELETE"), true); err != nil || act != wasmhost.Pause {
		t.Fatalf("%v %v", act, err)
	}
	e.answer(0, "503", "down")
	if s.Local == nil || s.Local.Status != 503 {
		t.Fatalf("the client got %+v, want 503", s.Local)
	}
}

// A refused body override is cached in the bucket a header naming that
// method counts in: the next such form is refused from the cache, no
// check made (each refused form used to cost one: 5,456 for 5,000 in an
// outsider's attack).
func TestFormBodyOverrideRefusalIsCached(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":10}}`, 1)
	body := "_method=DELETE"
	post := func() *wasmhost.Stream {
		t.Helper()
		s, _ := e.start(req{method: "POST", path: "/things/1", body: true,
			headers: wasmhost.Headers{{"content-type", "application/x-www-form-urlencoded"}, {"content-length", strconv.Itoa(len(body))}}})
		return s
	}
	s := post()
	e.answer(0, "200", decision(true, 50, 10, 0)) // admitted, with a lease of the POST bucket
	if act, _, err := s.OnRequestBody(context.Background(), []byte(body), false); err != nil || act != wasmhost.Pause {
		t.Fatalf("%v %v", act, err)
	}
	e.answer(0, "429", decision(false, 0, 0, 30))
	if s.Local == nil || s.Local.Status != 429 {
		t.Fatalf("first: %+v", s.Local)
	}
	s = post() // the POST bucket's lease admits the headers
	e.noCallout(0)
	if act, _, err := s.OnRequestBody(context.Background(), []byte(body), false); err != nil || act != wasmhost.Pause {
		t.Fatalf("%v %v", act, err)
	}
	e.noCallout(0)
	if s.Local == nil || s.Local.Status != 429 {
		t.Fatalf("second: %+v, want 429 from the cache", s.Local)
	}
}

// TestFormBodyOfPartHeadersStaysSmall streams a multipart body made of
// part headers only (an outsider's attack grew one VM to 4 GiB and trapped
// it with 24 MB of them): the scanner keeps no garbage, and the binding
// collects during a body, so the guest stays small however long the body.
func TestFormBodyOfPartHeadersStaysSmall(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0}}`, 1)
	vm := e.vms[0]
	s, _ := e.start(req{method: "POST", path: "/upload", headers: wasmhost.Headers{{"content-type", "multipart/form-data; boundary=b"}}, body: true})
	e.answer(0, "200", decision(true, 50, 0, 0))
	if !s.Resumed {
		t.Fatal("the headers were not admitted")
	}
	part := "-----b\n" + strings.Repeat("a\n", 4000) + "\n"
	chunk := []byte(strings.Repeat(part, (32<<10)/len(part)))
	ctx := context.Background()
	const body = 24 << 20
	for sent := 0; sent < body; sent += len(chunk) {
		end := sent+len(chunk) >= body
		act, out, err := s.OnRequestBody(ctx, chunk, end)
		if err != nil {
			t.Fatalf("after %d MiB: %v (VM: %v)", sent>>20, err, vm.Broken())
		}
		// Held whole (Envoy would answer 413 past its buffer limit; the
		// guest reads each byte once however large the host lets it grow).
		if end != (act == wasmhost.Continue) || end && len(out) != sent+len(chunk) {
			t.Fatalf("after %d MiB: action %v, %d bytes released", sent>>20, act, len(out))
		}
	}
	if mem := vm.MemorySize(); mem > 32<<20 {
		t.Errorf("guest memory grew to %d MiB over a %d MiB body", mem>>20, body>>20)
	}
	t.Logf("guest memory %d MiB after a %d MiB body of part headers; %d collections", vm.MemorySize()>>20, body>>20, vm.GCCycles())
}

// tokenDecision is an admission under a response-cost rule, with a lease
// of granted (and a pool of the rule's tokens when granted).
func tokenDecision(granted int64) string {
	d := wire.CheckResponse{Allowed: true, Limit: 100, Remaining: 50, ResetAt: epoch.Unix() + 60, Strategy: "fixed_window",
		WindowSeconds: 60, RuleID: "tier_free", Identity: "ip:198.51.100.7",
		Charges: []wire.Charge{{RuleID: "tokens", CostFrom: "response_json:usage.total_tokens"}}}
	if granted > 0 {
		d.Lease = wire.Lease{Granted: granted, TTLMs: 1000, ChargeGranted: 5000}
	}
	b, _ := json.Marshal(d)
	return string(b)
}

// heldOverride starts a JSON POST whose body names PUT, admits its headers
// with the answer given, and passes its body, which the filter holds for
// the override's check.
func heldOverride(t *testing.T, e *env, answer string) *wasmhost.Stream {
	t.Helper()
	body := `{"_method":"PUT","model":"m"}`
	s, _ := e.start(req{method: "POST", path: "/v1/chat/completions", body: true,
		headers: wasmhost.Headers{{"content-type", "application/json"}, {"content-length", strconv.Itoa(len(body))}}})
	e.answer(0, "200", answer)
	if act, _, err := s.OnRequestBody(context.Background(), []byte(body), false); err != nil || act != wasmhost.Pause {
		t.Fatalf("the form's body: %v %v, want held for the override's check", act, err)
	}
	return s
}

// chargeAtTheEnd ends s and returns the charge its end sent.
func chargeAtTheEnd(t *testing.T, e *env, s *wasmhost.Stream) wire.ChargeRequest {
	t.Helper()
	if err := s.Done(context.Background()); err != nil {
		t.Fatal(err)
	}
	var r wire.ChargeRequest
	for _, c := range e.vms[0].PendingCallouts() {
		if c.Headers.Value(":path") == wire.PathCharge {
			if err := json.Unmarshal(c.Body, &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	t.Fatal("no charge sent at the stream's end")
	return r
}

// A lease with a response-cost rule's pool, from a header override, does
// not admit a form body naming that method: a request admitted on it must
// have its response read and paid from the pool, and an override's check
// reads none (attack 60 A1: 90 of 90 such forms admitted, 33,840 tokens
// served against a budget of 5,000). The service is asked instead.
func TestFormBodyOverrideSkipsAPoolLease(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":10}}`, 1)
	s, _ := e.start(req{method: "POST", path: "/v1/chat/completions", headers: wasmhost.Headers{{"x-http-method-override", "PUT"}}})
	e.answer(0, "200", tokenDecision(10)) // the POST-as-PUT bucket's lease, with a pool
	if !s.Resumed {
		t.Fatal("the header override was not admitted")
	}
	heldOverride(t, e, decision(true, 50, 0, 0)) // the POST's own check
	if _, c := e.callout(0); c.MethodOverride != "PUT" || !c.OverrideOnly {
		t.Fatalf("callout %+v, want the override's check", c)
	}
}

// A request whose headers were admitted under a response-cost rule and
// that the filter then answers itself (its form body's override refused)
// never reached the upstream's model: its charge is an error answer's (the
// admission's 1, the reserve handed back), not a cut stream's whole cost
// (attack 60 A3: a refused update cost its caller 1,000 tokens).
func TestChargeOfARequestAnsweredByTheFilter(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0},"decision_token":"t0ken-for-tests"}`, 1)
	s := heldOverride(t, e, tokenDecision(0))
	e.answer(0, "429", decision(false, 0, 0, 30))
	if s.Local == nil || s.Local.Status != 429 {
		t.Fatalf("the override: %+v, want refused", s.Local)
	}
	if r := chargeAtTheEnd(t, e, s); len(r.Charges) != 1 || r.Charges[0].Unreported != wire.UnreportedError {
		t.Fatalf("charge %+v, want the rule charged as an error answer", r)
	}
}

// A form body naming a method whose rules include one whose cost the
// response reports (an LLM token budget) is refused: its response cannot be
// read as such a rule needs (the upstream had the headers, Accept-Encoding
// and all, before the body named the method). What the check held goes back
// with the stream's end: an error answer's charge naming the override, so
// the service finds the rule (attack 61 B1: admitted at a fixed cost, 2
// completions were served 450,022 tokens against a budget of 1,000).
func TestFormBodyOverrideReachingATokenBudget(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0},"decision_token":"t0ken-for-tests"}`, 1)
	s := heldOverride(t, e, decision(true, 50, 0, 0)) // the POST's own rules: no response cost
	d := wire.CheckResponse{Allowed: true, Limit: 1000, Remaining: 600, ResetAt: epoch.Unix() + 60, Strategy: "fixed_window", WindowSeconds: 60,
		RuleID: "tokens", Identity: "ip:198.51.100.7",
		Charges: []wire.Charge{{RuleID: "tokens", CostFrom: "response_json:usage.total_tokens", Reserved: 399, ReservedAt: 1795676400000001}}}
	b, _ := json.Marshal(d)
	e.answer(0, "200", string(b))
	if s.Local == nil || s.Local.Status != 400 || !strings.Contains(string(s.Local.Body), "name the method in a header") {
		t.Fatalf("the override reaching a token budget: %+v, want refused", s.Local)
	}
	if r := chargeAtTheEnd(t, e, s); r.MethodOverride != "PUT" || len(r.Charges) != 1 ||
		r.Charges[0].Unreported != wire.UnreportedError || r.Charges[0].Reserved != 399 || r.Charges[0].ReservedAt != 1795676400000001 {
		t.Fatalf("charge %+v, want the rule's reserve handed back as an error answer's, naming PUT", r)
	}
}

// A client gone while the filter held its body for an override's check:
// the upstream got no body, and the charge is an error answer's, not a cut
// stream's (attack 61: by reading, the rule's whole cost).
func TestChargeOfARequestGoneWhileItsBodyWasHeld(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0},"decision_token":"t0ken-for-tests"}`, 1)
	s := heldOverride(t, e, tokenDecision(0))
	// Gone before the override's answer.
	if r := chargeAtTheEnd(t, e, s); len(r.Charges) != 1 || r.Charges[0].Unreported != wire.UnreportedError {
		t.Fatalf("charge %+v, want the rule charged as an error answer", r)
	}
}
