//go:build !wasip1

// Decode is the control service's (and tests'): the filter reads its own
// JSON with Reader, without encoding/json, reflect and fmt in its module.

package wire

import (
	"bytes"
	"cmp"
	"encoding"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
)

// ErrUnknownField is the kind of Decode's error for a key the destination
// has no field for.
var ErrUnknownField = errors.New("unknown field")

// Decode reads one JSON value from b into dst, the one way both halves read
// JSON they are sent (the service's requests, the filter's configuration).
// strict refuses a key dst has no field for, named by its path
// ("lease.requests", "checks[2].colour"), a key spelled in another case than
// its field's ("Limit"), and a key given twice in one object: where a typo
// would silently do something else, and where encoding/json would quietly
// pick one of two spellings that a proxy or log in front may read the other
// way. A failure is a *fielderr.Error whose Field is the path of
// the bad value, or "" for the document as a whole (malformed, trailing
// data).
func Decode(b []byte, dst any, strict bool) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(dst); err != nil {
		var pe *time.ParseError
		if errors.As(err, &pe) {
			// time.Time decodes itself, so encoding/json names no field:
			// the first time field holding a string that is not one is it.
			var doc any
			if json.Unmarshal(b, &doc) == nil {
				if path := badTime(doc, reflect.TypeOf(dst), ""); path != "" {
					return fielderr.New(path, "is not a time in RFC 3339 (%s): %q", time.RFC3339, pe.Value)
				}
			}
		}
		return describe(err)
	}
	if dec.More() {
		return fielderr.New("", "has data after the JSON value")
	}
	if field, reason, bad := BadText(b); bad {
		return fielderr.New(field, "%s", reason)
	}
	if strict {
		var doc any
		if err := json.Unmarshal(b, &doc); err != nil {
			return describe(err)
		}
		if path := duplicateKey(json.NewDecoder(bytes.NewReader(b)), ""); path != "" {
			return fielderr.New(path, "is given twice")
		}
		if path := unknownKey(doc, reflect.TypeOf(dst), ""); path != "" {
			return &fielderr.Error{Field: path, Reason: "is not a known field", Kind: ErrUnknownField}
		}
	}
	return nil
}

// describe turns an encoding/json error into the field it is about and a
// reason a person can act on.
func describe(err error) *fielderr.Error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	var pe *time.ParseError
	switch {
	case errors.As(err, &pe):
		// time.Time decodes itself, so encoding/json names no field.
		return fielderr.New("", "holds a time that is not RFC 3339 (%s): %q", time.RFC3339, pe.Value)
	case errors.As(err, &te):
		return fielderr.New(te.Field, "must be %s, not %s", jsonKind(te.Type.Kind()), te.Value)
	case errors.As(err, &se):
		return fielderr.New("", "malformed JSON at byte %d", se.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return fielderr.New("", "malformed JSON (truncated)")
	}
	return fielderr.New("", "malformed JSON")
}

func jsonKind(k reflect.Kind) string {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map, reflect.Pointer:
		return "an object"
	}
	return k.String()
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// unknownKey returns the path of the first key (in sorted order, so the
// answer is stable) of the decoded document v that type t has no field for.
// Keys must be spelled exactly as the tag, else the field's name (encoding/json
// would also take them in another case). A type that decodes itself accepts
// anything.
func unknownKey(v any, t reflect.Type, path string) string {
	return walkDoc(v, t, path, func(_ any, t reflect.Type, path string) (string, bool) {
		switch {
		case t == nil:
			return path, true
		case decodesItself(t):
			return "", true
		}
		return "", false
	})
}

// badTime is the path of the first value of v that dst's type t reads as
// a time.Time and that is a string time.Time refuses ("" when none).
func badTime(v any, t reflect.Type, path string) string {
	return walkDoc(v, t, path, func(v any, t reflect.Type, path string) (string, bool) {
		if t == reflect.TypeFor[time.Time]() {
			if s, ok := v.(string); ok {
				if _, err := time.Parse(time.RFC3339, s); err != nil {
					return cmp.Or(path, "body"), true
				}
			}
			return "", true
		}
		return "", t == nil || decodesItself(t)
	})
}

func decodesItself(t reflect.Type) bool {
	return reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler)
}

// walkDoc walks the decoded document v as type t reads it (keys in sorted
// order), calling visit at each value with its type (nil for a key t has no
// field for) and path; the walk ends at the first visit that says done,
// with its answer.
func walkDoc(v any, t reflect.Type, path string, visit func(v any, t reflect.Type, path string) (string, bool)) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if p, done := visit(v, t, path); done {
		return p
	}
	switch doc := v.(type) {
	case map[string]any:
		switch t.Kind() {
		case reflect.Map:
			for _, k := range slices.Sorted(maps.Keys(doc)) {
				if p := walkDoc(doc[k], t.Elem(), path+"["+strconv.Quote(k)+"]", visit); p != "" {
					return p
				}
			}
		case reflect.Struct:
			fields := jsonFields(t)
			for _, k := range slices.Sorted(maps.Keys(doc)) {
				if p := walkDoc(doc[k], fields[k], join(path, k), visit); p != "" {
					return p
				}
			}
		}
	case []any:
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			for i, item := range doc {
				if p := walkDoc(item, t.Elem(), path+"["+strconv.Itoa(i)+"]", visit); p != "" {
					return p
				}
			}
		}
	}
	return ""
}

// duplicateKey returns the path of the first key that an object of the
// document read by dec holds twice, or "". The document is already known to
// be well formed (json.Unmarshal read it), so a token error only ends the
// walk.
func duplicateKey(dec *json.Decoder, path string) string {
	tok, err := dec.Token()
	if err != nil {
		return ""
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			k, ok := kt.(string)
			if err != nil || !ok {
				return ""
			}
			if seen[k] {
				return join(path, k)
			}
			seen[k] = true
			if p := duplicateKey(dec, join(path, k)); p != "" {
				return p
			}
		}
		_, _ = dec.Token() // '}'
	case json.Delim('['):
		for i := 0; dec.More(); i++ {
			if p := duplicateKey(dec, path+"["+strconv.Itoa(i)+"]"); p != "" {
				return p
			}
		}
		_, _ = dec.Token() // ']'
	}
	return ""
}

// jsonFields maps the JSON names of a struct's fields, those of embedded
// structs promoted, to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for n, ft := range jsonFields(et) {
					if _, shadowed := out[n]; !shadowed {
						out[n] = ft
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// join appends a key to a path: dotted when the key is a plain name,
// quoted in brackets otherwise (a key holding '.', '[', a control...), so a
// path always reads back one way.
func join(path, key string) string {
	if !plainKey(key) {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func plainKey(k string) bool {
	if k == "" || len(k) > 64 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
