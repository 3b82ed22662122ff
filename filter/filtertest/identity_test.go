package filtertest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
	"github.com/tollgate-rl/tollgate/filter/internal/jwt/jwttest"
)

var keys = func() *jwttest.Keys {
	k, err := jwttest.NewKeys()
	if err != nil {
		panic(err)
	}
	return k
}()

func jwtConfig(reject bool) string {
	return fmt.Sprintf(`{"control_cluster":"controlsvc","lease":{"request":0},
		"jwt":{"jwks":%s,"issuer":"https://issuer.example","reject_invalid":%v,"tier_claim":"plan"}}`, keys.JWKS(), reject)
}

func claims(exp time.Time) map[string]any {
	return map[string]any{"sub": "alice", "plan": "premium", "tenant": "acme", "iss": "https://issuer.example", "exp": exp.Unix()}
}

// Every identity source and its fallbacks, as the callout reports it.
func TestIdentitySources(t *testing.T) {
	valid := claims(epoch.Add(time.Hour))
	tests := []struct {
		name     string
		config   string
		headers  wasmhost.Headers
		source   string
		wantID   string
		wantTier string
		wantKey  string
	}{
		{"HS256 subject", jwtConfig(false), wasmhost.Headers{{"authorization", "Bearer " + keys.Sign("HS256", valid)}}, "", "user:alice", "premium", ""},
		{"RS256 subject", jwtConfig(false), wasmhost.Headers{{"authorization", "Bearer " + keys.Sign("RS256", valid)}}, "", "user:alice", "premium", ""},
		{"ES256 subject", jwtConfig(false), wasmhost.Headers{{"authorization", "bearer " + keys.Sign("ES256", valid)}}, "", "user:alice", "premium", ""},
		{"expired token falls back to ip", jwtConfig(false), wasmhost.Headers{{"authorization", "Bearer " + keys.Sign("RS256", claims(epoch.Add(-time.Minute)))}}, "", "ip:198.51.100.7", "", ""},
		{"forged token falls back to ip", jwtConfig(false), wasmhost.Headers{{"authorization", "Bearer " + forge(keys.Sign("ES256", valid))}}, "", "ip:198.51.100.7", "", ""},
		{"wrong issuer falls back", jwtConfig(false), wasmhost.Headers{{"authorization", "Bearer " + keys.Sign("HS256", map[string]any{"sub": "x", "iss": "evil", "exp": epoch.Unix() + 60})}}, "", "ip:198.51.100.7", "", ""},
		{"api key beside the address", baseConfig, wasmhost.Headers{{"x-api-key", "tg_key"}}, "", "ip:198.51.100.7", "", "tg_key"},
		{"jwt behind a trusted proxy", strings.Replace(jwtConfig(false), `"lease"`, `"xff_trusted_hops":1,"lease"`, 1),
			wasmhost.Headers{{"authorization", "Bearer " + keys.Sign("HS256", valid)}, {"x-forwarded-for", "6.6.6.6, 203.0.113.5, 10.0.0.1"}}, "", "user:alice", "premium", ""},
		{"jwt beats api key", jwtConfig(false), wasmhost.Headers{{"x-api-key", "tg_key"}, {"authorization", "Bearer " + keys.Sign("HS256", valid)}}, "", "user:alice", "premium", "tg_key"},
		{"source address", baseConfig, nil, "203.0.113.9:1234", "ip:203.0.113.9", "", ""},
		{"ipv6 source counted by its /64", baseConfig, nil, "[2001:DB8:0:0::1]:443", "ip:2001:db8::", "", ""},
		{"another address of the same /64 is the same caller", baseConfig, nil, "[2001:db8::ffff:1234]:443", "ip:2001:db8::", "", ""},
		{"ipv6 per address when configured", strings.Replace(baseConfig, `"lease"`, `"ipv6_prefix":128,"lease"`, 1), nil, "[2001:DB8:0:0::1]:443", "ip:2001:db8::1", "", ""},
		{"mapped ipv4 unmapped", baseConfig, nil, "[::ffff:192.0.2.1]:80", "ip:192.0.2.1", "", ""},
		{"xff ignored by default", baseConfig, wasmhost.Headers{{"x-forwarded-for", "203.0.113.5, 198.51.100.7"}}, "", "ip:198.51.100.7", "", ""},
		{"xff one trusted hop", hops(1), wasmhost.Headers{{"x-forwarded-for", "203.0.113.5, 10.0.0.1"}}, "", "ip:203.0.113.5", "", ""},
		{"spoofed xff one hop", hops(1), wasmhost.Headers{{"x-forwarded-for", "6.6.6.6, 203.0.113.5, 10.0.0.1"}}, "", "ip:203.0.113.5", "", ""},
		{"spoofed xff two hops", hops(2), wasmhost.Headers{{"x-forwarded-for", "6.6.6.6, 203.0.113.5, 10.0.0.1, 10.0.0.2"}}, "", "ip:203.0.113.5", "", ""},
		{"xff shorter than the hops: source", hops(2), wasmhost.Headers{{"x-forwarded-for", "203.0.113.5, 10.0.0.1"}}, "", "ip:198.51.100.7", "", ""},
		{"two xff headers joined", hops(1), wasmhost.Headers{{"x-forwarded-for", "6.6.6.6"}, {"x-forwarded-for", "203.0.113.5, 10.0.0.1"}}, "", "ip:203.0.113.5", "", ""},
		{"xff ipv6", hops(1), wasmhost.Headers{{"x-forwarded-for", "2001:DB8:0:7::5, 10.0.0.1"}}, "", "ip:2001:db8:0:7::", "", ""},
		{"garbage xff falls back", hops(1), wasmhost.Headers{{"x-forwarded-for", "}{evil\r\n, 10.0.0.1"}}, "", "ip:198.51.100.7", "", ""},
		{"10 kB xff", hops(1), wasmhost.Headers{{"x-forwarded-for", strings.Repeat("1.1.1.1,", 1300) + "203.0.113.5, 10.0.0.1"}}, "", "ip:203.0.113.5", "", ""},
		{"x-real-ip untrusted", baseConfig, wasmhost.Headers{{"x-real-ip", "203.0.113.8"}}, "", "ip:198.51.100.7", "", ""},
		{"x-real-ip trusted", strings.Replace(baseConfig, `"lease"`, `"trust_x_real_ip":true,"lease"`, 1),
			wasmhost.Headers{{"x-real-ip", "203.0.113.8"}, {"x-forwarded-for", "1.1.1.1"}}, "", "ip:203.0.113.8", "", ""},
		{"no usable source: a bucket of its own", baseConfig, nil, "@/run/envoy.sock", "ip:unknown", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.config, 1)
			_, act := e.start(req{headers: tt.headers, source: tt.source})
			if act != wasmhost.Pause {
				t.Fatalf("action %v, want Pause for the callout", act)
			}
			_, body := e.callout(0)
			if body.UserID != tt.wantID || body.Tier != tt.wantTier || body.APIKey != tt.wantKey {
				t.Fatalf("callout identity %q tier %q key %q; want %q %q %q", body.UserID, body.Tier, body.APIKey, tt.wantID, tt.wantTier, tt.wantKey)
			}
			if tt.wantID == "user:alice" && body.Tenant != "acme" {
				t.Fatalf("tenant %q, want acme", body.Tenant)
			}
			// A JWT caller's address travels beside its subject, resolved as
			// an address caller's would be; an address caller's is its id.
			wantAddr := ""
			if tt.wantID == "user:alice" {
				wantAddr = "198.51.100.7"
				if strings.Contains(tt.config, "xff_trusted_hops") {
					wantAddr = "203.0.113.5"
				}
			}
			if body.ClientAddress != wantAddr {
				t.Fatalf("client_address %q, want %q", body.ClientAddress, wantAddr)
			}
			if body.Endpoint != "/api/v1/items" || body.Method != "GET" {
				t.Fatalf("endpoint %q method %q", body.Endpoint, body.Method)
			}
		})
	}
}

