// Package jwt verifies JSON Web Tokens inside the filter: HS256, RS256 and
// ES256 against an inline JWKS, with exp, nbf, iss and aud. Signature checks
// are costly inside Wasm, so a Verifier keeps a bounded cache of tokens it has
// verified, keyed by the token's SHA-256 and valid until the token's exp.
package jwt

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/internal/digest"
	"github.com/tollgate-rl/tollgate/filter/internal/sigverify"
	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// MaxTokenLen bounds a token; a longer one is refused before any parsing.
const MaxTokenLen = 8192

// ErrInvalid is wrapped by every verification failure.
var ErrInvalid = errors.New("invalid token")

// invalidError is a verification failure: ErrInvalid and why.
type invalidError struct{ why string }

func (e *invalidError) Error() string { return ErrInvalid.Error() + ": " + e.why }
func (e *invalidError) Unwrap() error { return ErrInvalid }

func invalid(why string) error { return &invalidError{why} }

type key struct {
	kid    string
	alg    string // HS256, RS256, ES256
	secret []byte
	rsa    *sigverify.RSAKey
	ec     *sigverify.P256Key
}

// KeySet is a parsed JWKS.
type KeySet struct{ keys []key }

// checks reports whether k is a key for h's signature: its alg, and its kid
// when both name one.
func (k *key) checks(h header) bool {
	return k.alg == h.Alg && (h.Kid == "" || k.kid == "" || k.kid == h.Kid)
}

// Len is the number of keys.
func (k *KeySet) Len() int { return len(k.keys) }

type jwk struct {
	Kty, Kid, Alg, Use, N, E, Crv, X, Y, K string
}

// jwkFields are a key's members the verifier reads, by name; the others
// are skipped.
func (j *jwk) field(name string) *string {
	switch name {
	case "kty":
		return &j.Kty
	case "kid":
		return &j.Kid
	case "alg":
		return &j.Alg
	case "use":
		return &j.Use
	case "n":
		return &j.N
	case "e":
		return &j.E
	case "crv":
		return &j.Crv
	case "x":
		return &j.X
	case "y":
		return &j.Y
	case "k":
		return &j.K
	}
	return nil
}

// readJWKS reads {"keys":[{...}, ...]}: each key's members as strings
// (a repeated member: its last value), other members skipped.
func readJWKS(raw []byte) ([]jwk, *fielderr.Error) {
	r := wire.NewReader(raw)
	var keys []jwk
	var bad *fielderr.Error
	err := r.Object(func(name string) error {
		if name != "keys" {
			return r.Skip()
		}
		keys = keys[:0]
		if r.Kind() != wire.KindArray {
			bad = fielderr.New("jwks.keys", "must be an array of keys")
			return errStop
		}
		return r.Array(func(i int) error {
			keys = append(keys, jwk{})
			k := &keys[len(keys)-1]
			if r.Kind() != wire.KindObject {
				bad = fielderr.New("jwks.keys["+strconv.Itoa(i)+"]", "must be an object")
				return errStop
			}
			return r.Object(func(member string) error {
				dst := k.field(member)
				if dst == nil {
					return r.Skip()
				}
				if r.Kind() != wire.KindString {
					bad = fielderr.New("jwks.keys["+strconv.Itoa(i)+"]."+member, "must be a string")
					return errStop
				}
				s, err := r.Str()
				*dst = s
				return err
			})
		})
	})
	switch {
	case bad != nil:
		return nil, bad
	case err != nil || r.End() != nil:
		return nil, fielderr.New("jwks", "not a JWKS: malformed JSON at byte "+strconv.Itoa(r.Offset()))
	}
	return keys, nil
}

// errStop ends a read whose error is said otherwise.
var errStop = errors.New("stop")

