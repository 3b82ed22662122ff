// Package siphash is SipHash-2-4 with its 128-bit output (Aumasson and
// Bernstein), a keyed PRF: under a secret key nobody can pick inputs that
// share an output or land in a given slot. The filter keys its lease
// cache's buckets and its token cache with it.
package siphash

import (
	"encoding/binary"
	"math/bits"
)

// Parts is SipHash-2-4-128 of the parts' encoding: for each part, its length as a little-endian
// 64-bit word, then its bytes zero-padded to a whole number of words.
//
// The encoding is injective (the length says where a part ends and how much
// padding follows), so two different lists of parts are two different
// messages, and under a secret key SipHash is a PRF: nobody without the key
// can pick a bucket that lands in a given slot or shares an owner. Keeping
// every part word-aligned lets the hash consume whole words straight from
// the strings, with its state in locals: no tail buffer, no byte-at-a-time
// path, no allocation (this runs on every request).
func Parts(k0, k1 uint64, parts []string) (h0, h1 uint64) {
	s := New(k0, k1)
	s.AddParts(parts)
	return s.Sum()
}

// State is SipHash's state while parts are absorbed; n is the message
// length so far in bytes, always a multiple of 8.
type State struct{ v0, v1, v2, v3, n uint64 }

// New starts a hash under the key (k0, k1).
func New(k0, k1 uint64) State {
	return State{
		v0: k0 ^ 0x736f6d6570736575,
		v1: k1 ^ 0x646f72616e646f6d ^ 0xee, // 0xee: the 128-bit variant
		v2: k0 ^ 0x6c7967656e657261,
		v3: k1 ^ 0x7465646279746573,
	}
}

// AddParts absorbs parts, each as its length word, then its bytes
// zero-padded to whole words, read where they lie. (Not generic over
// []byte: a generic call inlined into another package loses its escape
// facts, and the caller's state and buffers moved to the heap.) One loop
// compresses every word with the rounds inlined, for all the parts a
// caller has at once: compress is too large to inline, and in the Wasm
// build a call cost more than the two rounds it makes (a lease hit hashes
// six parts, a dozen words).
func (s *State) AddParts(parts []string) {
	v0, v1, v2, v3, n := s.v0, s.v1, s.v2, s.v3, s.n
	for _, p := range parts {
		m := uint64(len(p))
		n += 8 + uint64(len(p)+7)&^7
		for i := 0; ; {
			v3 ^= m
			v0, v1, v2, v3 = round(v0, v1, v2, v3)
			v0, v1, v2, v3 = round(v0, v1, v2, v3)
			v0 ^= m
			if i+8 <= len(p) {
				m = load64(p, i)
				i += 8
				continue
			}
			if i < len(p) {
				m = 0
				for j := len(p) - 1; j >= i; j-- {
					m = m<<8 | uint64(p[j])
				}
				i = len(p)
				continue
			}
			break
		}
	}
	s.v0, s.v1, s.v2, s.v3, s.n = v0, v1, v2, v3, n
}

// Sum finishes the hash.
func (s *State) Sum() (h0, h1 uint64) {
	// The message is whole words: the last block is only its length (mod
	// 256, in the top byte), as SipHash pads any message.
	v0, v1, v2, v3 := compress(s.v0, s.v1, s.v2, s.v3, s.n<<56)
	v2 ^= 0xee
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	h0 = v0 ^ v1 ^ v2 ^ v3
	v1 ^= 0xdd
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	h1 = v0 ^ v1 ^ v2 ^ v3
	return h0, h1
}

// load64 is the little-endian word at p[i:i+8].
func load64(p string, i int) uint64 {
	p = p[i : i+8]
	return uint64(p[0]) | uint64(p[1])<<8 | uint64(p[2])<<16 | uint64(p[3])<<24 |
		uint64(p[4])<<32 | uint64(p[5])<<40 | uint64(p[6])<<48 | uint64(p[7])<<56
}

// compress absorbs one message word (two SipRounds).
func compress(v0, v1, v2, v3, m uint64) (uint64, uint64, uint64, uint64) {
	v3 ^= m
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0 ^= m
	return v0, v1, v2, v3
}

func round(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13)
	v1 ^= v0
	v0 = bits.RotateLeft64(v0, 32)
	v2 += v3
	v3 = bits.RotateLeft64(v3, 16)
	v3 ^= v2
	v0 += v3
	v3 = bits.RotateLeft64(v3, 21)
	v3 ^= v0
	v2 += v1
	v1 = bits.RotateLeft64(v1, 17)
	v1 ^= v2
	v2 = bits.RotateLeft64(v2, 32)
	return v0, v1, v2, v3
}

// KeyWords splits a 16-byte hash key into SipHash's two key words.
func KeyWords(k []byte) (k0, k1 uint64) {
	return binary.LittleEndian.Uint64(k[:8]), binary.LittleEndian.Uint64(k[8:16])
}
