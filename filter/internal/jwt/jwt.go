// Package jwt verifies JSON Web Tokens inside the filter: HS256, RS256 and
// ES256 against an inline JWKS, with exp, nbf, iss and aud. Signature checks
// are costly inside Wasm, so a Verifier keeps a bounded cache of tokens it has
// verified, keyed by the token's SHA-256 and valid until the token's exp.
package jwt

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/internal/digest"
	"github.com/tollgate-rl/tollgate/filter/internal/sigverify"
	"github.com/tollgate-rl/tollgate/filter/internal/siphash"
	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// MaxTokenLen bounds a token; a longer one is refused before any parsing.
const MaxTokenLen = 8192

// cheapRead is the longest header and payload (base64url, together) read
// without asking VerifyIf's allow first: 2 KiB, which an identity
// provider's tokens fit but for long group lists; the most a junk one
// costs is about a quarter of the longest one's.
const cheapRead = 2048

// ErrInvalid is wrapped by every verification failure.
var ErrInvalid = errors.New("invalid token")

// invalidError is a verification failure: ErrInvalid and why.
type invalidError struct{ why string }

func (e *invalidError) Error() string { return ErrInvalid.Error() + ": " + e.why }
func (e *invalidError) Unwrap() error { return ErrInvalid }

func invalid(why string) error { return &invalidError{why} }

type key struct {
	kid string
	alg string // HS256, RS256, ES256
	// cost is a signature check with the key in checks (VerifyIf): 1, or
	// 2 for an RSA key over 2048 bits.
	cost   int
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
			// sigverify refuses a modulus over 4096 bits; said here by
			// name, as the one field at fault.
			for len(n) > 0 && n[0] == 0 {
				n = n[1:]
			}
			if len(n) > 512 {
				return nil, fielderr.New(at+".n", "a modulus of more than 4096 bits is not supported (a signature check with it costs milliseconds in the VM)")
			}
			e, err := b64(j.E)
			if err != nil || len(e) == 0 || len(e) > 4 {
				return nil, fielderr.New(at+".e", "must be base64url of a small exponent")
			}
			pub, ok := sigverify.ParseRSA(n, e)
			if !ok {
				return nil, fielderr.New(at, "is not an RSA key RS256 can use here: an odd modulus of 2048 to 4096 bits and an odd exponent of 3 to 2^31-1")
			}
			k.alg, k.rsa = "RS256", pub
			if pub.Size() > 256 {
				k.cost = 2 // over 2048 bits
			}
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
		k.cost = max(k.cost, 1)
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
	sum    [2]uint64 // the token's SipHash under Options.CacheKey
	claims Claims
	used   bool
	last   uint64 // the verifier's uses when last hit or stored
}

// sum is the token's SipHash-2-4-128 under the process's secret cache key:
// a PRF, so nobody without the key can make a token whose sum is another
// token's and be taken for its holder (2^-128 a guess, blind: sums are
// never shown). It replaced SHA-256, which cost a token of 8 KiB 35 % of
// its rejection natively, and a copy of it, before any check (attack 45
// A1: a junk token of 1,000 tiny claims cost the VM 0.9 ms, twice an RS256
// check, with no budget spent).
func (v *Verifier) sum(token string) [2]uint64 {
	h0, h1 := siphash.Parts(v.o.CacheKey[0], v.o.CacheKey[1], []string{token})
	return [2]uint64{h0, h1}
}

// places are the two cache slots a token's sum may sit in (the cache is
// two-way: two tokens of the same places both stay). The sum is keyed
// (Options.CacheKey): with the places worked out from the token alone,
// an outsider could pick tokens that share them.
func (v *Verifier) places(sum [2]uint64) (int, int) {
	n := uint64(len(v.cache))
	i, j := sum[0]%n, sum[1]%n
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

// VerifyIf is Verify that does the dear parts of a check only when allow
// (nil: always) says so, given what the part costs in checks: a token it
// holds verified costs a hash, a signature check up to milliseconds inside
// Wasm, which a client sending new junk tokens would otherwise have the VM
// pay on every request. allow is asked before the signature checks, with
// their number weighted by key (a token without kid is checked against
// every key of its alg; a check with an RSA key over 2048 bits counts
// two), for a token that passed every cheap check (its form, dates,
// issuer, audience, subject, a key for its alg and kid): a short expired
// or malformed token fails without it, and counts against no budget of
// the caller's. It is asked too, for one check, before a header and
// payload longer than cheapRead are read, which is not cheap. A caller that counts
// failures counts what it allowed.
func (v *Verifier) VerifyIf(token string, now int64, allow func(checks int) bool) (Claims, error) {
	if len(token) > MaxTokenLen {
		return Claims{}, invalid("longer than " + strconv.Itoa(MaxTokenLen) + " bytes")
	}
	sum := v.sum(token)
	i, j := v.places(sum)
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
		return r.Number()
	case wire.KindArray:
		return r.Array(func(int) error { return skipValue(r, depth+1) })
	case wire.KindObject:
		return r.Fields(func([]byte) error { return skipValue(r, depth+1) })
	}
	return r.Skip()
}

