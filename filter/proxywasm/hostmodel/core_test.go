package hostmodel

import (
	"testing"

	"github.com/tollgate-rl/tollgate/filter/proxywasm/abi"
)

// Envoy refuses a callout to an unknown cluster or without :method, :path
// or :authority; the core does the same for both fronts.
func TestCalloutNeedsClusterAndPseudoHeaders(t *testing.T) {
	c := NewCore(CoreOptions{Clusters: []string{"svc"}})
	full := [][2]string{{":method", "POST"}, {":path", "/x"}, {":authority", "svc"}}
	if _, st := c.HttpCall("svc", full, nil, 100); st != abi.StatusOK {
		t.Fatalf("complete callout refused: %d", st)
	}
	if _, st := c.HttpCall("other", full, nil, 100); st != abi.StatusBadArgument {
		t.Fatalf("unknown cluster: %d", st)
	}
	for i := range full {
		missing := append(append([][2]string{}, full[:i]...), full[i+1:]...)
		if _, st := c.HttpCall("svc", missing, nil, 100); st != abi.StatusBadArgument {
			t.Fatalf("callout without %s accepted", full[i][0])
		}
	}
	if n := len(c.PendingCallouts()); n != 1 {
		t.Fatalf("%d callouts pending, want 1", n)
	}
}

func TestHeaders(t *testing.T) {
	h := Headers{{"a", "1"}, {"B", "2"}, {"a", "3"}}
	h.Replace("A", "x") // Envoy's setCopy: the first value, in place; the others stay
	if got := h.Values("a"); len(got) != 2 || got[0] != "x" || got[1] != "3" || h[0][1] != "x" {
		t.Fatalf("replace: %v", h)
	}
	h.Remove("a")
	h.Add("a", "x")
	h.Add("C", "y")
	h.Remove("b")
	if h.Value("c") != "y" || h.Value("b") != "" || len(h) != 2 {
		t.Fatalf("add/remove: %v", h)
	}
}
