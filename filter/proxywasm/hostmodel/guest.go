package hostmodel

import (
	"errors"
	"fmt"
)

// Guest is how a front calls the plugin's stream and callout callbacks: the
// compiled module under wazero (VM) or the binding called natively
// (proxytest). Results are the callbacks' i32 answers. The Core runs the
// callbacks in Envoy's order through it, so both fronts share that order.
type Guest interface {
	OnRequestHeaders(contextID, numHeaders uint32, endOfStream bool) (uint32, error)
	OnResponseHeaders(contextID, numHeaders uint32, endOfStream bool) (uint32, error)
	// OnRequestBody runs the request body callback (Continue for a guest
	// that does not export it).
	OnRequestBody(contextID, bodySize uint32, endOfStream bool) (uint32, error)
	// OnResponseBody runs the response body callback (Continue for a
	// guest that does not export it).
	OnResponseBody(contextID, bodySize uint32, endOfStream bool) (uint32, error)
	OnHttpCallResponse(rootID, token, numHeaders, bodySize uint32) error
	// OnStreamEnd runs the callbacks of a finished stream (proxy_on_done,
	// proxy_on_log, proxy_on_delete, those the guest has).
	OnStreamEnd(contextID uint32) error
}

// RequestHeaders runs s's request-headers callback with s effective. If the
// guest answered locally, the answer's headers then pass the filter's
// response path, as in Envoy, before this returns.
func (c *Core) RequestHeaders(g Guest, s *StreamState, endOfStream bool) (Action, error) {
	c.Enter(s.ID)
	r, err := g.OnRequestHeaders(s.ID, uint32(len(s.RequestHeaders)), endOfStream)
	if err != nil {
		return Continue, err
	}
	if Action(r) == Continue {
		s.requestSent = true
	}
	s.requestHeld = Action(r) == Pause && !s.Resumed && s.Local == nil
	return Action(r), c.finishLocal(g, s)
}

// ErrRequestHeld is RequestBody's answer while the guest holds the request
// headers: Envoy passes it no body until it resumes them.
var ErrRequestHeld = errors.New("the filter holds the request headers: Envoy calls no body callback until it resumes them (StopIteration is StopAllIterationAndWatermark)")

// RequestBody passes a chunk of the client's body through s's body
// callback, as ResponseBody does the upstream's: released is what goes on
// upstream (nil while the guest buffers, or holds the end until it
// resumes the request: ReleaseRequest). A guest that answers locally
// meanwhile ends the request (s.Local; Envoy resets the upstream one).
func (c *Core) RequestBody(g Guest, s *StreamState, chunk []byte, endOfStream bool) (act Action, released []byte, err error) {
	if s.requestHeld {
		return Pause, nil, ErrRequestHeld
	}
	return c.body(g, s, &s.RequestBody, &s.Resumed, g.OnRequestBody, chunk, endOfStream)
}

// ReleaseRequest takes what the host holds of s's request body (after the
// guest resumed the request).
func (c *Core) ReleaseRequest(s *StreamState) []byte {
	out := s.RequestBody
	s.RequestBody = nil
	return out
}

// ResponseHeaders runs s's response-headers callback with the upstream's
// headers.
func (c *Core) ResponseHeaders(g Guest, s *StreamState, headers Headers, endOfStream bool) (Action, error) {
	s.ResponseHeaders = LowerKeys(headers)
	s.ResponseResumed = false
	c.Enter(s.ID)
	r, err := g.OnResponseHeaders(s.ID, uint32(len(s.ResponseHeaders)), endOfStream)
	s.responseHeld = err == nil && Action(r) == Pause && !s.ResponseResumed
	return Action(r), err
}

// ErrResponseHeld is ResponseBody's answer while the guest holds the
// response headers: Envoy passes it no body until it resumes them.
var ErrResponseHeld = errors.New("the filter holds the response headers: Envoy calls no body callback until it resumes them (StopIteration is StopAllIterationAndWatermark)")

