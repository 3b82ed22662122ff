package jwt_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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
		{"critical extension", testKeys.SignWithHeader("HS256", map[string]any{"crit": []string{"exp"}, "exp": 1}, mustJSON(good)), "crit"},
		{"empty crit", testKeys.SignWithHeader("HS256", map[string]any{"crit": []string{}}, mustJSON(good)), "crit"},
		{"null crit", testKeys.SignWithHeader("HS256", map[string]any{"crit": nil}, mustJSON(good)), "crit"},
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
		// Every registered date, every way of being malformed: a claim the
		// issuer wrote is checked or the token is refused, never skipped.
		{"exp as a boolean", testKeys.Sign("HS256", with("exp", false)), "exp is not a date"},
		{"exp as a numeric string", testKeys.Sign("HS256", with("exp", strconv.FormatInt(now.Unix()+600, 10))), "exp is not a date"},
		{"exp null", testKeys.Sign("HS256", with("exp", json.RawMessage("null"))), "exp is not a date"},
		{"exp as an array", testKeys.Sign("HS256", with("exp", []int64{now.Unix() + 600})), "exp is not a date"},
		{"negative exp", testKeys.Sign("HS256", with("exp", -1)), "exp is not a date"},
		{"exp past year 9999", testKeys.Sign("HS256", with("exp", 253402300800)), "exp is not a date"},
		{"exp beyond float64", testKeys.Sign("HS256", with("exp", json.RawMessage("1e400"))), "payload"},
		{"exp in year 9999", testKeys.Sign("HS256", with("exp", 253402300799)), ""},
		{"nbf null", testKeys.Sign("HS256", with("nbf", json.RawMessage("null"))), "nbf is not a date"},
		{"nbf beyond float64", testKeys.Sign("HS256", with("nbf", json.RawMessage("-1e999"))), "payload"},
		{"iat as a string", testKeys.Sign("HS256", with("iat", "yesterday")), "iat is not a date"},
		{"iat as a boolean", testKeys.Sign("HS256", with("iat", true)), "iat is not a date"},
		{"negative iat", testKeys.Sign("HS256", with("iat", -1e9)), "iat is not a date"},
		{"absurd iat", testKeys.Sign("HS256", with("iat", 1e300)), "iat is not a date"},
		{"iat in the past", testKeys.Sign("HS256", with("iat", now.Unix()-60)), ""},
		// Fractions are not rounded away in the caller's favour.
		{"nbf half a second ahead", testKeys.Sign("HS256", with("nbf", float64(now.Unix())+0.5)), "not valid yet"},
		{"exp half a second ahead", testKeys.Sign("HS256", with("exp", float64(now.Unix())+0.5)), ""},
		// The reader is the filter's own (wire.Reader): what encoding/json
		// did with odd documents, it does, or it refuses the token.
		{"crit spelt CRIT", testKeys.SignWithHeader("HS256", map[string]any{"CRIT": []string{"x"}}, mustJSON(good)), "crit"},
		{"a number beyond float64 in a claim not read", testKeys.Sign("HS256", with("x", json.RawMessage("1e400"))), "payload"},
		{"a claim nested past 64", testKeys.Sign("HS256", with("x", json.RawMessage(strings.Repeat("[", 70)+strings.Repeat("]", 70)))), "payload"},
		{"a subject not UTF-8", testKeys.SignPayload("HS256", []byte(`{"sub":"al`+"\xff"+`ice","exp":`+strconv.FormatInt(now.Unix()+600, 10)+`}`)), "payload"},
		{"sub given twice: the last counts", testKeys.SignPayload("HS256", []byte(`{"sub":"mallory","tier":"premium","tenant":"acme","iss":"https://issuer","aud":"api","exp":`+strconv.FormatInt(now.Unix()+600, 10)+`,"sub":"alice"}`)), ""},
		{"a header that is not an object", testKeys.SignPayload("HS256", mustJSON(good))[0:0] + "WyJhIl0." + strings.SplitN(testKeys.Sign("HS256", good), ".", 2)[1], "header"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := verifier(t, jwt.Options{Issuer: "https://issuer", Audiences: []string{"api"}})
			c, err := v.Verify(tt.token, now.UnixNano())
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
// A token's parts have one spelling each: padding and set unused bits in
// a part's last character are refused (an outsider derived about 250,000
// valid spellings of one token, each a new signature check that passed).
func TestTokenHasOneSpelling(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for _, alg := range []string{"HS256", "RS256", "ES256"} {
		tok := testKeys.Sign(alg, map[string]any{"sub": "a", "exp": now.Unix() + 60})
		if _, err := verifier(t, jwt.Options{}).Verify(tok, now.UnixNano()); err != nil {
			t.Fatalf("%s: the token itself: %v", alg, err)
		}
		parts := strings.Split(tok, ".")
		var variants []string
		for i, part := range parts {
			swap := func(p string) string {
				q := append([]string(nil), parts...)
				q[i] = p
				return strings.Join(q, ".")
			}
			variants = append(variants, swap(part+"="), swap(part+"=="))
			if unused := len(part) * 6 % 8; unused > 0 {
				// The last character's lowest bit is one it does not use.
				last := strings.IndexByte(alphabet, part[len(part)-1])
				variants = append(variants, swap(part[:len(part)-1]+string(alphabet[last^1])))
			}
		}
		for _, v := range variants {
			if _, err := verifier(t, jwt.Options{}).Verify(v, now.UnixNano()); err == nil {
				t.Errorf("%s: %q accepted, a second spelling of %q", alg, v, tok)
			}
		}
	}
}

func TestCacheHonoursExpiry(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	v := verifier(t, jwt.Options{})
	tok := testKeys.Sign("RS256", map[string]any{"sub": "bob", "exp": now.Unix() + 10})
	for i := 0; i < 3; i++ {
		if _, err := v.Verify(tok, now.UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v.Verify(tok, now.Add(11*time.Second).UnixNano()); err == nil {
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
		// 4,104 bits: a check with it costs milliseconds (attack 45 A2).
		`{"keys":[{"kty":"RSA","n":"` + base64.RawURLEncoding.EncodeToString(append([]byte{1}, make([]byte, 512)...)) + `","e":"AQAB"}]}`: ".keys[0].n: a modulus of more than 4096 bits",
	} {
		if _, err := jwt.ParseJWKS([]byte(raw)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", raw, err, want)
		}
	}
}

func FuzzVerify(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	f.Add(testKeys.Sign("HS256", map[string]any{"sub": "a", "exp": now.Unix() + 60}))
	f.Add(testKeys.Sign("HS256", map[string]any{"sub": "a", "exp": now.Unix() + 60, "nbf": "soon"}))
	f.Add(testKeys.Sign("ES256", map[string]any{"sub": "a", "exp": 1e300}))
	f.Add("a.b.c")
	f.Add("..")
	v := verifier(f, jwt.Options{})
	f.Fuzz(func(t *testing.T, token string) {
		c, err := v.Verify(token, now.UnixNano())
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
			if _, err := jwt.NewVerifier(jwt.Options{Keys: ks, SubjectClaim: "sub", CacheSize: 1}).Verify(tok, now.UnixNano()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		v := verifier(b, jwt.Options{})
		for b.Loop() {
			if _, err := v.Verify(tok, now.UnixNano()); err != nil {
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

// claimsOracle is RFC 7519's rule for the registered dates, written apart
// from the verifier: the payload must be a JSON object with a non-empty
// string sub; exp must be a number in 0..year 9999 and after now; nbf and iat,
// when present, numbers in that range, and nbf not after now.
// Beyond encoding/json's own rules, a payload is refused when it is not
// UTF-8 (encoding/json would repair its strings) or nests deeper than 66
// (the payload object and 65 levels in a claim).
func claimsOracle(payload []byte, now time.Time) bool {
	var m map[string]any
	if json.Unmarshal(payload, &m) != nil || m == nil || !utf8.Valid(payload) || nesting(payload) > 66 {
		return false
	}
	if sub, _ := m["sub"].(string); sub == "" {
		return false
	}
	date := func(name string) (float64, bool, bool) { // value, present, well-formed
		v, present := m[name]
		f, isNum := v.(float64)
		return f, present, !present || (isNum && f >= 0 && f <= 253402300799)
	}
	exp, hasExp, expOK := date("exp")
	nbf, hasNbf, nbfOK := date("nbf")
	_, _, iatOK := date("iat")
	nowS := float64(now.Unix())
	return hasExp && expOK && nbfOK && iatOK && exp > nowS && (!hasNbf || nbf <= nowS)
}

// A correctly signed payload is accepted exactly when the oracle says so:
// no malformed date is skipped, no well-formed token refused.
func FuzzVerifyPayload(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	for _, p := range []string{
		`{"sub":"a","exp":1800000060}`,
		`{"sub":"a","exp":1800000060,"nbf":"x"}`,
		`{"sub":"a","exp":1800000060,"nbf":1800000000.5}`,
		`{"sub":"a","exp":1800000060,"iat":null}`,
		`{"sub":"a","exp":1e300}`,
		`{"sub":"a","exp":1800000060,"exp":"x"}`,
		`{"sub":"","exp":1800000060}`,
		`[]`,
		`null`,
		`{"sub":"a","exp":1800000060,"x":1e400}`,
		`{"sub":"a","exp":1800000060,"aud":["\u00e9",{"a":[1e400]}]}`,
		"{\"sub\":\"a\xff\",\"exp\":1800000060}",
	} {
		f.Add([]byte(p))
	}
	for _, depth := range []int{63, 64, 65, 66} {
		f.Add([]byte(`{"sub":"a","exp":1800000060,"x":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`))
	}
	v := verifier(f, jwt.Options{CacheSize: 1})
	f.Fuzz(func(t *testing.T, payload []byte) {
		token := testKeys.SignPayload("HS256", payload)
		if len(token) > jwt.MaxTokenLen {
			return
		}
		c, err := v.Verify(token, now.UnixNano())
		if want := claimsOracle(payload, now); (err == nil) != want {
			t.Fatalf("%s: verify says %v, the oracle %v", payload, err, want)
		}
		if err == nil && c.Subject == "" {
			t.Fatalf("%s: accepted without a subject", payload)
		}
	})
}

// nesting is how deep arrays and objects nest in a JSON document.
func nesting(b []byte) int {
	depth, most, inString := 0, 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			depth++
			most = max(most, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return most
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// VerifyIf asks before a signature check only: a token that fails a cheap
// check (its form, dates, issuer, audience, subject, no key for it) fails
// without asking, so a client's expired token spends no budget, and a
// token refused the check is not verified.
func TestVerifyIfAsksBeforeTheSignatureOnly(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	v := verifier(t, jwt.Options{Issuer: "https://issuer", Audiences: []string{"api"}})
	good := map[string]any{"sub": "alice", "exp": now.Unix() + 600, "iss": "https://issuer", "aud": "api"}
	with := func(k string, val any) map[string]any {
		m := map[string]any{}
		for a, b := range good {
			m[a] = b
		}
		m[k] = val
		return m
	}
	valid := testKeys.Sign("ES256", good)
	forged := valid[:len(valid)-4] + "AAAA"
	for _, tc := range []struct {
		name  string
		token string
		asked bool
	}{
		{"malformed", "not.a.jwt.at-all", false},
		{"expired", testKeys.Sign("ES256", with("exp", now.Unix()-60)), false},
		{"wrong issuer", testKeys.Sign("ES256", with("iss", "https://other")), false},
		{"wrong audience", testKeys.Sign("ES256", with("aud", "other")), false},
		{"no key for its alg", testKeys.SignWithHeader("ES256", map[string]any{"alg": "PS256"}, []byte(`{"sub":"a","exp":1800000600}`)), false},
		{"a bad signature", forged, true},
		{"valid", valid, true},
		// A long payload is not cheap to read: asked before it is.
		{"long, wrong issuer", testKeys.Sign("ES256", with("iss", strings.Repeat("x", 3000))), true},
		{"long, expired", testKeys.Sign("ES256", map[string]any{"sub": "alice", "exp": now.Unix() - 60, "pad": strings.Repeat("x", 3000)}), true},
		{"long header, no key for its kid", testKeys.SignWithHeader("ES256", map[string]any{"kid": "nobody", "pad": strings.Repeat("x", 3000)}, []byte(`{"sub":"a","exp":1800000600}`)), true},
	} {
		asked := false
		_, err := v.VerifyIf(tc.token, now.UnixNano(), func(int) bool { asked = true; return true })
		if asked != tc.asked || (tc.name == "valid") != (err == nil) {
			t.Errorf("%s: asked %v (want %v), err %v", tc.name, asked, tc.asked, err)
		}
	}
	for _, tok := range []string{testKeys.Sign("ES256", with("sub", "bob")), testKeys.Sign("ES256", with("iss", strings.Repeat("x", 3000)))} {
		if _, err := v.VerifyIf(tok, now.UnixNano(), func(int) bool { return false }); err != jwt.ErrNotVerified {
			t.Errorf("a token refused its check: %v, want ErrNotVerified", err)
		}
	}
}

// Two tokens that would share a slot of a direct-mapped cache (the same
// SHA-256 place, worked out from the tokens alone) both stay cached, sent
// in turn: one account's two such tokens made every request a signature
// check (an outsider's: 2,470 ES256 checks a second, no budget spent).
func TestCacheKeepsTwoTokensOfOnePlace(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	v := verifier(t, jwt.Options{CacheSize: 64, CacheKey: [2]uint64{0x1234, 0x5678}})
	var toks []string
	seen := map[uint64]string{}
	for i := 0; len(toks) < 2; i++ {
		tok := testKeys.Sign("HS256", map[string]any{"sub": fmt.Sprintf("u%d", i), "exp": now.Unix() + 600})
		sum := sha256.Sum256([]byte(tok))
		place := binary.LittleEndian.Uint64(sum[:8]) % 64
		if other, ok := seen[place]; ok {
			toks = []string{other, tok}
		}
		seen[place] = tok
	}
	asked := 0
	for i := 0; i < 10; i++ {
		if _, err := v.VerifyIf(toks[i%2], now.UnixNano(), func(int) bool { asked++; return true }); err != nil {
			t.Fatal(err)
		}
	}
	if asked != 2 {
		t.Fatalf("%d signature checks for two tokens sent in turn, want 2", asked)
	}
}

// A token that fails a cheap check (its issuer) after a payload of about
// 1,000 tiny claims, as long as a token may be: what the claims cost to
// read before the issuer refuses it, with no signature checked (attack 45
// A1: 0.9 ms a request under wazero, twice an RS256 check).
func BenchmarkVerifyManyClaims(b *testing.B) {
	now := time.Unix(1_800_000_000, 0)
	claims := map[string]any{"sub": "a", "exp": now.Unix() + 600, "iss": "someone-else"}
	for i := 0; len(testKeys.Sign("RS256", claims)) < jwt.MaxTokenLen-16; i++ {
		claims[strconv.FormatInt(int64(i), 36)] = i % 10
	}
	tok := testKeys.Sign("RS256", claims)
	v := verifier(b, jwt.Options{Issuer: "https://issuer"})
	b.ReportMetric(float64(len(claims)), "claims")
	for b.Loop() {
		if _, err := v.Verify(tok, now.UnixNano()); err == nil {
			b.Fatal("a wrong issuer verified")
		}
	}
}
