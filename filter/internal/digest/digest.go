// Package digest is SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104) for
// the filter: HS256 tokens and the verified-token cache's keys. The
// standard library's crypto packages bring its FIPS 140 module into the
// Wasm module (AES, SHA-3, a DRBG, self-tests: about 150 kB) for these two
// functions; its tests hold every answer to crypto/sha256's and
// crypto/hmac's.
package digest

import (
	"encoding/binary"
	"math/bits"
)

// Size is the length of a SHA-256 digest.
const Size = 32

const blockSize = 64

var k = [64]uint32{
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

var initial = [8]uint32{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}

// Hash is a running SHA-256.
type Hash struct {
	h   [8]uint32
	buf [blockSize]byte
	n   int    // bytes in buf
	len uint64 // bytes written
}

// New starts a SHA-256.
func New() *Hash { return &Hash{h: initial} }

// Write adds p to the message.
func (d *Hash) Write(p []byte) {
	d.len += uint64(len(p))
	if d.n > 0 {
		c := copy(d.buf[d.n:], p)
		d.n += c
		p = p[c:]
		if d.n < blockSize {
			return
		}
		d.block(d.buf[:])
		d.n = 0
	}
	for len(p) >= blockSize {
		d.block(p[:blockSize])
		p = p[blockSize:]
	}
	d.n = copy(d.buf[:], p)
}

// Sum is the digest of what was written; d is not changed.
func (d *Hash) Sum() [Size]byte {
	e := *d
	var pad [blockSize + 8]byte
	pad[0] = 0x80
	padLen := (55 - int(e.len%blockSize) + blockSize) % blockSize
	binary.BigEndian.PutUint64(pad[1+padLen:], e.len*8)
	e.Write(pad[:1+padLen+8])
	var out [Size]byte
	for i, v := range e.h {
		binary.BigEndian.PutUint32(out[4*i:], v)
	}
	return out
}

// Sum256 is the SHA-256 of data.
func Sum256(data []byte) [Size]byte {
	d := New()
	d.Write(data)
	return d.Sum()
}

func (d *Hash) block(p []byte) {
	var w [64]uint32
	for i := range 16 {
		w[i] = binary.BigEndian.Uint32(p[4*i:])
	}
	for i := 16; i < 64; i++ {
		s0 := bits.RotateLeft32(w[i-15], -7) ^ bits.RotateLeft32(w[i-15], -18) ^ w[i-15]>>3
		s1 := bits.RotateLeft32(w[i-2], -17) ^ bits.RotateLeft32(w[i-2], -19) ^ w[i-2]>>10
		w[i] = w[i-16] + s0 + w[i-7] + s1
	}
	a, b, c, dd, e, f, g, h := d.h[0], d.h[1], d.h[2], d.h[3], d.h[4], d.h[5], d.h[6], d.h[7]
	for i := range 64 {
		t1 := h + (bits.RotateLeft32(e, -6) ^ bits.RotateLeft32(e, -11) ^ bits.RotateLeft32(e, -25)) + (e&f ^ ^e&g) + k[i] + w[i]
		t2 := (bits.RotateLeft32(a, -2) ^ bits.RotateLeft32(a, -13) ^ bits.RotateLeft32(a, -22)) + (a&b ^ a&c ^ b&c)
		h, g, f, e, dd, c, b, a = g, f, e, dd+t1, c, b, a, t1+t2
	}
	d.h[0] += a
	d.h[1] += b
	d.h[2] += c
	d.h[3] += dd
	d.h[4] += e
	d.h[5] += f
	d.h[6] += g
	d.h[7] += h
}

// HMAC is HMAC-SHA-256 of message under key (RFC 2104).
func HMAC(key, message []byte) [Size]byte {
	if len(key) > blockSize {
		k := Sum256(key)
		key = k[:]
	}
	var ipad, opad [blockSize]byte
	copy(ipad[:], key)
	copy(opad[:], key)
	for i := range ipad {
		ipad[i] ^= 0x36
		opad[i] ^= 0x5c
	}
	in := New()
	in.Write(ipad[:])
	in.Write(message)
	inner := in.Sum()
	out := New()
	out.Write(opad[:])
	out.Write(inner[:])
	return out.Sum()
}

// Equal compares two MACs in time that depends only on their lengths: a
// forger must not learn how many leading bytes of a guess were right.
func Equal(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	var v byte
	for i := range a {
		v |= a[i] ^ b[i]
	}
	return v == 0
}
