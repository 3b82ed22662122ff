package sigverify

import "math/bits"

// P-256 (FIPS 186-4, D.1.2.3; SEC 2, 2.4.2): y² = x³ - 3x + b over the
// prime p, with the generator G of prime order n.
var (
	p256P  = mustModulus("ffffffff00000001000000000000000000000000ffffffffffffffffffffffff")
	p256N  = mustModulus("ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551")
	p256B  = fieldConst("5ac635d8aa3a93e7b3ebbd55769886bc651d06b0cc53b0f63bce3c3e27d2604b")
	p256Gx = fieldConst("6b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296")
	p256Gy = fieldConst("4fe342e2fe1a7f9b8ee7eb4a7c0f9e162bce33576b315ececbb6406837bf51f5")
	// p - 2 and n - 2: the exponents of Fermat's inverse.
	p256PMinus2 = hexBytes("ffffffff00000001000000000000000000000000fffffffffffffffffffffffd")
	p256NMinus2 = hexBytes("ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc63254f")
)

// hexBytes reads the constants' lower-case hex (encoding/hex would bring
// fmt back into the module).
func hexBytes(s string) []byte {
	out := make([]byte, len(s)/2)
	for i := range out {
		out[i] = unhex(s[2*i])<<4 | unhex(s[2*i+1])
	}
	return out
}

func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}

func mustModulus(s string) *modulus {
	md, ok := newModulus(hexBytes(s))
	if !ok {
		panic("sigverify: bad modulus " + s)
	}
	return md
}

// fieldConst is a constant in Montgomery form modulo p.
func fieldConst(s string) []uint64 { return p256P.toMont(limbs(hexBytes(s))) }

// point is a point in Jacobian coordinates (x = X/Z², y = Y/Z³), each in
// Montgomery form modulo p; Z = 0 is the point at infinity.
type point struct{ x, y, z [4]uint64 }

func (q *point) infinity() bool { return isZero(q.z[:]) }

// P256Key is a P-256 public key for ES256.
type P256Key struct{ q point }

// ParseP256 reads a public key from the big-endian bytes of its affine
// coordinates (32 each); false unless they are below p and on the curve.
func ParseP256(x, y []byte) (*P256Key, bool) {
	if len(x) != 32 || len(y) != 32 {
		return nil, false
	}
	xl, yl := limbs(x), limbs(y)
	if !less(xl, p256P.m) || !less(yl, p256P.m) {
		return nil, false
	}
	k := &P256Key{}
	copy(k.q.x[:], p256P.toMont(xl))
	copy(k.q.y[:], p256P.toMont(yl))
	copy(k.q.z[:], p256P.one)
	if !onCurve(&k.q) {
		return nil, false
	}
	return k, true
}

// onCurve checks y² = x³ - 3x + b for an affine point (Z = 1).
func onCurve(q *point) bool {
	f := p256P
	var y2, x3, t [4]uint64
	f.mul(y2[:], q.y[:], q.y[:])
	f.mul(x3[:], q.x[:], q.x[:])
	f.mul(x3[:], x3[:], q.x[:])
	f.addMod(t[:], q.x[:], q.x[:])
	f.addMod(t[:], t[:], q.x[:])
	f.subMod(x3[:], x3[:], t[:])
	f.addMod(x3[:], x3[:], p256B)
	return equal(y2[:], x3[:])
}

// Verify reports whether sig (r and s, 32 bytes each, big-endian) is k's
// ECDSA signature of the SHA-256 digest (FIPS 186-4, 6.4.2): r and s in
// 1..n-1, and with w = s⁻¹, u1 = e·w and u2 = r·w modulo n, the point
// u1·G + u2·Q is not infinity and its x modulo n is r.
func (k *P256Key) Verify(digest [32]byte, sig []byte) bool {
	if len(sig) != 64 {
		return false
	}
	nm := p256N
	r, s := limbs(sig[:32]), limbs(sig[32:])
	if isZero(r) || isZero(s) || !less(r, nm.m) || !less(s, nm.m) {
		return false
	}
	// The digest is as long as n: e is it modulo n (below 2n, so one
	// subtraction).
	e := nm.reduce(limbs(digest[:]))
	w := nm.exp(nm.toMont(s), p256NMinus2)
	u1 := make([]uint64, 4)
	u2 := make([]uint64, 4)
	nm.mul(u1, nm.toMont(e), w)
	nm.mul(u2, nm.toMont(r), w)
	u1, u2 = nm.fromMont(u1), nm.fromMont(u2)

	var g point
	copy(g.x[:], p256Gx)
	copy(g.y[:], p256Gy)
	copy(g.z[:], p256P.one)
	rp := shamir(u1, &g, u2, &k.q)
	if rp.infinity() {
		return false
	}
	// x = X / Z², back from Montgomery form, modulo n (x < p < 2n).
	zinv := p256Inv(&rp.z)
	var x [4]uint64
	p256Mul(&zinv, &zinv, &zinv)
	p256Mul(&x, &rp.x, &zinv)
	return equal(nm.reduce(p256P.fromMont(x[:])), r)
}

