package wire

import (
	"math"
	"strconv"
)

// Reader reads one JSON document value by value, without reflection: the
// filter's own documents (its configuration, JSON Web Key Sets, token
// headers and claims) are read with it, so the module carries no
// encoding/json. It takes strict JSON only (RFC 8259: no trailing commas,
// no comments, no leading zeros), strings in valid UTF-8 (encoding/json
// would repair them; here they are refused), nesting at most 64 deep. The
// caller says what it expects next; a value of another kind is an error
// for the caller to name (Kind tells which kind it was).
type Reader struct{ p parser }

// NewReader reads b.
func NewReader(b []byte) *Reader { return &Reader{p: parser{b: b}} }

// Kind is the kind of a JSON value.
type Kind byte

// The kinds of JSON values; KindNone is the end of the input or a byte no
// value starts with.
const (
	KindNone Kind = iota
	KindNull
	KindBool
	KindNumber
	KindString
	KindArray
	KindObject
)

// Describe names a kind as an error message would: "a number".
func (k Kind) Describe() string {
	return [...]string{"nothing", "null", "true or false", "a number", "a string", "an array", "an object"}[k]
}

// Kind is the kind of the next value, which is not consumed.
func (r *Reader) Kind() Kind {
	p := &r.p
	p.ws()
	if p.i >= len(p.b) {
		return KindNone
	}
	switch c := p.b[p.i]; {
	case c == '{':
		return KindObject
	case c == '[':
		return KindArray
	case c == '"':
		return KindString
	case c == 't' || c == 'f':
		return KindBool
	case c == 'n':
		return KindNull
	case c == '-' || '0' <= c && c <= '9':
		return KindNumber
	}
	return KindNone
}

// Offset is how many bytes have been read.
func (r *Reader) Offset() int { return r.p.i }

// Null consumes a null, reporting whether there was one.
func (r *Reader) Null() bool { return r.p.null() }

// Object reads an object, calling field with each key (in the order given,
// repeats included); field must consume the value.
func (r *Reader) Object(field func(key string) error) error {
	return r.p.object(func(key []byte) error { return field(string(key)) })
}

// Fields is Object with each key as the reader's bytes, valid only until
// field returns: no string is made of a key the caller does not keep (a
// token's payload of a thousand tiny claims made a thousand).
func (r *Reader) Fields(field func(key []byte) error) error { return r.p.object(field) }

// Array reads an array, calling elem for each element with its index; elem
// must consume it.
func (r *Reader) Array(elem func(i int) error) error {
	p := &r.p
	if !p.next('[') {
		return ErrSyntax
	}
	if p.next(']') {
		return nil
	}
	for i := 0; ; i++ {
		if err := elem(i); err != nil {
			return err
		}
		if p.next(']') {
			return nil
		}
		if !p.next(',') {
			return ErrSyntax
		}
	}
}

// Str reads a string.
func (r *Reader) Str() (string, error) {
	if r.Kind() != KindString {
		return "", ErrSyntax
	}
	var s string
	err := r.p.str(&s)
	return s, err
}

// Bool reads true or false.
func (r *Reader) Bool() (bool, error) {
	if r.Kind() != KindBool {
		return false, ErrSyntax
	}
	var b bool
	err := r.p.boolean(&b)
	return b, err
}

// Int reads a whole number that fits an int64 (no fraction, no exponent).
func (r *Reader) Int() (int64, error) {
	if r.Kind() != KindNumber {
		return 0, ErrSyntax
	}
	var n int64
	err := r.p.integer(&n)
	return n, err
}

// Float reads any number as a float64, as encoding/json does; one beyond
// the float64 range is an error.
func (r *Reader) Float() (float64, error) {
	if r.Kind() != KindNumber {
		return 0, ErrSyntax
	}
	p := &r.p
	start := p.i
	if err := p.number(); err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(string(p.b[start:p.i]), 64)
	if err != nil || math.IsInf(f, 0) {
		return 0, ErrSyntax
	}
	return f, nil
}

// Number consumes a number, refusing what Float refuses (one beyond the
// float64 range), without converting it when it cannot be out of range: no
// exponent and at most 308 digits before any fraction.
func (r *Reader) Number() error {
	if r.Kind() != KindNumber {
		return ErrSyntax
	}
	p := &r.p
	start := p.i
	if err := p.number(); err != nil {
		return err
	}
	lit := p.b[start:p.i]
	whole := len(lit)
	for i, c := range lit {
		switch c {
		case 'e', 'E':
			whole = 1 << 30 // an exponent: convert
		case '.':
			whole = min(whole, i)
		}
	}
	if whole <= 308 {
		return nil
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil || math.IsInf(f, 0) {
		return ErrSyntax
	}
	return nil
}

// Raw consumes the next value and returns its bytes as they are.
func (r *Reader) Raw() ([]byte, error) {
	p := &r.p
	p.ws()
	start := p.i
	if err := p.skip(0); err != nil {
		return nil, err
	}
	return p.b[start:p.i], nil
}

// Skip consumes the next value, whatever it is.
func (r *Reader) Skip() error { return r.p.skip(0) }

// End checks that nothing but white space is left.
func (r *Reader) End() error {
	r.p.ws()
	if r.p.i != len(r.p.b) {
		return ErrSyntax
	}
	return nil
}
