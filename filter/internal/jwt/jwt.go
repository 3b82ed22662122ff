// Package jwt verifies JSON Web Tokens inside the filter: HS256, RS256 and
// ES256 against an inline JWKS, with exp, nbf, iss and aud. Signature checks
// are costly inside Wasm, so a Verifier keeps a bounded cache of tokens it has
// verified, keyed by the token's SHA-256 and valid until the token's exp.
package jwt

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
)

// MaxTokenLen bounds a token; a longer one is refused before any parsing.
const MaxTokenLen = 8192

// ErrInvalid is wrapped by every verification failure.
var ErrInvalid = errors.New("invalid token")

type key struct {
	kid    string
	alg    string // HS256, RS256, ES256
	secret []byte
	rsa    *rsa.PublicKey
	ec     *ecdsa.PublicKey
}

// KeySet is a parsed JWKS.
type KeySet struct{ keys []key }

// Len is the number of keys.
func (k *KeySet) Len() int { return len(k.keys) }

type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
	K   string `json:"k"`
}

// ParseJWKS reads {"keys":[...]}. An error names the bad part from the key
// set itself ("jwks.keys[1].n"), for the caller to place under its own field
// with In.
func ParseJWKS(raw []byte) (*KeySet, *fielderr.Error) {
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(raw, &set); err != nil {
		return nil, fielderr.New("jwks", "not a JWKS: %v", err)
	}
	if len(set.Keys) == 0 {
		return nil, fielderr.New("jwks.keys", "at least one key is needed")
	}
	ks := &KeySet{}
	for i, j := range set.Keys {
		at := fmt.Sprintf("jwks.keys[%d]", i)
		if j.Use != "" && j.Use != "sig" {
			return nil, fielderr.New(at+".use", "%q is not \"sig\"", j.Use)
		}
		k := key{kid: j.Kid}
		switch j.Kty {
		case "oct":
			if j.Alg != "" && j.Alg != "HS256" {
				return nil, fielderr.New(at+".alg", "%q is not supported for oct keys (HS256)", j.Alg)
			}
			secret, err := b64(j.K)
			if err != nil || len(secret) < 32 {
				return nil, fielderr.New(at+".k", "must be base64url of at least 32 bytes")
			}
			k.alg, k.secret = "HS256", secret
		case "RSA":
			if j.Alg != "" && j.Alg != "RS256" {
				return nil, fielderr.New(at+".alg", "%q is not supported for RSA keys (RS256)", j.Alg)
			}
			n, err := b64(j.N)
			if err != nil || len(n) < 256 {
				return nil, fielderr.New(at+".n", "must be base64url of a modulus of at least 2048 bits")
			}
			e, err := b64(j.E)
			if err != nil || len(e) == 0 || len(e) > 4 {
				return nil, fielderr.New(at+".e", "must be base64url of a small exponent")
			}
			var eb [4]byte
			copy(eb[4-len(e):], e)
			k.alg, k.rsa = "RS256", &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(binary.BigEndian.Uint32(eb[:]))}
		case "EC":
			if j.Crv != "P-256" || (j.Alg != "" && j.Alg != "ES256") {
				return nil, fielderr.New(at+".crv", "only P-256 (ES256) is supported")
			}
			x, errX := b64(j.X)
			y, errY := b64(j.Y)
			if errX != nil || errY != nil || len(x) != 32 || len(y) != 32 {
				return nil, fielderr.New(at+".x", "x and y must be base64url of 32 bytes each")
			}
			pub := &ecdsa.PublicKey{Curve: elliptic.P256(), X: new(big.Int).SetBytes(x), Y: new(big.Int).SetBytes(y)}
			if !pub.Curve.IsOnCurve(pub.X, pub.Y) {
				return nil, fielderr.New(at+".x", "the point is not on P-256")
			}
			k.alg, k.ec = "ES256", pub
		default:
			return nil, fielderr.New(at+".kty", "%q must be RSA, EC or oct", j.Kty)
		}
		ks.keys = append(ks.keys, k)
	}
	return ks, nil
}

