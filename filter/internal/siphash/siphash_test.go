package siphash

import (
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"
)

// referenceSip is SipHash-2-4-128 of msg, byte by byte as in the paper.
func referenceSip(k0, k1 uint64, msg []byte) [16]byte {
	v0, v1, v2, v3 := k0^0x736f6d6570736575, k1^0x646f72616e646f6d^0xee, k0^0x6c7967656e657261, k1^0x7465646279746573
	i := 0
	for ; i+8 <= len(msg); i += 8 {
		v0, v1, v2, v3 = compress(v0, v1, v2, v3, binary.LittleEndian.Uint64(msg[i:]))
	}
	last := uint64(len(msg)) << 56
	for j := i; j < len(msg); j++ {
		last |= uint64(msg[j]) << (8 * (j - i))
	}
	v0, v1, v2, v3 = compress(v0, v1, v2, v3, last)
	v2 ^= 0xee
	for range 4 {
		v0, v1, v2, v3 = round(v0, v1, v2, v3)
	}
	var out [16]byte
	binary.LittleEndian.PutUint64(out[:8], v0^v1^v2^v3)
	v1 ^= 0xdd
	for range 4 {
		v0, v1, v2, v3 = round(v0, v1, v2, v3)
	}
	binary.LittleEndian.PutUint64(out[8:], v0^v1^v2^v3)
	return out
}

// encodeParts is the message Parts hashes, spelled out.
func encodeParts(parts []string) []byte {
	var b []byte
	for _, p := range parts {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(p)))
		b = append(b, p...)
		b = append(b, make([]byte, (8-len(p)%8)%8)...)
	}
	return b
}

// decodeParts inverts encodeParts: the encoding is injective.
func decodeParts(b []byte) ([]string, bool) {
	var parts []string
	for len(b) > 0 {
		if len(b) < 8 {
			return nil, false
		}
		n := binary.LittleEndian.Uint64(b)
		padded := (n + 7) &^ 7
		if n > uint64(len(b)-8) || padded > uint64(len(b)-8) {
			return nil, false
		}
		parts = append(parts, string(b[8:8+n]))
		b = b[8+padded:]
	}
	return parts, true
}

func TestSipHashVectors(t *testing.T) {
	// SipHash-2-4-128 under key 00..0f of the message 00, 01, ..., n-1:
	// the authors' reference vectors (github.com/veorq/SipHash, vectors.h).
	k0, k1 := KeyWords([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	for n, want := range map[int]string{
		0:  "a3817f04ba25a8e66df67214c7550293",
		1:  "da87c1d86b99af44347659119b22fc45",
		7:  "a1f1ebbed8dbc153c0b84aa61ff08239",
		8:  "3b62a9ba6258f5610f83e264f31497b4",
		15: "5493e99933b0a8117e08ec0f97cfc3d9",
		63: "5150d1772f50834a503e069a973fbd7c",
	} {
		msg := make([]byte, n)
		for i := range msg {
			msg[i] = byte(i)
		}
		if got := referenceSip(k0, k1, msg); hex.EncodeToString(got[:]) != want {
			t.Errorf("%d bytes: %x, want %s", n, got, want)
		}
	}
}

// Parts, fed the parts where they lie, is SipHash of their encoding.
func checkParts(t *testing.T, parts []string) {
	k0, k1 := uint64(0x0706050403020100), uint64(0x0f0e0d0c0b0a0908)
	h0, h1 := Parts(k0, k1, parts)
	var got [16]byte
	binary.LittleEndian.PutUint64(got[:8], h0)
	binary.LittleEndian.PutUint64(got[8:], h1)
	msg := encodeParts(parts)
	if want := referenceSip(k0, k1, msg); got != want {
		t.Fatalf("Parts(%q) = %x, SipHash of its encoding %x", parts, got, want)
	}
	if back, ok := decodeParts(msg); !ok || strings.Join(back, "\xff|") != strings.Join(parts, "\xff|") || len(back) != len(parts) {
		t.Fatalf("encoding of %q decodes to %q", parts, back)
	}
}

func TestPartsIsSipHashOfEncoding(t *testing.T) {
	for _, parts := range [][]string{
		nil, {""}, {"", ""}, {"a"}, {"abcdefg"}, {"abcdefgh"}, {"abcdefghi"},
		{"ip:203.0.113.5", "", "", "", "GET", "/api/v1/items"},
		{strings.Repeat("q", 300), "x"},
	} {
		checkParts(t, parts)
	}
}

func FuzzParts(f *testing.F) {
	f.Add("ip:203.0.113.5", "GET", "/api/v1/items", uint8(3))
	f.Add("", "", "", uint8(0))
	f.Add("abcdefgh", "\x00", "", uint8(2))
	f.Fuzz(func(t *testing.T, a, b, c string, n uint8) {
		parts := []string{a, b, c}[:n%4]
		checkParts(t, parts)
	})
}
