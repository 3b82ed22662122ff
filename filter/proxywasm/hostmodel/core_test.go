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

// pauser is a guest that pauses the response headers and counts the body
// callbacks it gets.
type pauser struct{ bodies int }

func (*pauser) OnRequestHeaders(uint32, uint32, bool) (uint32, error) { return uint32(Continue), nil }
func (*pauser) OnRequestBody(uint32, uint32, bool) (uint32, error)    { return uint32(Continue), nil }
func (*pauser) OnResponseHeaders(uint32, uint32, bool) (uint32, error) {
	return uint32(Pause), nil
}
func (p *pauser) OnResponseBody(uint32, uint32, bool) (uint32, error) {
	p.bodies++
	return uint32(Continue), nil
}
func (*pauser) OnHttpCallResponse(uint32, uint32, uint32, uint32) error { return nil }
func (*pauser) OnStreamEnd(uint32) error                                { return nil }

// A filter holding the response headers gets no body until it resumes
// them: Envoy's StopAllIterationAndWatermark (cpp-host's translation of
// the headers' StopIteration). A host that passed the body would hide a
// filter waiting forever for a body Envoy never gives it.
func TestHeldResponseHeadersHoldTheBody(t *testing.T) {
	c := NewCore(CoreOptions{})
	g := &pauser{}
	s := c.OpenStream(Headers{{":path", "/"}}, nil)
	if act, err := c.RequestHeaders(g, s, true); act != Continue || err != nil {
		t.Fatal(act, err)
	}
	if act, err := c.ResponseHeaders(g, s, Headers{{":status", "200"}}, false); act != Pause || err != nil {
		t.Fatal(act, err)
	}
	if _, _, err := c.ResponseBody(g, s, []byte("chunk"), true); err != ErrResponseHeld || g.bodies != 0 {
		t.Fatalf("a body passed to a filter holding the headers: %v, %d callbacks", err, g.bodies)
	}
	c.Enter(s.ID)
	if st := c.ContinueStream(abi.StreamResponse); st != abi.StatusOK {
		t.Fatal(st)
	}
	act, released, err := c.ResponseBody(g, s, []byte("chunk"), true)
	if err != nil || act != Continue || string(released) != "chunk" || g.bodies != 1 {
		t.Fatalf("after the resume: %v %q %v, %d callbacks", act, released, err, g.bodies)
	}
}

// The same for a request: a filter that paused its headers gets none of
// the body until it resumes them; once it let them go, each chunk passes
// its body callback.
func TestHeldRequestHeadersHoldTheBody(t *testing.T) {
	c := NewCore(CoreOptions{})
	g := &pauser{}
	s := c.OpenStream(Headers{{":path", "/"}}, nil)
	held := &holder{}
	if act, err := c.RequestHeaders(held, s, false); act != Pause || err != nil {
		t.Fatal(act, err)
	}
	if _, _, err := c.RequestBody(g, s, []byte("a=1"), true); err != ErrRequestHeld {
		t.Fatalf("a body passed to a filter holding the request headers: %v", err)
	}
	c.Enter(s.ID)
	c.ContinueStream(abi.StreamRequest)
	act, released, err := c.RequestBody(g, s, []byte("a=1"), true)
	if err != nil || act != Continue || string(released) != "a=1" {
		t.Fatalf("after the resume: %v %q %v", act, released, err)
	}
}

// holder pauses the request headers.
type holder struct{ pauser }

func (*holder) OnRequestHeaders(uint32, uint32, bool) (uint32, error) { return uint32(Pause), nil }
