package pluginconf

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
)

func TestDefaults(t *testing.T) {
	c, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ControlCluster != "controlsvc" || c.ControlAuthority != "controlsvc" || c.FailureMode != FailOpen || c.TimeoutMs != 200 ||
		c.APIKeyHeader != "x-api-key" || c.Lease.Request != 10 || !c.Headers.XRateLimitOn() || c.Headers.IETF ||
		c.XFFTrustedHops != 0 || c.TrustXRealIP || c.DecisionToken != "" || c.IPv6Prefix != 64 {
		t.Fatalf("defaults %+v", c)
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	for cfg, want := range map[string]string{
		`{"control_cluster":"bad cluster"}`:               "control_cluster:",
		`{"control_authority":"a/b"}`:                     "control_authority:",
		`{"trusted_proxy_depth":1}`:                       "trusted_proxy_depth: is no longer read",
		`{"xff_trusted_hops":-1}`:                         "xff_trusted_hops:",
		`{"xff_trusted_hops":17}`:                         "xff_trusted_hops:",
		`{"ipv6_prefix":16}`:                              "ipv6_prefix:",
		`{"decision_token":"a b"}`:                        "decision_token:",
		`{"decision_token":"a\r\nx: y"}`:                  "decision_token:",
		`{"decision_token_env":"X","decision_token":"t"}`: "decision_token_env: is set beside",
		`{"decision_token_env":"9X"}`:                     "decision_token_env:",
		`{"decision_token_env":"X Y"}`:                    "decision_token_env:",
		`{"api_key_header":"X Key"}`:                      "api_key_header:",
		`{"api_key_header":"x-tollgate-key"}`:             "api_key_header:",
		`{"lease":{"request":-1}}`:                        "lease.request:",
		`{"breaker":{"failures":0}}`:                      "breaker.failures:",
		`{"breaker":{"cooldown_ms":1}}`:                   "breaker.cooldown_ms:",
		`{"fallback":{"limit":0}}`:                        "fallback.limit:",
		`{"fallback":{"window_seconds":9999}}`:            "fallback.window_seconds:",
		`{"fallback":{"limit":9007199254740992}}`:         "fallback.limit:",
		`{"lease":{"request":1,"request":5000}}`:          "lease.request: is given twice",
		`{"Lease":{"request":1}}`:                         "Lease: unknown setting",
		`{"jwt":{}}`:                                      "jwt.jwks:",
		`{"jwt":{"jwks":{"keys":[]},"cache_size":-1}}`:    "jwt.cache_size:",
		`{"headers":{"ietf":"yes"}}`:                      "headers.ietf:",
		`{"lease":{"requests":5}}`:                        "requests: unknown setting",
		`{} {}`:                                           "data after",
		// The configuration's own reader: every kind error names its field.
		`{"timeout_ms":4294967296}`:              "timeout_ms: must be a whole number in 0..4294967295",
		`{"timeout_ms":1.5}`:                     "timeout_ms: must be a whole number",
		`{"lease":[]}`:                           "lease: must be an object, not an array",
		`{"excluded_paths":["/a",null]}`:         "excluded_paths[1]: must be a string, not null",
		`{"excluded_paths":"/a"}`:                "excluded_paths: must be an array, not a string",
		`{"jwt":{"jwks":"{}"}}`:                  "jwt.jwks: must be an object, not a string",
		`{"fallback":{"share":1e400}}`:           "fallback.share: must be a number",
		`{"control_cluster":"a` + "\xff" + `b"}`: "malformed JSON",
		`{"jwt":{"jwks":` + strings.Repeat(`{"a":`, 80) + `1` + strings.Repeat(`}`, 80) + `}}`: "malformed JSON",
		`[]`: "malformed JSON",
	} {
		if _, err := Parse([]byte(cfg)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", cfg, err, want)
		}
	}
}

func TestParseErrorsAreFieldErrors(t *testing.T) {
	for cfg, field := range map[string]string{
		`{"lease":{"slots":0}}`:                           "lease.slots",
		`{"excluded_paths":["/a","b"]}`:                   "excluded_paths[1]",
		`{"jwt":{"jwks":{"keys":[{"kty":"OKP"}]}}}`:       "jwt.jwks.keys[0].kty",
		`{"jwt":{"jwks":{"keys":[]},"tier_claim":"a b"}}`: "jwt.tier_claim",
	} {
		_, err := Parse([]byte(cfg))
		if fe, ok := fielderr.As(err); !ok || fe.Field != field {
			t.Errorf("%s: got %#v, want a field error of %s", cfg, err, field)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"control_cluster":"controlsvc","lease":{"request":5}}`))
	f.Add([]byte(`{"jwt":{"jwks":{"keys":[{"kty":"oct","k":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}]}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		if c.TimeoutMs == 0 || c.Lease.Slots == 0 || c.Breaker.Failures == 0 {
			t.Fatalf("accepted a config with a zero bound: %+v", c)
		}
	})
}

// FuzzDecodeAgreesWithEncodingJSON: what decode accepts, encoding/json reads
// into the same settings (the key set aside: encoding/json would want a
// []byte as base64), so no setting is read under another name or type.
func FuzzDecodeAgreesWithEncodingJSON(f *testing.F) {
	f.Add([]byte(`{"control_cluster":"c","timeout_ms":5,"lease":{"request":5,"slots":9},"headers":{"x_ratelimit":false,"prefix":"P"}}`))
	f.Add([]byte(`{"fallback":{"share":0.5,"limit":3},"breaker":{"failures":2},"cost_headers":["a","b"],"excluded_paths":[],"trust_x_real_ip":true}`))
	f.Add([]byte(`{"jwt":{"issuer":"i","audiences":["a"],"leeway_seconds":3,"reject_invalid":true},"trusted_proxy_depth":2,"ipv6_prefix":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var mine Config
		if decode(data, &mine) != nil || mine.JWT != nil && mine.JWT.JWKS != nil {
			return
		}
		var theirs Config
		if err := json.Unmarshal(data, &theirs); err != nil {
			t.Fatalf("decode accepted %q, encoding/json refuses it: %v", data, err)
		}
		if !reflect.DeepEqual(mine, theirs) {
			t.Fatalf("%q:\n mine %+v\njson %+v", data, mine, theirs)
		}
	})
}
