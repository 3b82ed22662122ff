package headermap

import (
	"reflect"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	in := [][2]string{{":method", "POST"}, {"x-empty", ""}, {"", "v"}}
	out, err := Decode(Encode(in))
	if err != nil || !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip: %v, %v", out, err)
	}
	if out, err := Decode(Encode(nil)); err != nil || len(out) != 0 {
		t.Fatalf("empty: %v, %v", out, err)
	}
}

func TestWalkAgreesWithDecode(t *testing.T) {
	in := [][2]string{{":path", "/x"}, {"a", ""}, {"b", "2"}}
	var got [][2]string
	if err := Walk(Encode(in), func(k, v []byte) bool { got = append(got, [2]string{string(k), string(v)}); return true }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, got) {
		t.Fatalf("walk %v", got)
	}
	n := 0
	Walk(Encode(in), func(k, v []byte) bool { n++; return n < 2 })
	if n != 2 {
		t.Fatalf("walk did not stop: %d", n)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode([][2]string{{"a", "b"}}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		pairs, err := Decode(b)
		if werr := Walk(b, func(k, v []byte) bool { return true }); (werr == nil) != (err == nil) {
			t.Fatalf("Walk and Decode disagree on %q: %v vs %v", b, werr, err)
		}
		if err != nil {
			return
		}
		again, err := Decode(Encode(pairs))
		if err != nil || !reflect.DeepEqual(pairs, again) && len(pairs) > 0 {
			t.Fatalf("re-encoding %v gave %v, %v", pairs, again, err)
		}
	})
}

func TestAppendEncodeAppends(t *testing.T) {
	in := [][2]string{{":path", "/x"}, {"a", ""}}
	got := AppendEncode([]byte("pre"), in)
	if string(got[:3]) != "pre" || string(got[3:]) != string(Encode(in)) {
		t.Fatalf("%q", got)
	}
	if string(Encode(nil)) != "\x00\x00\x00\x00" {
		t.Fatalf("empty map %q", Encode(nil))
	}
}

// AppendEncodeFields writes the map AppendEncode writes for the same
// names and values.
func TestAppendEncodeFields(t *testing.T) {
	for _, pairs := range [][][2]string{nil, {{"a", ""}}, {{"content-type", "application/json"}, {"retry-after", "12"}, {"x", "\x00y"}}} {
		fields := make([]Field, len(pairs))
		for i, p := range pairs {
			fields[i] = Field{p[0], []byte(p[1])}
		}
		if got, want := AppendEncodeFields([]byte("pre"), fields), AppendEncode([]byte("pre"), pairs); string(got) != string(want) {
			t.Errorf("%q: fields %q, pairs %q", pairs, got, want)
		}
	}
}