// ParseJWKS reads {"keys":[...]}. An error names the bad part from the key
// set itself ("jwks.keys[1].n"), for the caller to place under its own field
// with In.
func ParseJWKS(raw []byte) (*KeySet, *fielderr.Error) {
	keys, ferr := readJWKS(raw)
	if ferr != nil {
		return nil, ferr
	}
	if len(keys) == 0 {
		return nil, fielderr.New("jwks.keys", "at least one key is needed")
	}
	ks := &KeySet{}
	for i, j := range keys {
		at := "jwks.keys[" + strconv.Itoa(i) + "]"
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
			pub, ok := sigverify.ParseRSA(n, e)
			if !ok {
				return nil, fielderr.New(at, "is not an RSA key RS256 can use here: an odd modulus of 2048 to 8192 bits and an odd exponent of 3 to 2^31-1")
			}
			k.alg, k.rsa = "RS256", pub
		case "EC":
			if j.Crv != "P-256" || (j.Alg != "" && j.Alg != "ES256") {
				return nil, fielderr.New(at+".crv", "only P-256 (ES256) is supported")
			}
			x, errX := b64(j.X)
			y, errY := b64(j.Y)
			if errX != nil || errY != nil || len(x) != 32 || len(y) != 32 {
				return nil, fielderr.New(at+".x", "x and y must be base64url of 32 bytes each")
			}
			pub, ok := sigverify.ParseP256(x, y)
			if !ok {
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
//
// Times are int64 Unix nanoseconds, not time.Time: the filter's module links
// no package time (207 kB with what it brings).
type Claims struct {
	Subject string
	Tier    string
	Tenant  string
	exp     int64 // the exp claim in Unix nanoseconds (saturated past 2262)
}

// Expiry is the token's exp claim in Unix nanoseconds.
func (c Claims) Expiry() int64 { return c.exp }

// Options configure a Verifier.
type Options struct {
	Keys                                 *KeySet
	Issuer                               string
	Audiences                            []string
	SubjectClaim, TierClaim, TenantClaim string
	// LeewaySeconds tolerates clock skew on exp and nbf (seconds, not a
	// time.Duration: see Claims).
	LeewaySeconds int64
	CacheSize     int
	// CacheKey places tokens in the cache (random per process): with the
	// places worked out from the token alone, one account's two tokens
	// of one place, sent in turn, made every request a signature check
	// (an outsider's: 2,470 ES256 checks a second, no budget spent).
	CacheKey [2]uint64
}

// leeway is LeewaySeconds in nanoseconds.
func (o *Options) leeway() int64 { return o.LeewaySeconds * 1e9 }

// satAdd is a+b for b >= 0 (a leeway: 0..600 seconds), saturating: a date
// far past 2262 is never reached, never wraps into the past.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Verifier checks tokens. It is not safe for concurrent use (one per VM).
type Verifier struct {
	o     Options
	cache []cacheEntry
	uses  uint64 // counts cache hits and stores, for least-recent eviction
}

type cacheEntry struct {
	sum    [32]byte
	claims Claims
	used   bool
	last   uint64 // the verifier's uses when last hit or stored
}

// places are the two cache slots a token's sum may sit in (the cache is
// two-way: two tokens of the same places both stay), by a keyed mix of
// the sum (Options.CacheKey).
func (v *Verifier) places(sum *[32]byte) (int, int) {
	mix := func(x uint64) uint64 { // splitmix64's finalizer
		x ^= x >> 30
		x *= 0xbf58476d1ce4e5b9
		x ^= x >> 27
		x *= 0x94d049bb133111eb
		return x ^ x>>31
	}
	h := mix(binary.LittleEndian.Uint64(sum[:8])^v.o.CacheKey[0]) ^ mix(binary.LittleEndian.Uint64(sum[8:16])^v.o.CacheKey[1])
	n := uint64(len(v.cache))
	i, j := h%n, (h>>32)%n
	if i == j && n > 1 {
		j = (i + 1) % n
	}
	return int(i), int(j)
}

// NewVerifier returns a verifier with an empty cache.
func NewVerifier(o Options) *Verifier {
	return &Verifier{o: o, cache: make([]cacheEntry, max(o.CacheSize, 1))}
}

// Verify checks a compact JWS and returns its claims.
func (v *Verifier) Verify(token string, now int64) (Claims, error) {
	return v.VerifyIf(token, now, nil)
}

// ErrNotVerified is VerifyIf's answer for a token it did not hold and was
// not allowed to check.
var ErrNotVerified = invalid("not verified: too many invalid tokens from this client")

// VerifyIf is Verify that checks a token's signature only when allow (nil:
// always) says so: a token it holds verified costs a hash, a signature
// check up to milliseconds inside Wasm, which a client sending new junk
// tokens would otherwise have the VM pay on every request. allow is asked
// only for a token that passed every check but its signature (its form,
// dates, issuer, audience, subject, a key for its alg and kid), all of
// them cheap: an expired or malformed token fails without it, and counts
// against no budget of the caller's.
func (v *Verifier) VerifyIf(token string, now int64, allow func() bool) (Claims, error) {
	if len(token) > MaxTokenLen {
		return Claims{}, invalid("longer than " + strconv.Itoa(MaxTokenLen) + " bytes")
	}
	sum := digest.Sum256([]byte(token))
	i, j := v.places(&sum)
	a, b := &v.cache[i], &v.cache[j]
	v.uses++
	for _, slot := range [2]*cacheEntry{a, b} {
		if slot.used && slot.sum == sum {
			if now < satAdd(slot.claims.exp, v.o.leeway()) {
				slot.last = v.uses
				return slot.claims, nil
			}
			slot.used = false
			return Claims{}, invalid("expired")
		}
	}
	c, err := v.verify(token, now, allow)
	if err != nil {
		return Claims{}, err
	}
	// The free place, else the one less recently used.
	if a.used && (!b.used || b.last < a.last) {
		a = b
	}
	*a = cacheEntry{sum: sum, claims: c, used: true, last: v.uses}
	return c, nil
}

type header struct {
	Alg, Kid string
	// Crit lists extensions the token requires its recipient to understand
	// (RFC 7515, 4.1.11). This verifier understands none, so a token with a
	// crit parameter, whatever it holds, is invalid.
	Crit bool
}

// readHeader reads a token's header. Names are matched as encoding/json
// matched them before (Unicode case folding: "ALG" is alg, and any
// spelling of crit refuses the token); a repeated one counts its last
// value.
func readHeader(b []byte) (header, error) {
	var h header
	r := wire.NewReader(b)
	err := r.Object(func(name string) error {
		var dst *string
		switch {
		case strings.EqualFold(name, "crit"):
			h.Crit = true
			return r.Skip()
		case strings.EqualFold(name, "alg"):
			dst = &h.Alg
		case strings.EqualFold(name, "kid"):
			dst = &h.Kid
		default:
			return r.Skip()
		}
		switch r.Kind() {
		case wire.KindNull:
			r.Null()
			return nil
		case wire.KindString:
			v, err := r.Str()
			*dst = v
			return err
		}
		return errStop
	})
	if err == nil {
		err = r.End()
	}
	return h, err
}

// claims are the payload's members the verifier reads (a repeated one: its
// last value); the others are skipped.
type claims map[string]claim

type claim struct {
	kind wire.Kind
	str  string
	num  float64
	strs []string // the strings of an array (aud)
}

// skipValue consumes a value the verifier does not read, refusing what a
// JSON decoder of the whole payload would refuse (a number beyond float64),
// so that a token is valid or not whatever claims are read of it.
func skipValue(r *wire.Reader, depth int) error {
	if depth > 64 {
		return errStop
	}
	switch r.Kind() {
	case wire.KindNumber:
		_, err := r.Float()
		return err
	case wire.KindArray:
		return r.Array(func(int) error { return skipValue(r, depth+1) })
	case wire.KindObject:
		return r.Object(func(string) error { return skipValue(r, depth+1) })
	}
	return r.Skip()
}

// readClaims reads the payload's members named in want.
func readClaims(b []byte, want ...string) (claims, error) {
	out := claims{}
	r := wire.NewReader(b)
	err := r.Object(func(name string) error {
		if !slices.Contains(want, name) {
			return skipValue(r, 0)
		}
		c := claim{kind: r.Kind()}
		var err error
		switch c.kind {
		case wire.KindString:
			c.str, err = r.Str()
		case wire.KindNumber:
			c.num, err = r.Float()
		case wire.KindArray:
			err = r.Array(func(int) error {
				if r.Kind() != wire.KindString {
					return skipValue(r, 1)
				}
				s, err := r.Str()
				c.strs = append(c.strs, s)
				return err
			})
		default:
			err = skipValue(r, 0)
		}
		out[name] = c
		return err
	})
	if err == nil {
		err = r.End()
	}
	return out, err
}

func (v *Verifier) verify(token string, now int64, allow func() bool) (Claims, error) {
	h64, rest, ok1 := strings.Cut(token, ".")
	p64, s64, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || strings.Contains(s64, ".") {
		return Claims{}, invalid("not a compact JWS")
	}
	hb, err := tokenB64(h64)
	if err != nil {
		return Claims{}, invalid("header is not base64url")
	}
	h, err := readHeader(hb)
	if err != nil {
		return Claims{}, invalid("header is not JSON")
	}
	if h.Crit {
		return Claims{}, invalid("header names critical extensions (crit) this verifier does not support")
	}
	sig, err := tokenB64(s64)
	if err != nil {
		return Claims{}, invalid("signature is not base64url")
	}
	pb, err := tokenB64(p64)
	if err != nil {
		return Claims{}, invalid("payload is not base64url")
	}
	claims, err := readClaims(pb, "exp", "nbf", "iat", "iss", "aud", v.o.SubjectClaim, v.o.TierClaim, v.o.TenantClaim)
	if err != nil {
		return Claims{}, invalid("payload is not a JSON object")
	}
	// Registered dates: exp is required; nbf and iat are optional, but a
	// malformed one (a string, a boolean, a date past year 9999) makes the
	// token invalid rather than being skipped.
	exp, ok, err := numericDate(claims, "exp")
	if err != nil {
		return Claims{}, err
	}
	if !ok {
		return Claims{}, invalid("no exp")
	}
	c := Claims{exp: exp}
	if now >= satAdd(exp, v.o.leeway()) {
		return Claims{}, invalid("expired")
	}
	nbf, ok, err := numericDate(claims, "nbf")
	if err != nil {
		return Claims{}, err
	}
	if ok && satAdd(now, v.o.leeway()) < nbf {
		return Claims{}, invalid("not valid yet")
	}
	if _, _, err := numericDate(claims, "iat"); err != nil {
		return Claims{}, err
	}
	if iss := claims["iss"]; v.o.Issuer != "" && (iss.kind != wire.KindString || iss.str != v.o.Issuer) {
		return Claims{}, invalid("wrong issuer")
	}
	if len(v.o.Audiences) > 0 && !audienceOK(claims["aud"], v.o.Audiences) {
		return Claims{}, invalid("wrong audience")
	}
	sub := claims[v.o.SubjectClaim].str // "" unless a string
	if sub == "" {
		return Claims{}, invalid("no " + v.o.SubjectClaim + " claim")
	}
	// The signature last: the claims above are read from what it signs,
	// and none of them is used unless it holds.
	if !v.hasKey(h) {
		return Claims{}, invalid("bad signature or unknown key")
	}
	if allow != nil && !allow() {
		return Claims{}, ErrNotVerified
	}
	if !v.checkSignature(h, token[:len(h64)+1+len(p64)], sig) {
		return Claims{}, invalid("bad signature or unknown key")
	}
	c.Subject = sub
	c.Tier, c.Tenant = claims[v.o.TierClaim].str, claims[v.o.TenantClaim].str
	return c, nil
}

// hasKey reports whether a key could check h's signature (its alg, and its
// kid when both name one): no key, no signature check to pay for.
func (v *Verifier) hasKey(h header) bool {
	if v.o.Keys == nil {
		return false
	}
	for i := range v.o.Keys.keys {
		if v.o.Keys.keys[i].checks(h) {
			return true
		}
	}
	return false
}

func (v *Verifier) checkSignature(h header, signed string, sig []byte) bool {
	if v.o.Keys == nil {
		return false
	}
	for i := range v.o.Keys.keys {
		k := &v.o.Keys.keys[i]
		if !k.checks(h) {
			continue
		}
		switch k.alg {
		case "HS256":
			if mac := digest.HMAC(k.secret, []byte(signed)); digest.Equal(mac[:], sig) {
				return true
			}
		case "RS256":
			if k.rsa.VerifyPKCS1v15(digest.Sum256([]byte(signed)), sig) {
				return true
			}
		case "ES256":
			if k.ec.Verify(digest.Sum256([]byte(signed)), sig) {
				return true
			}
		}
	}
	return false
}

func audienceOK(aud claim, want []string) bool {
	switch aud.kind {
	case wire.KindString:
		return slices.Contains(want, aud.str)
	case wire.KindArray:
		for _, s := range aud.strs {
			if slices.Contains(want, s) {
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
func numericDate(claims claims, name string) (t int64, ok bool, err error) {
	v, present := claims[name]
	if !present {
		return 0, false, nil
	}
	f := v.num
	if v.kind != wire.KindNumber || math.IsNaN(f) || f < 0 || f > maxNumericDate {
		return 0, false, invalid(name + " is not a date")
	}
	// The fraction counts: truncating it would let a token in up to a
	// second before its nbf. In nanoseconds, saturated past 2262.
	sec, frac := math.Modf(f)
	if sec >= math.MaxInt64/1e9 {
		return math.MaxInt64, true, nil
	}
	return int64(sec)*1e9 + int64(frac*1e9), true, nil
}

// b64 reads a JWKS member: unpadded base64url, padding and line breaks
// forgiven (an operator's key set, not a client's input).
func b64(s string) ([]byte, error) {
	s = strings.TrimRight(s, "=")
	if strings.ContainsAny(s, "\r\n") {
		b := make([]byte, 0, len(s))
		for i := 0; i < len(s); i++ {
			if s[i] != '\r' && s[i] != '\n' {
				b = append(b, s[i])
			}
		}
		s = string(b)
	}
	return base64URL(s, false)
}

// tokenB64 reads a token's part as RFC 7515 writes it: base64url with no
// padding, no line breaks and no stray bits, so each part has one
// spelling. Read leniently (padding dropped, the last character's unused
// bits ignored), one signed token had about 250,000 spellings, each a new
// entry to the verifier's cache and a signature check that passes, which
// no budget of failed checks bounds (an outsider's attack cut another
// client's throughput 37-fold with them).
func tokenB64(s string) ([]byte, error) {
	return base64URL(s, true)
}

var errBase64 = errors.New("not unpadded base64url")

// base64URL decodes unpadded base64url (RFC 4648, section 5); strict also
// refuses a last character whose unused bits are not zero. Hand-written:
// encoding/base64 was 12 kB of the module for these two uses.
func base64URL(s string, strict bool) ([]byte, error) {
	if len(s)%4 == 1 {
		return nil, errBase64
	}
	out := make([]byte, 0, len(s)*3/4)
	var acc uint32
	bits := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		var v byte
		switch {
		case c >= 'A' && c <= 'Z':
			v = c - 'A'
		case c >= 'a' && c <= 'z':
			v = c - 'a' + 26
		case c >= '0' && c <= '9':
			v = c - '0' + 52
		case c == '-':
			v = 62
		case c == '_':
			v = 63
		default:
			return nil, errBase64
		}
		acc, bits = acc<<6|uint32(v), bits+6
		if bits >= 8 {
			bits -= 8
			out = append(out, byte(acc>>bits))
		}
	}
	if strict && acc&(1<<bits-1) != 0 {
		return nil, errBase64
	}
	return out, nil
}