// Claims are the parts of a verified token the filter uses.
type Claims struct {
	Subject string
	Tier    string
	Tenant  string
	Expiry  time.Time
}

// Options configure a Verifier.
type Options struct {
	Keys                                 *KeySet
	Issuer                               string
	Audiences                            []string
	SubjectClaim, TierClaim, TenantClaim string
	Leeway                               time.Duration
	CacheSize                            int
}

// Verifier checks tokens. It is not safe for concurrent use (one per VM).
type Verifier struct {
	o     Options
	cache []cacheEntry
}

type cacheEntry struct {
	sum    [32]byte
	claims Claims
	used   bool
}

// NewVerifier returns a verifier with an empty cache.
func NewVerifier(o Options) *Verifier {
	return &Verifier{o: o, cache: make([]cacheEntry, max(o.CacheSize, 1))}
}

// Verify checks a compact JWS and returns its claims.
func (v *Verifier) Verify(token string, now time.Time) (Claims, error) {
	if len(token) > MaxTokenLen {
		return Claims{}, fmt.Errorf("%w: longer than %d bytes", ErrInvalid, MaxTokenLen)
	}
	sum := sha256.Sum256([]byte(token))
	slot := &v.cache[binary.LittleEndian.Uint64(sum[:8])%uint64(len(v.cache))]
	if slot.used && slot.sum == sum {
		if now.Before(slot.claims.Expiry.Add(v.o.Leeway)) {
			return slot.claims, nil
		}
		slot.used = false
		return Claims{}, fmt.Errorf("%w: expired", ErrInvalid)
	}
	c, err := v.verify(token, now)
	if err != nil {
		return Claims{}, err
	}
	*slot = cacheEntry{sum: sum, claims: c, used: true}
	return c, nil
}

type header struct {
	Alg string `json:"alg"`
	Kid string `json:"kid"`
	// Crit lists extensions the token requires its recipient to understand
	// (RFC 7515, 4.1.11). This verifier understands none, so a token with a
	// crit parameter, whatever it holds, is invalid.
	Crit json.RawMessage `json:"crit"`
}

func (v *Verifier) verify(token string, now time.Time) (Claims, error) {
	h64, rest, ok1 := strings.Cut(token, ".")
	p64, s64, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || strings.Contains(s64, ".") {
		return Claims{}, fmt.Errorf("%w: not a compact JWS", ErrInvalid)
	}
	hb, err := b64(h64)
	if err != nil {
		return Claims{}, fmt.Errorf("%w: header is not base64url", ErrInvalid)
	}
	var h header
	if err := json.Unmarshal(hb, &h); err != nil {
		return Claims{}, fmt.Errorf("%w: header is not JSON", ErrInvalid)
	}
	if h.Crit != nil {
		return Claims{}, fmt.Errorf("%w: header names critical extensions (crit) this verifier does not support", ErrInvalid)
	}
	sig, err := b64(s64)
	if err != nil {
		return Claims{}, fmt.Errorf("%w: signature is not base64url", ErrInvalid)
	}
	signed := token[:len(h64)+1+len(p64)]
	if !v.checkSignature(h, signed, sig) {
		return Claims{}, fmt.Errorf("%w: bad signature or unknown key", ErrInvalid)
	}
	pb, err := b64(p64)
	if err != nil {
		return Claims{}, fmt.Errorf("%w: payload is not base64url", ErrInvalid)
	}
	var claims map[string]any
	if err := json.Unmarshal(pb, &claims); err != nil {
		return Claims{}, fmt.Errorf("%w: payload is not a JSON object", ErrInvalid)
	}
	// Registered dates: exp is required; nbf and iat are optional, but a
	// malformed one (a string, a boolean, a date past year 9999) makes the
	// token invalid rather than being skipped.
	exp, ok, err := numericDate(claims, "exp")
	if err != nil {
		return Claims{}, err
	}
	if !ok {
		return Claims{}, fmt.Errorf("%w: no exp", ErrInvalid)
	}
	c := Claims{Expiry: exp}
	if !now.Before(c.Expiry.Add(v.o.Leeway)) {
		return Claims{}, fmt.Errorf("%w: expired", ErrInvalid)
	}
	nbf, ok, err := numericDate(claims, "nbf")
	if err != nil {
		return Claims{}, err
	}
	if ok && now.Add(v.o.Leeway).Before(nbf) {
		return Claims{}, fmt.Errorf("%w: not valid yet", ErrInvalid)
	}
	if _, _, err := numericDate(claims, "iat"); err != nil {
		return Claims{}, err
	}
	if v.o.Issuer != "" && claims["iss"] != v.o.Issuer {
		return Claims{}, fmt.Errorf("%w: wrong issuer", ErrInvalid)
	}
	if len(v.o.Audiences) > 0 && !audienceOK(claims["aud"], v.o.Audiences) {
		return Claims{}, fmt.Errorf("%w: wrong audience", ErrInvalid)
	}
	sub, _ := claims[v.o.SubjectClaim].(string)
	if sub == "" {
		return Claims{}, fmt.Errorf("%w: no %s claim", ErrInvalid, v.o.SubjectClaim)
	}
	c.Subject = sub
	c.Tier, _ = claims[v.o.TierClaim].(string)
	c.Tenant, _ = claims[v.o.TenantClaim].(string)
	return c, nil
}

