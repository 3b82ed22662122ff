package leasecache

import (
	"encoding/binary"
	"math/bits"
)

// sip is SipHash-2-4 with a 128-bit output (Aumasson and Bernstein), fed
// incrementally so that a bucket's parts are hashed where they lie, without
// joining them. With a secret key it is a PRF: without the key nobody can
// choose inputs that land in one slot or share an owner. It lives on the
// caller's stack; the hot path allocates nothing.
type sip struct {
	v0, v1, v2, v3 uint64
	tail           [8]byte
	ntail          int
	length         int
}

func newSip(k0, k1 uint64) sip {
	return sip{
		v0: k0 ^ 0x736f6d6570736575,
		v1: k1 ^ 0x646f72616e646f6d ^ 0xee, // 0xee: the 128-bit variant
		v2: k0 ^ 0x6c7967656e657261,
		v3: k1 ^ 0x7465646279746573,
	}
}

func (s *sip) round() {
	s.v0 += s.v1
	s.v1 = bits.RotateLeft64(s.v1, 13)
	s.v1 ^= s.v0
	s.v0 = bits.RotateLeft64(s.v0, 32)
	s.v2 += s.v3
	s.v3 = bits.RotateLeft64(s.v3, 16)
	s.v3 ^= s.v2
	s.v0 += s.v3
	s.v3 = bits.RotateLeft64(s.v3, 21)
	s.v3 ^= s.v0
	s.v2 += s.v1
	s.v1 = bits.RotateLeft64(s.v1, 17)
	s.v1 ^= s.v2
	s.v2 = bits.RotateLeft64(s.v2, 32)
}

func (s *sip) block(m uint64) {
	s.v3 ^= m
	s.round()
	s.round()
	s.v0 ^= m
}

func (s *sip) writeByte(c byte) {
	s.tail[s.ntail] = c
	s.ntail++
	s.length++
	if s.ntail == 8 {
		s.block(binary.LittleEndian.Uint64(s.tail[:]))
		s.ntail = 0
	}
}

func (s *sip) writeString(p string) {
	i := 0
	for ; i < len(p) && s.ntail != 0; i++ {
		s.writeByte(p[i])
	}
	for ; i+8 <= len(p); i += 8 {
		s.block(uint64(p[i]) | uint64(p[i+1])<<8 | uint64(p[i+2])<<16 | uint64(p[i+3])<<24 |
			uint64(p[i+4])<<32 | uint64(p[i+5])<<40 | uint64(p[i+6])<<48 | uint64(p[i+7])<<56)
		s.length += 8
	}
	for ; i < len(p); i++ {
		s.writeByte(p[i])
	}
}

// sum128 finishes the hash; s is not usable afterwards.
func (s *sip) sum128() (h0, h1 uint64) {
	b := uint64(s.length) << 56
	for i := 0; i < s.ntail; i++ {
		b |= uint64(s.tail[i]) << (8 * i)
	}
	s.block(b)
	s.v2 ^= 0xee
	for i := 0; i < 4; i++ {
		s.round()
	}
	h0 = s.v0 ^ s.v1 ^ s.v2 ^ s.v3
	s.v1 ^= 0xdd
	for i := 0; i < 4; i++ {
		s.round()
	}
	h1 = s.v0 ^ s.v1 ^ s.v2 ^ s.v3
	return h0, h1
}