// A verified token whose subject cannot be an identity as it is (a
// control or invisible character, longer than an identity) is counted
// under the subject's digest, its tier and tenant kept: dropped, its
// caller was counted by address in the default tier while the upstream
// served the token's user (attack 55 F2). The same subject is the same
// caller on every VM; an empty one is no caller.
func TestTokenSubjectCountedByItsDigest(t *testing.T) {
	name := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "~sha256:" + hex.EncodeToString(sum[:16])
	}
	long := strings.Repeat("a", 300)
	for _, tc := range []struct {
		sub, tenant, wantID, wantTenant string
	}{
		{"alice\u200b", "acme", "user:" + name("alice\u200b"), "acme"},
		{"bob\u2028", "acme\u2028", "user:" + name("bob\u2028"), name("acme\u2028")},
		{long, "", "user:" + name(long), ""},
		{"carol\x01", "", "user:" + name("carol\x01"), ""},
		{"h\u2764\ufe0f", "", "user:h\u2764\ufe0f", ""}, // an emoji is a name as it is
		// A subject spelled as another's digest is digested in turn
		// (attack 56 F3: it was that other caller).
		{name("alice\u200b"), "", "user:" + name(name("alice\u200b")), ""},
		{"", "acme", "ip:198.51.100.7", ""},
	} {
		e := newEnv(t, jwtConfig(false), 2)
		for vm := range 2 {
			c := map[string]any{"sub": tc.sub, "plan": "premium", "iss": "https://issuer.example", "exp": epoch.Unix() + 3600}
			if tc.tenant != "" {
				c["tenant"] = tc.tenant
			}
			_, act := e.start(req{vm: vm, headers: wasmhost.Headers{{"authorization", "Bearer " + keys.Sign("HS256", c)}}})
			if act != wasmhost.Pause {
				t.Fatalf("%q: action %v", tc.sub, act)
			}
			_, body := e.callout(vm)
			wantTier := "premium"
			if tc.sub == "" {
				wantTier = ""
			}
			if body.UserID != tc.wantID || body.Tier != wantTier || body.Tenant != tc.wantTenant {
				t.Errorf("%.20q on vm %d: user %q tier %q tenant %q; want %q %q %q", tc.sub, vm, body.UserID, body.Tier, body.Tenant, tc.wantID, wantTier, tc.wantTenant)
			}
		}
	}
}

