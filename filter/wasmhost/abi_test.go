package wasmhost

import (
	"testing"

	"github.com/tollgate-rl/tollgate/filter/proxywasm/headermap"
)

func TestCalloutHeadersNeedPseudoHeaders(t *testing.T) {
	full := [][2]string{{":method", "POST"}, {":path", "/x"}, {":authority", "svc"}}
	if _, ok := calloutHeaders(headermap.Encode(full)); !ok {
		t.Fatal("complete callout refused")
	}
	for i := range full {
		missing := append(append([][2]string{}, full[:i]...), full[i+1:]...)
		if _, ok := calloutHeaders(headermap.Encode(missing)); ok {
			t.Fatalf("callout without %s accepted", full[i][0])
		}
	}
	if _, ok := calloutHeaders([]byte{1, 2}); ok {
		t.Fatal("malformed map accepted")
	}
}

func TestHeaders(t *testing.T) {
	h := Headers{{"a", "1"}, {"B", "2"}, {"a", "3"}}
	h.Replace("A", "x")
	if got := h.Values("a"); len(got) != 1 || got[0] != "x" {
		t.Fatalf("replace: %v", h)
	}
	h.Add("C", "y")
	h.Remove("b")
	if h.Value("c") != "y" || h.Value("b") != "" || len(h) != 2 {
		t.Fatalf("add/remove: %v", h)
	}
}
