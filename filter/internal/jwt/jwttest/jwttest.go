// Package jwttest makes keys, JWKS documents and signed tokens for tests of
// the filter's JWT verification. It is never linked into the filter.
package jwttest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
)

// Keys holds one key of each supported kind.
type Keys struct {
	HMAC []byte
	RSA  *rsa.PrivateKey
	EC   *ecdsa.PrivateKey
}

// NewKeys generates fresh keys.
func NewKeys() (*Keys, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &Keys{HMAC: secret, RSA: rk, EC: ek}, nil
}

var enc = base64.RawURLEncoding

// JWKS is the public key set for k, with kids "hs", "rs" and "es".
func (k *Keys) JWKS() json.RawMessage {
	e := big.NewInt(int64(k.RSA.E)).Bytes()
	pad := func(b []byte) []byte { return append(make([]byte, 32-len(b)), b...) }
	set := map[string]any{"keys": []map[string]string{
		{"kty": "oct", "kid": "hs", "alg": "HS256", "k": enc.EncodeToString(k.HMAC)},
		{"kty": "RSA", "kid": "rs", "alg": "RS256", "n": enc.EncodeToString(k.RSA.N.Bytes()), "e": enc.EncodeToString(e)},
		{"kty": "EC", "kid": "es", "crv": "P-256", "x": enc.EncodeToString(pad(k.EC.X.Bytes())), "y": enc.EncodeToString(pad(k.EC.Y.Bytes()))},
	}}
	b, _ := json.Marshal(set)
	return b
}

// Sign returns a compact JWS of claims with alg HS256, RS256 or ES256.
func (k *Keys) Sign(alg string, claims map[string]any) string {
	p, _ := json.Marshal(claims)
	return k.SignPayload(alg, p)
}

// SignPayload signs payload as it is, JSON or not: for tests of what a
// correctly signed but malformed token does.
func (k *Keys) SignPayload(alg string, payload []byte) string {
	return k.SignWithHeader(alg, nil, payload)
}

// SignWithHeader signs payload under a header with extra parameters beside
// alg, typ and kid (a crit list...).
func (k *Keys) SignWithHeader(alg string, extra map[string]any, payload []byte) string {
	kid := map[string]string{"HS256": "hs", "RS256": "rs", "ES256": "es"}[alg]
	hm := map[string]any{"alg": alg, "typ": "JWT", "kid": kid}
	for name, v := range extra {
		hm[name] = v
	}
	h, _ := json.Marshal(hm)
	signed := enc.EncodeToString(h) + "." + enc.EncodeToString(payload)
	sum := sha256.Sum256([]byte(signed))
	var sig []byte
	switch alg {
	case "HS256":
		m := hmac.New(sha256.New, k.HMAC)
		m.Write([]byte(signed))
		sig = m.Sum(nil)
	case "RS256":
		sig, _ = rsa.SignPKCS1v15(rand.Reader, k.RSA, crypto.SHA256, sum[:])
	case "ES256":
		r, s, _ := ecdsa.Sign(rand.Reader, k.EC, sum[:])
		pad := func(b []byte) []byte { return append(make([]byte, 32-len(b)), b...) }
		sig = append(pad(r.Bytes()), pad(s.Bytes())...)
	}
	return signed + "." + enc.EncodeToString(sig)
}