// hops is the base configuration with X-Forwarded-For trusted through n proxies.
func hops(n int) string {
	return strings.Replace(baseConfig, `"lease"`, fmt.Sprintf(`"xff_trusted_hops":%d,"lease"`, n), 1)
}

// forge keeps header and payload and signs with another key.
func forge(token string) string {
	other, _ := jwttest.NewKeys()
	parts := strings.Split(token, ".")
	forged := strings.Split(other.Sign("ES256", map[string]any{}), ".")
	return parts[0] + "." + parts[1] + "." + forged[2]
}

func TestInvalidTokenRejectedWhenConfigured(t *testing.T) {
	e := newEnv(t, jwtConfig(true), 1)
	s, act := e.start(req{headers: wasmhost.Headers{{"authorization", "Bearer " + keys.Sign("RS256", claims(epoch.Add(-time.Minute)))}}})
	if act != wasmhost.Pause || s.Local == nil || s.Local.Status != 401 {
		t.Fatalf("expired token with reject_invalid: %v %+v", act, s.Local)
	}
	if s.Local.Headers.Value("www-authenticate") == "" || mustJSON(t, s.Local.Body)["error"].(map[string]any)["code"] != "UNAUTHORIZED" {
		t.Fatalf("401 answer: %v %s", s.Local.Headers, s.Local.Body)
	}
	e.noCallout(0)
	// A valid token still passes, and the verified-token cache answers the
	// second time after the clock moves on (but not past exp).
	tok := keys.Sign("RS256", claims(epoch.Add(time.Minute)))
	e.start(req{headers: wasmhost.Headers{{"authorization", "Bearer " + tok}}})
	e.answer(0, "200", decision(true, 10, 0, 0))
	e.clock.Advance(2 * time.Minute)
	s, _ = e.start(req{headers: wasmhost.Headers{{"authorization", "Bearer " + tok}}})
	if s.Local == nil || s.Local.Status != 401 {
		t.Fatal("a cached token outlived its exp")
	}
}

