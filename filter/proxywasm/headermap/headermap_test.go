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

func FuzzDecode(f *testing.F) {
	f.Add(Encode([][2]string{{"a", "b"}}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		pairs, err := Decode(b)
		if err != nil {
			return
		}
		again, err := Decode(Encode(pairs))
		if err != nil || !reflect.DeepEqual(pairs, again) && len(pairs) > 0 {
			t.Fatalf("re-encoding %v gave %v, %v", pairs, again, err)
		}
	})
}