// shamir is a·P + b·Q, the two scalars read together from the top, two
// bits of each at a time (Shamir's trick with a joint window: one
// doubling per bit for both, one addition per two bits).
func shamir(a []uint64, p *point, b []uint64, q *point) point {
	// table[i + 4j] = i·P + j·Q
	var table [16]point
	table[1], table[4] = *p, *q
	table[2], table[8] = double(p), double(q)
	table[3], table[12] = addPoints(&table[2], p), addPoints(&table[8], q)
	for j := 4; j < 16; j += 4 {
		for i := 1; i < 4; i++ {
			table[i+j] = addPoints(&table[i], &table[j])
		}
	}
	var acc point // ∞
	for w := 127; w >= 0; w-- {
		acc = double(&acc)
		acc = double(&acc)
		shift := uint(2*w) % 64
		idx := a[2*w/64]>>shift&3 | (b[2*w/64]>>shift&3)<<2
		if idx != 0 {
			acc = addPoints(&acc, &table[idx])
		}
	}
	return acc
}

// p256Inv is x⁻¹ (Montgomery form modulo p): x^(p-2).
func p256Inv(x *[4]uint64) [4]uint64 {
	var z [4]uint64
	copy(z[:], p256P.one)
	for _, b := range p256PMinus2 {
		for bit := 7; bit >= 0; bit-- {
			p256Mul(&z, &z, &z)
			if b>>bit&1 == 1 {
				p256Mul(&z, &z, x)
			}
		}
	}
	return z
}

// double is 2·P (Jacobian, a = -3: "dbl-2001-b" of the Explicit-Formulas
// Database).
func double(pt *point) point {
	if pt.infinity() {
		return *pt
	}
	var delta, gamma, beta, alpha, t, u [4]uint64
	var out point
	p256Mul(&delta, &pt.z, &pt.z)
	p256Mul(&gamma, &pt.y, &pt.y)
	p256Mul(&beta, &pt.x, &gamma)
	// alpha = 3·(X - delta)·(X + delta)
	p256Sub(&t, &pt.x, &delta)
	p256Add(&u, &pt.x, &delta)
	p256Mul(&alpha, &t, &u)
	p256Add(&t, &alpha, &alpha)
	p256Add(&alpha, &t, &alpha)
	// X3 = alpha² - 8·beta
	p256Add(&t, &beta, &beta) // 2β
	p256Add(&t, &t, &t)       // 4β
	p256Mul(&out.x, &alpha, &alpha)
	p256Sub(&out.x, &out.x, &t)
	p256Sub(&out.x, &out.x, &t)
	// Z3 = (Y + Z)² - gamma - delta
	p256Add(&u, &pt.y, &pt.z)
	p256Mul(&out.z, &u, &u)
	p256Sub(&out.z, &out.z, &gamma)
	p256Sub(&out.z, &out.z, &delta)
	// Y3 = alpha·(4·beta - X3) - 8·gamma²
	p256Sub(&t, &t, &out.x)
	p256Mul(&out.y, &alpha, &t)
	p256Mul(&gamma, &gamma, &gamma)
	p256Add(&gamma, &gamma, &gamma)
	p256Add(&gamma, &gamma, &gamma)
	p256Add(&gamma, &gamma, &gamma)
	p256Sub(&out.y, &out.y, &gamma)
	return out
}

// addPoints is P + Q (Jacobian: "add-2007-bl"), with the cases that
// formula does not cover: either at infinity, P = Q (a doubling) and
// P = -Q (infinity).
func addPoints(p, q *point) point {
	switch {
	case p.infinity():
		return *q
	case q.infinity():
		return *p
	}
	var z1z1, z2z2, u1, u2, s1, s2, h, r, i, j, v, t [4]uint64
	var out point
	p256Mul(&z1z1, &p.z, &p.z)
	p256Mul(&z2z2, &q.z, &q.z)
	p256Mul(&u1, &p.x, &z2z2)
	p256Mul(&u2, &q.x, &z1z1)
	p256Mul(&s1, &p.y, &q.z)
	p256Mul(&s1, &s1, &z2z2)
	p256Mul(&s2, &q.y, &p.z)
	p256Mul(&s2, &s2, &z1z1)
	p256Sub(&h, &u2, &u1)
	p256Sub(&r, &s2, &s1)
	if isZero(h[:]) {
		if isZero(r[:]) {
			return double(p) // the same point
		}
		return point{} // P = -Q
	}
	p256Add(&r, &r, &r)
	// I = (2H)², J = H·I, V = U1·I
	p256Add(&t, &h, &h)
	p256Mul(&i, &t, &t)
	p256Mul(&j, &h, &i)
	p256Mul(&v, &u1, &i)
	// X3 = r² - J - 2V
	p256Mul(&out.x, &r, &r)
	p256Sub(&out.x, &out.x, &j)
	p256Sub(&out.x, &out.x, &v)
	p256Sub(&out.x, &out.x, &v)
	// Y3 = r·(V - X3) - 2·S1·J
	p256Sub(&t, &v, &out.x)
	p256Mul(&out.y, &r, &t)
	p256Mul(&s1, &s1, &j)
	p256Add(&s1, &s1, &s1)
	p256Sub(&out.y, &out.y, &s1)
	// Z3 = ((Z1 + Z2)² - Z1Z1 - Z2Z2)·H
	p256Add(&t, &p.z, &q.z)
	p256Mul(&t, &t, &t)
	p256Sub(&t, &t, &z1z1)
	p256Sub(&t, &t, &z2z2)
	p256Mul(&out.z, &t, &h)
	return out
}

