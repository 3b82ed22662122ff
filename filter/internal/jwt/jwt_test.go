package jwt_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/internal/jwt"
	"github.com/tollgate-rl/tollgate/filter/internal/jwt/jwttest"
)

var testKeys = func() *jwttest.Keys {
	k, err := jwttest.NewKeys()
	if err != nil {
		panic(err)
	}
	return k
}()

func verifier(t testing.TB, o jwt.Options) *jwt.Verifier {
	t.Helper()
	ks, err := jwt.ParseJWKS(testKeys.JWKS())
	if err != nil {
		t.Fatal(err)
	}
	o.Keys = ks
	if o.SubjectClaim == "" {
		o.SubjectClaim, o.TierClaim, o.TenantClaim = "sub", "tier", "tenant"
	}
	if o.CacheSize == 0 {
		o.CacheSize = 16
	}
	return jwt.NewVerifier(o)
}

func TestVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	good := map[string]any{"sub": "alice", "tier": "premium", "tenant": "acme", "exp": now.Unix() + 600, "iss": "https://issuer", "aud": []string{"api"}}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for a, b := range good {
			m[a] = b
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name  string
		token string
		want  string // "" valid
	}{
		{"HS256", testKeys.Sign("HS256", good), ""},
		{"RS256", testKeys.Sign("RS256", good), ""},
		{"ES256", testKeys.Sign("ES256", good), ""},
		{"expired", testKeys.Sign("RS256", with("exp", now.Unix()-60)), "expired"},
		{"not yet", testKeys.Sign("ES256", with("nbf", now.Unix()+60)), "not valid yet"},
		{"no exp", testKeys.Sign("HS256", with("exp", nil)), "no exp"},
		{"no subject", testKeys.Sign("HS256", with("sub", nil)), "no sub"},
		{"wrong issuer", testKeys.Sign("HS256", with("iss", "evil")), "issuer"},
		{"wrong audience", testKeys.Sign("HS256", with("aud", "other")), "audience"},
		{"forged signature", testKeys.Sign("RS256", good)[:len(testKeys.Sign("RS256", good))-4] + "AAAA", "signature"},
		{"alg none", "eyJhbGciOiJub25lIn0." + strings.Split(testKeys.Sign("HS256", good), ".")[1] + ".", "signature"},
		{"alg swapped", swapAlg(testKeys.Sign("RS256", good), "HS256"), "signature"},
		{"garbage", "not.a.token", "header"},
		{"two parts", "abc.def", "compact"},
		{"10 kB", strings.Repeat("a", 10_000), "longer"},
		{"nbf as a string", testKeys.Sign("HS256", with("nbf", "tomorrow")), "nbf is not a date"},
		{"nbf as a boolean", testKeys.Sign("HS256", with("nbf", true)), "nbf is not a date"},
		{"absurd nbf", testKeys.Sign("HS256", with("nbf", 1e300)), "nbf is not a date"},
		{"negative nbf", testKeys.Sign("HS256", with("nbf", -1)), "nbf is not a date"},
		{"exp as a string", testKeys.Sign("HS256", with("exp", "never")), "exp is not a date"},
		{"absurd exp", testKeys.Sign("HS256", with("exp", 1e300)), "exp is not a date"},
		{"iat as an object", testKeys.Sign("HS256", with("iat", map[string]any{})), "iat is not a date"},
		{"fractional dates", testKeys.Sign("HS256", with("nbf", float64(now.Unix())-0.5)), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := verifier(t, jwt.Options{Issuer: "https://issuer", Audiences: []string{"api"}})
			c, err := v.Verify(tt.token, now)
			if tt.want == "" {
				if err != nil || c.Subject != "alice" || c.Tier != "premium" || c.Tenant != "acme" {
					t.Fatalf("got %+v, %v", c, err)
				}
				return
			}
			if !errors.Is(err, jwt.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v; want an invalid-token error mentioning %q", err, tt.want)
			}
		})
	}
}

// swapAlg rewrites the header's alg, keeping the kid: the classic attempt to
// have an RSA public key used as an HMAC secret.
func swapAlg(token, alg string) string {
	parts := strings.Split(token, ".")
	parts[0] = base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"` + alg + `","kid":"rs"}`))
	return strings.Join(parts, ".")
}

// A cached token still expires at its exp.
func TestCacheHonoursExpiry(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	v := verifier(t, jwt.Options{})
	tok := testKeys.Sign("RS256", map[string]any{"sub": "bob", "exp": now.Unix() + 10})
	for i := 0; i < 3; i++ {
		if _, err := v.Verify(tok, now); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v.Verify(tok, now.Add(11*time.Second)); err == nil {
		t.Fatal("a cached token was accepted after its exp")
	}
}

func TestParseJWKSErrorsNameThePart(t *testing.T) {
	for raw, want := range map[string]string{
		`{"keys":[]}`:                                    ".keys:",
		`{"keys":[{"kty":"oct","k":"c2hvcnQ"}]}`:         ".keys[0].k:",
		`{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}`: ".keys[0].n:",
		`{"keys":[{"kty":"EC","crv":"P-384"}]}`:          ".keys[0].crv:",
		`{"keys":[{"kty":"OKP"}]}`:                       ".keys[0].kty:",
		`[1]`:                                            "not a JWKS",
	} {
		if _, err := jwt.ParseJWKS([]byte(raw)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", raw, err, want)
		}
	}
}

func FuzzVerify(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	f.Add(testKeys.Sign("HS256", map[string]any{"sub": "a", "exp": now.Unix() + 60}))
	f.Add("a.b.c")
	f.Add("..")
	v := verifier(f, jwt.Options{})
	f.Fuzz(func(t *testing.T, token string) {
		c, err := v.Verify(token, now)
		if err == nil && c.Subject == "" {
			t.Fatalf("accepted %q without a subject", token)
		}
	})
}

func BenchmarkVerifyRS256(b *testing.B) {
	now := time.Unix(1_800_000_000, 0)
	tok := testKeys.Sign("RS256", map[string]any{"sub": "a", "exp": now.Unix() + 600})
	b.Run("uncached", func(b *testing.B) {
		ks := mustKeys(b)
		for b.Loop() {
			if _, err := jwt.NewVerifier(jwt.Options{Keys: ks, SubjectClaim: "sub", CacheSize: 1}).Verify(tok, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		v := verifier(b, jwt.Options{})
		for b.Loop() {
			if _, err := v.Verify(tok, now); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func mustKeys(b *testing.B) *jwt.KeySet {
	ks, err := jwt.ParseJWKS(testKeys.JWKS())
	if err != nil {
		b.Fatal(err)
	}
	return ks
}
