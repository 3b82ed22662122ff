package wire

import (
	"encoding/json"
	"reflect"
	"testing"
)

// readAny reads any value with a Reader as encoding/json reads one into an
// any: objects as maps (a repeated key: the last), arrays as slices,
// numbers as float64.
func readAny(r *Reader, depth int) (any, error) {
	if depth > 60 {
		return nil, ErrSyntax
	}
	switch r.Kind() {
	case KindNull:
		r.Null()
		return nil, nil
	case KindBool:
		return r.Bool()
	case KindNumber:
		return r.Float()
	case KindString:
		return r.Str()
	case KindArray:
		out := []any{}
		err := r.Array(func(int) error {
			v, err := readAny(r, depth+1)
			out = append(out, v)
			return err
		})
		return out, err
	case KindObject:
		out := map[string]any{}
		err := r.Object(func(k string) error {
			v, err := readAny(r, depth+1)
			out[k] = v
			return err
		})
		return out, err
	}
	return nil, ErrSyntax
}

func TestReader(t *testing.T) {
	for _, doc := range []string{`{"a":[1,2.5,-3e2,true,null,"x\u00e9"],"b":{"c":{}}}`, ` [] `, `"s"`, `-0`, `{"a":1,"a":2}`} {
		r := NewReader([]byte(doc))
		got, err := readAny(r, 0)
		if err == nil {
			err = r.End()
		}
		var want any
		if jerr := json.Unmarshal([]byte(doc), &want); err != nil || jerr != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %#v (%v), want %#v (%v)", doc, got, err, want, jerr)
		}
	}
	for _, doc := range []string{`{"a":1,}`, `[1,]`, `01`, `1e999`, `{"a" 1}`, "\"\xff\"", `{"a":1} x`, `nul`, `[` + string(make([]byte, 0))} {
		r := NewReader([]byte(doc))
		if _, err := readAny(r, 0); err == nil && r.End() == nil {
			t.Errorf("%q accepted", doc)
		}
	}
	// Int refuses what does not fit an int64 or is not whole.
	for doc, ok := range map[string]bool{`9223372036854775807`: true, `9223372036854775808`: false, `1.5`: false, `1e3`: false, `-1`: true, `"1"`: false} {
		if _, err := NewReader([]byte(doc)).Int(); (err == nil) != ok {
			t.Errorf("Int(%s): %v", doc, err)
		}
	}
	// Number refuses what Float refuses, converting only what could be
	// out of range.
	for _, doc := range []string{`0`, `-12.5`, `1e308`, `1e309`, `-1E+400`, `1.7976931348623157e308`, `1.8e308`, `1e-400`,
		`179769313486231570000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000`,
		`179769313486231580000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000.5`,
		`1000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000`,
		`"1"`, `1.`} {
		_, ferr := NewReader([]byte(doc)).Float()
		if nerr := NewReader([]byte(doc)).Number(); (nerr == nil) != (ferr == nil) {
			t.Errorf("Number(%s): %v, Float: %v", doc, nerr, ferr)
		}
	}
	// Raw returns a value's bytes.
	r := NewReader([]byte(`{"keys": [ {"k":"v"} ] }`))
	var raw []byte
	if err := r.Object(func(string) (err error) { raw, err = r.Raw(); return err }); err != nil || string(raw) != `[ {"k":"v"} ]` {
		t.Fatalf("raw %q %v", raw, err)
	}
}

// FuzzReader: what the Reader accepts, encoding/json accepts with the same
// value.
func FuzzReader(f *testing.F) {
	f.Add([]byte(`{"a":[1,2.5,-3e2,true,null,"x\u00e9\ud83d\ude00"],"b":{"c":{}},"a":0}`))
	f.Add([]byte(`{"exp":1e10,"aud":["x","y"],"sub":"\u0000"}`))
	f.Add([]byte(`[[[[[]]]]]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewReader(b)
		got, err := readAny(r, 0)
		if err != nil || r.End() != nil {
			return
		}
		var want any
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", b, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: got %#v, want %#v", b, got, want)
		}
	})
}

// FuzzNumber: Number accepts what Float accepts, and consumes as much.
func FuzzNumber(f *testing.F) {
	for _, s := range []string{`0`, `-1.5e10`, `1e309`, `1.7976931348623157e308`, `12345678901234567890`, `1.`, `-`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, nr := NewReader(b), NewReader(b)
		_, ferr := fr.Float()
		nerr := nr.Number()
		if (ferr == nil) != (nerr == nil) || fr.Offset() != nr.Offset() {
			t.Fatalf("%q: Number %v at %d, Float %v at %d", b, nerr, nr.Offset(), ferr, fr.Offset())
		}
	})
}