func (v *Verifier) checkSignature(h header, signed string, sig []byte) bool {
	if v.o.Keys == nil {
		return false
	}
	for i := range v.o.Keys.keys {
		k := &v.o.Keys.keys[i]
		if k.alg != h.Alg || (h.Kid != "" && k.kid != "" && k.kid != h.Kid) {
			continue
		}
		switch k.alg {
		case "HS256":
			m := hmac.New(sha256.New, k.secret)
			m.Write([]byte(signed))
			if hmac.Equal(m.Sum(nil), sig) {
				return true
			}
		case "RS256":
			sum := sha256.Sum256([]byte(signed))
			if rsa.VerifyPKCS1v15(k.rsa, crypto.SHA256, sum[:], sig) == nil {
				return true
			}
		case "ES256":
			if len(sig) != 64 {
				continue
			}
			sum := sha256.Sum256([]byte(signed))
			r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
			if ecdsa.Verify(k.ec, sum[:], r, s) {
				return true
			}
		}
	}
	return false
}

func audienceOK(aud any, want []string) bool {
	match := func(s string) bool {
		for _, w := range want {
			if s == w {
				return true
			}
		}
		return false
	}
	switch a := aud.(type) {
	case string:
		return match(a)
	case []any:
		for _, x := range a {
			if s, ok := x.(string); ok && match(s) {
				return true
			}
		}
	}
	return false
}

// maxNumericDate is the last second of year 9999: a later date is not a
// date a real issuer writes.
const maxNumericDate = 253402300799

// numericDate reads a registered date claim (RFC 7519 NumericDate: seconds,
// possibly fractional). ok is false when the claim is absent; anything else
// that is not a number in 0..maxNumericDate (null, a string, a boolean, an
// object, a negative or absurd number) is an error, never skipped: a check
// an issuer asked for must not vanish because the value is odd. JSON has no
// NaN or infinity, and a number too large for a float64 already fails the
// payload's decoding.
func numericDate(claims map[string]any, name string) (t time.Time, ok bool, err error) {
	v, present := claims[name]
	if !present {
		return time.Time{}, false, nil
	}
	f, isNum := v.(float64)
	if !isNum || math.IsNaN(f) || f < 0 || f > maxNumericDate {
		return time.Time{}, false, fmt.Errorf("%w: %s is not a date", ErrInvalid, name)
	}
	// The fraction counts: truncating it would let a token in up to a
	// second before its nbf.
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)), true, nil
}

func b64(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}