// Client-supplied x-tollgate-* headers never reach upstream, whatever case.
func TestForgedInternalHeadersStripped(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0},"excluded_paths":["/health"]}`, 1)
	forged := wasmhost.Headers{{"X-Tollgate-Identity", "user:admin"}, {"x-tollgate-decision", "allowed"}, {"X-TOLLGATE-TIER", "enterprise"}, {"x-tollgate-anything", "1"}}
	s, _ := e.start(req{headers: forged})
	e.answer(0, "200", decision(true, 5, 0, 0))
	if got := s.RequestHeaders.Values("x-tollgate-identity"); len(got) != 1 || got[0] != "user:alice" {
		t.Fatalf("identity upstream %v", got)
	}
	if s.RequestHeaders.Value("x-tollgate-tier") != "free" || s.RequestHeaders.Value("x-tollgate-decision") != "allowed" {
		t.Fatalf("upstream headers %v", s.RequestHeaders)
	}
	if _, ok := s.RequestHeaders.Get("x-tollgate-anything"); ok {
		t.Fatal("unknown forged x-tollgate header kept")
	}
	// Excluded paths skip limiting but are stripped all the same.
	s, act := e.start(req{path: "/health", headers: forged})
	if act != wasmhost.Continue {
		t.Fatalf("excluded path: %v", act)
	}
	e.noCallout(0)
	for _, kv := range s.RequestHeaders {
		if strings.HasPrefix(kv[0], "x-tollgate-") {
			t.Fatalf("forged header %v reached upstream on an excluded path", kv)
		}
	}
}

func TestCalloutShape(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","control_authority":"tollgate-control","timeout_ms":150,"lease":{"request":7}}`, 1)
	e.start(req{method: "POST", path: "/api/v1/orders?id=1"})
	c, body := e.callout(0)
	if c.Cluster != "controlsvc" || c.TimeoutMs != 150 || c.Headers.Value(":authority") != "tollgate-control" ||
		c.Headers.Value(":path") != "/v1/rate-limit/check" || c.Headers.Value(":method") != "POST" {
		t.Fatalf("callout %+v", c)
	}
	if body.Endpoint != "/api/v1/orders" || body.Method != "POST" || body.Lease != 7 {
		t.Fatalf("body %+v", body)
	}
	raw := map[string]any{}
	_ = json.Unmarshal(c.Body, &raw)
	if _, ok := raw["api_key"]; ok {
		t.Fatal("empty api_key sent")
	}
}

// A JWT caller's lease is spent only from the address it was granted for:
// an ip-scoped rule counted the caller there.
func TestJWTLeaseIsPerAddress(t *testing.T) {
	e := newEnv(t, strings.Replace(jwtConfig(false), `"lease":{"request":0}`, `"lease":{"request":10}`, 1), 1)
	bearer := wasmhost.Headers{{"authorization", "Bearer " + keys.Sign("HS256", claims(epoch.Add(time.Hour)))}}
	if _, act := e.start(req{headers: bearer, source: "192.0.2.1:1000"}); act != wasmhost.Pause {
		t.Fatalf("first request: %v", act)
	}
	e.answer(0, "200", decision(true, 50, 10, 0))
	if _, act := e.start(req{headers: bearer, source: "192.0.2.1:1001"}); act != wasmhost.Continue {
		t.Fatalf("same address: %v, want the lease", act)
	}
	e.noCallout(0)
	if _, act := e.start(req{headers: bearer, source: "192.0.2.2:1000"}); act != wasmhost.Pause {
		t.Fatalf("another address: %v, want a callout", act)
	}
	if _, body := e.callout(0); body.UserID != "user:alice" || body.ClientAddress != "192.0.2.2" {
		t.Fatalf("callout %q from %q", body.UserID, body.ClientAddress)
	}
}

