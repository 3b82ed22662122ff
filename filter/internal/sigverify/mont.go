// Package sigverify checks the signatures of JSON Web Tokens inside the
// filter: RSASSA-PKCS1-v1_5 with SHA-256 (RS256) and ECDSA over P-256 with
// SHA-256 (ES256). Only verification, only of public data: nothing here
// handles a secret, so nothing needs to run in constant time. It exists
// because crypto/rsa and crypto/ecdsa carry math/big, and with it fmt and
// reflect, into the module (about a megabyte of its six); its tests hold
// every answer to theirs (the native build's standard library).
package sigverify

import "math/bits"

// modulus is an odd modulus m of n 64-bit limbs (little-endian), with what
// Montgomery multiplication needs: values are kept as x·R mod m, R = 2^(64n).
type modulus struct {
	m     []uint64
	m0inv uint64   // -m^-1 mod 2^64
	rr    []uint64 // R² mod m: toMont's factor
	one   []uint64 // R mod m: 1 in Montgomery form
}

// newModulus reads a big-endian odd modulus above 1 (leading zero bytes
// allowed); false when it is not one.
func newModulus(be []byte) (*modulus, bool) {
	m := limbs(be)
	for len(m) > 0 && m[len(m)-1] == 0 {
		m = m[:len(m)-1]
	}
	if len(m) == 0 || m[0]&1 == 0 || len(m) == 1 && m[0] == 1 {
		return nil, false
	}
	md := &modulus{m: m}
	// Newton's iteration doubles the correct low bits of m0's inverse each
	// step: 1 bit (m0 is odd) to 64 in six.
	inv := uint64(1)
	for range 6 {
		inv *= 2 - m[0]*inv
	}
	md.m0inv = -inv
	// R mod m and R² mod m by doubling 1 modulo m: 64n doublings give R,
	// 64n more give R².
	n := len(m)
	x := make([]uint64, n)
	x[0] = 1
	for range 64 * n {
		md.double(x)
	}
	md.one = append([]uint64(nil), x...)
	for range 64 * n {
		md.double(x)
	}
	md.rr = x
	return md, true
}

// limbs reads big-endian bytes into little-endian 64-bit limbs.
func limbs(be []byte) []uint64 {
	out := make([]uint64, (len(be)+7)/8)
	for i, b := range be {
		pos := len(be) - 1 - i // the byte's place from the least significant
		out[pos/8] |= uint64(b) << (8 * (pos % 8))
	}
	return out
}

// bytesOf writes x as big-endian bytes of exactly size bytes (x must fit).
func bytesOf(x []uint64, size int) []byte {
	out := make([]byte, size)
	for i := range size {
		pos := size - 1 - i
		if pos/8 < len(x) {
			out[i] = byte(x[pos/8] >> (8 * (pos % 8)))
		}
	}
	return out
}

// double sets x = 2x mod m, for x < m.
func (md *modulus) double(x []uint64) {
	var carry uint64
	for i := range x {
		x[i], carry = x[i]<<1|carry, x[i]>>63
	}
	if carry != 0 || !less(x, md.m) {
		sub(x, x, md.m)
	}
}

// less reports x < y, for limb vectors of one length.
func less(x, y []uint64) bool {
	for i := len(x) - 1; i >= 0; i-- {
		if x[i] != y[i] {
			return x[i] < y[i]
		}
	}
	return false
}

func isZero(x []uint64) bool {
	for _, v := range x {
		if v != 0 {
			return false
		}
	}
	return true
}

func equal(x, y []uint64) bool {
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}

// sub sets z = x - y and returns the borrow.
func sub(z, x, y []uint64) uint64 {
	var b uint64
	for i := range z {
		z[i], b = bits.Sub64(x[i], y[i], b)
	}
	return b
}

// add sets z = x + y and returns the carry.
func add(z, x, y []uint64) uint64 {
	var c uint64
	for i := range z {
		z[i], c = bits.Add64(x[i], y[i], c)
	}
	return c
}

