// Package headermap is the proxy-wasm wire format of a header map, used by
// both sides of the ABI: a little-endian uint32 count, then a (key length,
// value length) uint32 pair per entry, then each key and each value followed
// by a NUL byte.
package headermap

import (
	"encoding/binary"
	"errors"
	"slices"
)

// ErrMalformed is returned for bytes that are not a header map.
var ErrMalformed = errors.New("headermap: malformed")

// Encode serialises pairs.
func Encode(pairs [][2]string) []byte { return AppendEncode(nil, pairs) }

// AppendEncode appends the serialisation of pairs to dst.
func AppendEncode(dst []byte, pairs [][2]string) []byte {
	size := 4
	for _, p := range pairs {
		size += 8 + len(p[0]) + len(p[1]) + 2
	}
	b := appendLengths(dst, size, len(pairs), func(i int) (int, int) { return len(pairs[i][0]), len(pairs[i][1]) })
	for _, p := range pairs {
		b = append(append(append(append(b, p[0]...), 0), p[1]...), 0)
	}
	return b
}

// Field is a header whose value is bytes: a caller that renders values
// into a reused buffer encodes them without making a string of each.
type Field struct {
	Name  string
	Value []byte
}

// AppendEncodeFields appends the serialisation of fields to dst (the same
// map AppendEncode writes for the same names and values).
func AppendEncodeFields(dst []byte, fields []Field) []byte {
	size := 4
	for _, f := range fields {
		size += 8 + len(f.Name) + len(f.Value) + 2
	}
	b := appendLengths(dst, size, len(fields), func(i int) (int, int) { return len(fields[i].Name), len(fields[i].Value) })
	for _, f := range fields {
		b = append(append(append(append(b, f.Name...), 0), f.Value...), 0)
	}
	return b
}

// appendLengths grows dst by size and appends the map's head: the count n
// and each entry's key and value lengths (lengths(i)).
func appendLengths(dst []byte, size, n int, lengths func(i int) (int, int)) []byte {
	start := len(dst)
	b := slices.Grow(dst, size)[:start+4+8*n]
	head := b[start:]
	binary.LittleEndian.PutUint32(head, uint32(n))
	for i := range n {
		k, v := lengths(i)
		binary.LittleEndian.PutUint32(head[4+8*i:], uint32(k))
		binary.LittleEndian.PutUint32(head[8+8*i:], uint32(v))
	}
	return b
}

// Decode parses a serialised map. Empty input is an empty map.
func Decode(b []byte) ([][2]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) < 4 {
		return nil, ErrMalformed
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n > (len(b)-4)/10 { // every entry takes at least 8 + 2 bytes
		return nil, ErrMalformed
	}
	pairs := make([][2]string, n)
	p := 4 + 8*n
	for i := 0; i < n; i++ {
		kl := int(binary.LittleEndian.Uint32(b[4+8*i:]))
		vl := int(binary.LittleEndian.Uint32(b[8+8*i:]))
		if kl < 0 || vl < 0 || p+kl+1+vl+1 > len(b) || p+kl+1+vl+1 < p {
			return nil, ErrMalformed
		}
		pairs[i][0] = string(b[p : p+kl])
		p += kl + 1
		pairs[i][1] = string(b[p : p+vl])
		p += vl + 1
	}
	return pairs, nil
}

// Walk calls f for every entry of a serialised map without allocating; the
// keys and values are sub-slices (or substrings) of b, so f must copy what it
// keeps from a []byte that will change. It stops early when f returns false.
func Walk[T string | []byte](b T, f func(key, value T) bool) error {
	if len(b) == 0 {
		return nil
	}
	if len(b) < 4 {
		return ErrMalformed
	}
	n := int(le32(b, 0))
	if n > (len(b)-4)/10 {
		return ErrMalformed
	}
	p := 4 + 8*n
	for i := 0; i < n; i++ {
		kl := int(le32(b, 4+8*i))
		vl := int(le32(b, 8+8*i))
		if kl < 0 || vl < 0 || p+kl+1+vl+1 > len(b) || p+kl+1+vl+1 < p {
			return ErrMalformed
		}
		k := b[p : p+kl]
		p += kl + 1
		v := b[p : p+vl]
		p += vl + 1
		if !f(k, v) {
			return nil
		}
	}
	return nil
}

// le32 is the little-endian uint32 at b[i:i+4].
func le32[T string | []byte](b T, i int) uint32 {
	return uint32(b[i]) | uint32(b[i+1])<<8 | uint32(b[i+2])<<16 | uint32(b[i+3])<<24
}