// p256Mul sets z = x·y·R⁻¹ mod p (R = 2^256): modulus.mul for P-256's
// prime, unrolled, with its shape used: -p⁻¹ mod 2^64 is 1, so each
// reduction's multiplier is the low limb itself, and of p's limbs
// (2^64-1, 2^32-1, 0, 2^64-2^32+1) only the second and fourth need a
// multiplication (q·(2^64-1) + q is q·2^64; a zero limb adds nothing).
// Most of a signature check is these.
func p256Mul(z, x, y *[4]uint64) {
	const p1, p3 = 0x00000000ffffffff, 0xffffffff00000001
	var t0, t1, t2, t3, t4, t5 uint64
	for i := range 4 {
		xi := x[i]
		// t += xi·y
		var c, hi, lo, cc uint64
		hi, lo = bits.Mul64(xi, y[0])
		t0, cc = bits.Add64(t0, lo, 0)
		c = hi + cc
		hi, lo = bits.Mul64(xi, y[1])
		lo, cc = bits.Add64(lo, c, 0)
		hi += cc
		t1, cc = bits.Add64(t1, lo, 0)
		c = hi + cc
		hi, lo = bits.Mul64(xi, y[2])
		lo, cc = bits.Add64(lo, c, 0)
		hi += cc
		t2, cc = bits.Add64(t2, lo, 0)
		c = hi + cc
		hi, lo = bits.Mul64(xi, y[3])
		lo, cc = bits.Add64(lo, c, 0)
		hi += cc
		t3, cc = bits.Add64(t3, lo, 0)
		c = hi + cc
		t4, cc = bits.Add64(t4, c, 0)
		t5 = cc
		// t = (t + q·p) / 2^64 with q = t0: the low limb becomes q·2^64.
		q := t0
		c = q
		hi, lo = bits.Mul64(q, p1)
		lo, cc = bits.Add64(lo, c, 0)
		hi += cc
		t0, cc = bits.Add64(t1, lo, 0)
		c = hi + cc
		t1, cc = bits.Add64(t2, c, 0) // p's third limb is 0
		c = cc
		hi, lo = bits.Mul64(q, p3)
		lo, cc = bits.Add64(lo, c, 0)
		hi += cc
		t2, cc = bits.Add64(t3, lo, 0)
		c = hi + cc
		t3, cc = bits.Add64(t4, c, 0)
		t4 = t5 + cc
	}
	// t < 2p: subtract p once if it is not below.
	var b uint64
	r0, b := bits.Sub64(t0, 0xffffffffffffffff, 0)
	r1, b := bits.Sub64(t1, p1, b)
	r2, b := bits.Sub64(t2, 0, b)
	r3, b := bits.Sub64(t3, p3, b)
	_, b = bits.Sub64(t4, 0, b)
	if b == 0 {
		t0, t1, t2, t3 = r0, r1, r2, r3
	}
	z[0], z[1], z[2], z[3] = t0, t1, t2, t3
}

// p256Add sets z = x + y mod p, for x, y < p.
func p256Add(z, x, y *[4]uint64) {
	var c, b uint64
	var t [4]uint64
	t[0], c = bits.Add64(x[0], y[0], 0)
	t[1], c = bits.Add64(x[1], y[1], c)
	t[2], c = bits.Add64(x[2], y[2], c)
	t[3], c = bits.Add64(x[3], y[3], c)
	var r [4]uint64
	r[0], b = bits.Sub64(t[0], 0xffffffffffffffff, 0)
	r[1], b = bits.Sub64(t[1], 0x00000000ffffffff, b)
	r[2], b = bits.Sub64(t[2], 0, b)
	r[3], b = bits.Sub64(t[3], 0xffffffff00000001, b)
	_, b = bits.Sub64(c, 0, b)
	if b == 0 {
		t = r // x + y was p or more
	}
	*z = t
}

// p256Sub sets z = x - y mod p, for x, y < p.
func p256Sub(z, x, y *[4]uint64) {
	var b, c uint64
	var t [4]uint64
	t[0], b = bits.Sub64(x[0], y[0], 0)
	t[1], b = bits.Sub64(x[1], y[1], b)
	t[2], b = bits.Sub64(x[2], y[2], b)
	t[3], b = bits.Sub64(x[3], y[3], b)
	if b != 0 {
		t[0], c = bits.Add64(t[0], 0xffffffffffffffff, 0)
		t[1], c = bits.Add64(t[1], 0x00000000ffffffff, c)
		t[2], c = bits.Add64(t[2], 0, c)
		t[3], _ = bits.Add64(t[3], 0xffffffff00000001, c)
	}
	*z = t
}