// addMod sets z = x + y mod m, for x, y < m.
func (md *modulus) addMod(z, x, y []uint64) {
	if add(z, x, y) != 0 || !less(z, md.m) {
		sub(z, z, md.m)
	}
}

// subMod sets z = x - y mod m, for x, y < m.
func (md *modulus) subMod(z, x, y []uint64) {
	if sub(z, x, y) != 0 {
		add(z, z, md.m)
	}
}

// mul sets z = x·y·R⁻¹ mod m (Montgomery multiplication, CIOS), for
// x, y < m; z may be x or y.
func (md *modulus) mul(z, x, y []uint64) {
	n := len(md.m)
	var buf [6]uint64 // P-256's four limbs need no allocation
	var t []uint64
	if n+2 <= len(buf) {
		t = buf[:n+2]
	} else {
		t = make([]uint64, n+2)
	}
	// Slices of length n, so that the loops below run without bounds
	// checks.
	m := md.m[:n]
	x, y, t = x[:n], y[:n], t[:n+2]
	for i := range n {
		// t += x[i]·y
		var c uint64
		xi := x[i]
		for j := range n {
			hi, lo := bits.Mul64(xi, y[j])
			var cc uint64
			lo, cc = bits.Add64(lo, t[j], 0)
			hi += cc
			lo, cc = bits.Add64(lo, c, 0)
			hi += cc
			t[j], c = lo, hi
		}
		var cc uint64
		t[n], cc = bits.Add64(t[n], c, 0)
		t[n+1] = cc
		// t = (t + q·m) / 2^64, with q making the low limb vanish.
		q := t[0] * md.m0inv
		hi, lo := bits.Mul64(q, m[0])
		_, cc = bits.Add64(lo, t[0], 0)
		c = hi + cc
		for j := 1; j < n; j++ {
			hi, lo = bits.Mul64(q, m[j])
			lo, cc = bits.Add64(lo, t[j], 0)
			hi += cc
			lo, cc = bits.Add64(lo, c, 0)
			hi += cc
			t[j-1], c = lo, hi
		}
		t[n-1], cc = bits.Add64(t[n], c, 0)
		t[n] = t[n+1] + cc
	}
	// t < 2m: one subtraction at most.
	if t[n] != 0 || !less(t[:n], m) {
		sub(t[:n], t[:n], m)
	}
	copy(z, t[:n])
}

// toMont is x·R mod m, for x < m.
func (md *modulus) toMont(x []uint64) []uint64 {
	z := make([]uint64, len(md.m))
	md.mul(z, x, md.rr)
	return z
}

// fromMont is x·R⁻¹ mod m: the plain value of a Montgomery one.
func (md *modulus) fromMont(x []uint64) []uint64 {
	one := make([]uint64, len(md.m))
	one[0] = 1
	z := make([]uint64, len(md.m))
	md.mul(z, x, one)
	return z
}

// exp is x^e (x in Montgomery form, e big-endian bytes), in Montgomery
// form; square and multiply, left to right.
func (md *modulus) exp(x []uint64, e []byte) []uint64 {
	z := append([]uint64(nil), md.one...)
	started := false // squaring 1 is skipped: e = 65537 costs 17 squarings
	for _, b := range e {
		for bit := 7; bit >= 0; bit-- {
			if started {
				md.mul(z, z, z)
			}
			if b>>bit&1 == 1 {
				md.mul(z, z, x)
				started = true
			}
		}
	}
	return z
}

// reduce is x mod m for x of m's length or shorter given as limbs and
// below 2m (a SHA-256 digest modulo P-256's order): one subtraction.
func (md *modulus) reduce(x []uint64) []uint64 {
	z := make([]uint64, len(md.m))
	copy(z, x)
	if !less(z, md.m) {
		sub(z, z, md.m)
	}
	return z
}