// bearerCaller is the identity a request with the bearer token from source
// is decided as (the check it calls out with, answered allowed).
func (e *env) bearerCaller(token, source string) string {
	e.t.Helper()
	e.start(req{headers: wasmhost.Headers{{"authorization", "Bearer " + token}}, source: source})
	_, c := e.callout(0)
	e.answer(0, "200", decision(true, 50, 0, 0))
	return c.UserID
}

// A client address gets 16 failed token checks a second per VM: past them
// its new tokens are not checked (each junk ES256 token cost the VM a
// signature check, milliseconds inside Wasm, refused or not) and count as
// invalid; a token verified before still counts, and so does another
// address's, and the next second checks again.
func TestJunkTokensAreCheckedAtMostSixteenASecond(t *testing.T) {
	e := newEnv(t, jwtConfig(false), 1)
	valid := claims(epoch.Add(time.Hour))
	caller := func(token, source string) string { t.Helper(); return e.bearerCaller(token, source) }
	known := keys.Sign("ES256", valid)
	if got := caller(known, "198.51.100.7:1"); got != "user:alice" {
		t.Fatalf("a valid token: %s", got)
	}
	for i := range 16 {
		if got := caller(forge(keys.Sign("ES256", valid)), "198.51.100.7:1"); got != "ip:198.51.100.7" {
			t.Fatalf("junk token %d: %s", i, got)
		}
	}
	fresh := keys.Sign("ES256", claims(epoch.Add(2*time.Hour)))
	if got := caller(fresh, "198.51.100.7:1"); got != "ip:198.51.100.7" {
		t.Fatalf("a new token past the address's 16 failed checks was checked: %s", got)
	}
	if got := caller(known, "198.51.100.7:1"); got != "user:alice" {
		t.Fatalf("a token verified before: %s", got)
	}
	if got := caller(fresh, "198.51.100.8:1"); got != "user:alice" {
		t.Fatalf("another address's token: %s", got)
	}
	e.clock.Advance(time.Second)
	if got := caller(keys.Sign("ES256", claims(epoch.Add(3*time.Hour))), "198.51.100.7:1"); got != "user:alice" {
		t.Fatalf("the next second: %s", got)
	}
}

// A token's checks count what they cost the VM (attack 45): a token without
// kid is checked against every key of its alg, and counts a check for each
// (under four keys, one count let 200 addresses keep the VM at 97 % of a
// core within their budgets); a long header and payload are read only
// while the address has checks left, and count one when the token then
// fails (a junk token of a thousand tiny claims and the wrong issuer cost
// 0.9 ms and counted nothing; then one of a thousand header members, 0.6
// ms). So four kid-less junk tokens, or sixteen long ones, spend an
// address's sixteen checks of the second.
func TestTokenChecksCountWhatTheyCost(t *testing.T) {
	var set struct{ Keys []map[string]string }
	if err := json.Unmarshal(keys.JWKS(), &set); err != nil {
		t.Fatal(err)
	}
	jwks := set.Keys
	for i := range 3 {
		other, err := jwttest.NewKeys()
		if err != nil {
			t.Fatal(err)
		}
		var o struct{ Keys []map[string]string }
		if err := json.Unmarshal(other.JWKS(), &o); err != nil {
			t.Fatal(err)
		}
		for _, k := range o.Keys {
			if k["kty"] == "EC" {
				k["kid"] = fmt.Sprint("es", i+2)
				jwks = append(jwks, k)
			}
		}
	}
	raw, _ := json.Marshal(map[string]any{"keys": jwks})
	e := newEnv(t, fmt.Sprintf(`{"control_cluster":"controlsvc","lease":{"request":0},"jwt":{"jwks":%s,"issuer":"https://issuer.example"}}`, raw), 1)
	caller := func(token, source string) string { t.Helper(); return e.bearerCaller(token, source) }
	kidless := func(c map[string]any) string {
		p, _ := json.Marshal(c)
		return forge(keys.SignWithHeader("ES256", map[string]any{"kid": nil}, p))
	}
	long := claims(epoch.Add(time.Hour))
	long["iss"], long["pad"] = "https://other.example", strings.Repeat("x", 3000)
	for _, tc := range []struct {
		name, source string
		junk         func(i int) string
		count        int
	}{
		{"kid-less, four keys", "198.51.100.7:1", func(i int) string { return kidless(claims(epoch.Add(time.Duration(i+1) * time.Hour))) }, 4},
		{"long payload, wrong issuer", "198.51.100.8:1", func(int) string { return keys.Sign("ES256", long) }, 16},
		{"long header, unknown kid", "198.51.100.9:1", func(int) string {
			p, _ := json.Marshal(claims(epoch.Add(time.Hour)))
			return keys.SignWithHeader("ES256", map[string]any{"kid": "nobody", "pad": strings.Repeat("x", 3000)}, p)
		}, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.count {
				if got := caller(tc.junk(i), tc.source); got != "ip:"+strings.TrimSuffix(tc.source, ":1") {
					t.Fatalf("junk token %d: %s", i, got)
				}
			}
			fresh := keys.Sign("ES256", claims(epoch.Add(time.Duration(10+len(tc.name))*time.Hour)))
			if got := caller(fresh, tc.source); got == "user:alice" {
				t.Fatalf("a new token after %d such junk tokens was checked: the address's 16 checks were not spent", tc.count)
			}
		})
	}
	e.clock.Advance(time.Second)
	if got := caller(keys.Sign("ES256", claims(epoch.Add(99*time.Hour))), "198.51.100.7:1"); got != "user:alice" {
		t.Fatalf("the next second: %s", got)
	}
}