// readClaims reads the payload's members named in want. A member it does
// not read costs no string and no conversion (wire.Reader.Fields and
// Number): the claims are read before the issuer or the signature can
// refuse the token, so a junk token's thousand tiny claims are all a
// client can make the VM read.
func readClaims(b []byte, want ...string) (claims, error) {
	out := claims{}
	r := wire.NewReader(b)
	err := r.Fields(func(key []byte) error {
		name := ""
		for _, w := range want {
			if w != "" && string(key) == w {
				name = w
				break
			}
		}
		if name == "" {
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

func (v *Verifier) verify(token string, now int64, allow func(checks int) bool) (Claims, error) {
	h64, rest, ok1 := strings.Cut(token, ".")
	p64, s64, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || strings.Contains(s64, ".") {
		return Claims{}, invalid("not a compact JWS")
	}
	// A long header or payload costs reading before any check can refuse
	// it (8 KiB of a thousand tiny claims cost the VM 0.9 ms, attack 45
	// A1; of a thousand header members 0.6 ms, attack 46 A1), so a long
	// token is read only while its client may still have a token checked,
	// and once read it counts as one check (allow was asked).
	if len(h64)+len(p64) > cheapRead && allow != nil && !allow(1) {
		return Claims{}, ErrNotVerified
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
	// No key, no signature check to pay for, and no payload to read.
	if !v.hasKey(h) {
		return Claims{}, invalid("bad signature or unknown key")
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
	if allow != nil && !allow(v.checksFor(h)) {
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
func (v *Verifier) hasKey(h header) bool { return v.checksFor(h) > 0 }

// checksFor is what checking h's signature may cost, in checks: every key
// that could check it, each by its cost.
func (v *Verifier) checksFor(h header) int {
	if v.o.Keys == nil {
		return 0
	}
	n := 0
	for i := range v.o.Keys.keys {
		if k := &v.o.Keys.keys[i]; k.checks(h) {
			n += k.cost
		}
	}
	return n
}

func (v *Verifier) checkSignature(h header, signed string, sig []byte) bool {
	if v.o.Keys == nil {
		return false
	}
	var sum [32]byte
	hashed := false
	for i := range v.o.Keys.keys {
		k := &v.o.Keys.keys[i]
		if !k.checks(h) {
			continue
		}
		if k.alg != "HS256" && !hashed {
			// Once for every key a kid-less token is tried against.
			sum, hashed = digest.Sum256([]byte(signed)), true
		}
		switch k.alg {
		case "HS256":
			if mac := digest.HMAC(k.secret, []byte(signed)); digest.Equal(mac[:], sig) {
				return true
			}
		case "RS256":
			if k.rsa.VerifyPKCS1v15(sum, sig) {
				return true
			}
		case "ES256":
			if k.ec.Verify(sum, sig) {
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
// encoding/base64 was 12 kB of the module for these two uses. Four
// characters at a time through a table: a token's payload is decoded
// before any check can refuse it, and the switch a character took cost a
// junk token of 8 KiB a third of its rejection natively.
func base64URL(s string, strict bool) ([]byte, error) {
	if len(s)%4 == 1 {
		return nil, errBase64
	}
	out := make([]byte, len(s)*3/4)
	n, i := 0, 0
	for ; i+4 <= len(s); i += 4 {
		a, b, c, d := b64URL[s[i]], b64URL[s[i+1]], b64URL[s[i+2]], b64URL[s[i+3]]
		if (a|b|c|d)&0xc0 != 0 {
			return nil, errBase64
		}
		v := uint32(a)<<18 | uint32(b)<<12 | uint32(c)<<6 | uint32(d)
		out[n], out[n+1], out[n+2] = byte(v>>16), byte(v>>8), byte(v)
		n += 3
	}
	var v, unused uint32
	switch len(s) - i {
	case 2:
		a, b := b64URL[s[i]], b64URL[s[i+1]]
		if (a|b)&0xc0 != 0 {
			return nil, errBase64
		}
		v = uint32(a)<<6 | uint32(b)
		out[n], unused = byte(v>>4), v&0xf
	case 3:
		a, b, c := b64URL[s[i]], b64URL[s[i+1]], b64URL[s[i+2]]
		if (a|b|c)&0xc0 != 0 {
			return nil, errBase64
		}
		v = uint32(a)<<12 | uint32(b)<<6 | uint32(c)
		out[n], out[n+1], unused = byte(v>>10), byte(v>>2), v&0x3
	}
	if strict && unused != 0 {
		return nil, errBase64
	}
	return out, nil
}

// b64URL is each character's six bits in base64url, 0xff for a character
// outside it.
var b64URL = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for i := range len(alphabet) {
		t[alphabet[i]] = byte(i)
	}
	return t
}()
