package sigverify

import "bytes"

// RSAKey is an RSA public key for RS256.
type RSAKey struct {
	n *modulus
	e []byte // big-endian, no leading zeros
	k int    // the modulus's length in bytes
}

// RSA bounds: a modulus of 2048 to 4096 bits (a smaller one is refused by
// the JWKS's reader; a check with an 8192-bit one cost 3.1 ms of a VM's
// time, and a token without kid is checked against every key of its alg:
// attack 45 A2), an exponent odd, at least 3 and below 2^31 (as crypto/rsa
// takes it).
const (
	minRSABytes = 256
	maxRSABytes = 512
)

// ParseRSA reads a public key from the big-endian bytes of its modulus and
// exponent; false when they are not one this package takes.
func ParseRSA(n, e []byte) (*RSAKey, bool) {
	for len(n) > 0 && n[0] == 0 {
		n = n[1:]
	}
	for len(e) > 0 && e[0] == 0 {
		e = e[1:]
	}
	if len(n) < minRSABytes || len(n) > maxRSABytes || len(e) == 0 || len(e) > 4 || e[len(e)-1]&1 == 0 ||
		len(e) == 4 && e[0] >= 0x80 || len(e) == 1 && e[0] < 3 {
		return nil, false
	}
	md, ok := newModulus(n)
	if !ok {
		return nil, false
	}
	return &RSAKey{n: md, e: append([]byte(nil), e...), k: len(n)}, true
}

// Size is the modulus's length in bytes.
func (k *RSAKey) Size() int { return k.k }

// sha256Prefix is the DER of DigestInfo for SHA-256 (RFC 8017, 9.2 note 1),
// which precedes the digest in the encoded message.
var sha256Prefix = []byte{0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20}

// VerifyPKCS1v15 reports whether sig is k's RSASSA-PKCS1-v1_5 signature of
// the SHA-256 digest (RFC 8017, 8.2.2): the signature, as a number below
// the modulus, raised to the exponent must be exactly the encoding
// 00 01 FF..FF 00 DigestInfo digest.
func (k *RSAKey) VerifyPKCS1v15(digest [32]byte, sig []byte) bool {
	if len(sig) != k.k {
		return false
	}
	s := limbs(sig)
	s = append(s, make([]uint64, len(k.n.m)-len(s))...)
	if !less(s, k.n.m) {
		return false
	}
	m := k.n.fromMont(k.n.exp(k.n.toMont(s), k.e))
	em := bytesOf(m, k.k)
	want := make([]byte, k.k)
	want[1] = 1
	ps := k.k - 3 - len(sha256Prefix) - len(digest)
	for i := range ps {
		want[2+i] = 0xff
	}
	copy(want[3+ps:], sha256Prefix)
	copy(want[3+ps+len(sha256Prefix):], digest[:])
	return bytes.Equal(em, want) // public values: no timing to hide
}