// Past an address's bad-token checks of the second (badtokens.go) a new
// token goes unchecked; under reject_invalid that is a 503 with
// Retry-After, not a 401: the token may be valid (an outsider spending the
// checks must not make a client drop its session), and the next second
// checks it again.
func TestUncheckedTokenIsRetriedNotRefused(t *testing.T) {
	e := newEnv(t, jwtConfig(true), 1)
	bearer := func(tok string) wasmhost.Headers { return wasmhost.Headers{{"authorization", "Bearer " + tok}} }
	valid := keys.Sign("ES256", claims(epoch.Add(time.Hour)))
	for i := range 16 {
		s, _ := e.start(req{headers: bearer(forge(keys.Sign("ES256", map[string]any{"sub": fmt.Sprint("x", i), "iss": "https://issuer.example", "exp": epoch.Unix() + 60})))})
		if s.Local == nil || s.Local.Status != 401 {
			t.Fatalf("forged token %d: %+v; want 401", i, s.Local)
		}
	}
	s, _ := e.start(req{headers: bearer(valid)})
	if s.Local == nil || s.Local.Status != 503 || s.Local.Headers.Value("retry-after") != "1" ||
		mustJSON(t, s.Local.Body)["error"].(map[string]any)["code"] != "SERVICE_UNAVAILABLE" {
		t.Fatalf("an unchecked token: %+v; want 503 with Retry-After 1", s.Local)
	}
	e.noCallout(0)
	// Every token that would need a check gets that answer then, whatever
	// check it would fail: a 401 for a token of another issuer beside a
	// 503 for one of this issuer told an outsider which are accepted.
	for _, tok := range []string{
		keys.Sign("ES256", map[string]any{"sub": "x", "iss": "https://evil.example", "exp": epoch.Unix() + 60}),
		keys.Sign("ES256", claims(epoch.Add(-time.Hour))), "not.a.token",
	} {
		if s, _ := e.start(req{headers: bearer(tok)}); s.Local == nil || s.Local.Status != 503 {
			t.Fatalf("%q from an address out of checks: %+v; want the same 503", tok, s.Local)
		}
	}
	// Another address's are checked and refused as before.
	if s, _ := e.start(req{headers: bearer("not.a.token"), source: "203.0.113.50:1"}); s.Local == nil || s.Local.Status != 401 {
		t.Fatalf("another address's bad token: %+v; want 401", s.Local)
	}
	e.clock.Advance(time.Second)
	if _, act := e.start(req{headers: bearer(valid)}); act != wasmhost.Pause {
		t.Fatalf("the next second: %v; want the token checked and a callout", act)
	}
	if _, body := e.callout(0); body.UserID != "user:alice" {
		t.Fatalf("callout for %q; want user:alice", body.UserID)
	}
}