// ResponseBody passes a chunk of the upstream's body through s's body
// callback, as Envoy does: the guest sees what it buffered before (it
// answered Pause, StopIterationAndBuffer) with the chunk, and released is
// what goes on to the client when it answers Continue (nil while it
// buffers). A guest that buffers until the end and then pauses holds the
// body until it resumes the response (ReleaseResponse). released may be
// chunk itself: the caller copies it before reusing chunk's memory; what the
// host holds it copies.
func (c *Core) ResponseBody(g Guest, s *StreamState, chunk []byte, endOfStream bool) (act Action, released []byte, err error) {
	if s.responseHeld {
		return Pause, nil, ErrResponseHeld
	}
	return c.body(g, s, &s.ResponseBody, &s.ResponseResumed, g.OnResponseBody, chunk, endOfStream)
}

// body passes a chunk of one of s's bodies (held: what the host holds of
// it; resumed: the flag a resume of that direction sets) through the
// guest's callback for it. A local answer meanwhile ends the stream: the
// answer passes the response path and nothing is released.
func (c *Core) body(g Guest, s *StreamState, held *[]byte, resumed *bool, callback func(id, size uint32, end bool) (uint32, error),
	chunk []byte, endOfStream bool) (Action, []byte, error) {
	buffered := len(*held) > 0
	if buffered {
		*held = append(*held, chunk...)
	} else {
		*held = chunk // most streams let it go at once: no copy
	}
	*resumed = false // a resume from now on releases this chunk
	c.Enter(s.ID)
	r, err := callback(s.ID, uint32(len(*held)), endOfStream)
	if err != nil {
		return Continue, nil, err
	}
	local := s.Local != nil && s.ResponseHeaders == nil
	if err := c.finishLocal(g, s); err != nil {
		return Pause, nil, err
	}
	if !local && (Action(r) == Continue || *resumed) {
		out := *held
		*held = nil
		return Continue, out, nil
	}
	if !buffered {
		*held = append([]byte(nil), chunk...) // held: the host owns it
	}
	return Pause, nil, nil
}

// ReleaseResponse takes what the host holds of s's body (after the guest
// resumed the response).
func (c *Core) ReleaseResponse(s *StreamState) []byte {
	out := s.ResponseBody
	s.ResponseBody = nil
	return out
}

// finishLocal sends a pending local reply of s through the response path.
func (c *Core) finishLocal(g Guest, s *StreamState) error {
	if s.Local == nil || s.ResponseHeaders != nil {
		return nil
	}
	s.ResponseHeaders = append(Headers{{":status", fmt.Sprint(s.Local.Status)}}, s.Local.Headers...)
	c.Enter(s.ID)
	if _, err := g.OnResponseHeaders(s.ID, uint32(len(s.ResponseHeaders)), false); err != nil {
		return err
	}
	s.Local.Headers = s.ResponseHeaders[1:]
	return nil
}

// EndStream runs s's end callbacks with s effective and forgets s; its
// callouts stay (see CloseStream).
func (c *Core) EndStream(g Guest, s *StreamState) error {
	c.Enter(s.ID)
	err := g.OnStreamEnd(s.ID)
	c.CloseStream(s.ID)
	return err
}

// Deliver delivers a callout's answer: the callout-response callback on the
// root context, during which the guest reads the answer. A stream the guest
// paused and then answered locally passes its response path too.
func (c *Core) Deliver(g Guest, token uint32, resp CalloutResponse) error {
	co, ok := c.callouts[token]
	if !ok {
		return fmt.Errorf("no pending callout %d", token)
	}
	delete(c.callouts, token)
	c.delivery = &resp // readable until the answer is delivered
	defer func() { c.delivery = nil }()
	c.effective = c.rootID
	if err := g.OnHttpCallResponse(c.rootID, token, uint32(len(resp.Headers)), uint32(len(resp.Body))); err != nil {
		return err
	}
	if s, ok := c.streams[co.ContextID]; ok {
		return c.finishLocal(g, s)
	}
	return nil
}
