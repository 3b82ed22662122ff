package hostmodel

import "strings"

// Action is what a stream callback answered.
type Action uint32

const (
	Continue Action = 0
	Pause    Action = 1
)

// Headers is a header map: ordered pairs, keys compared without case, as
// Envoy keeps them (lower case, pseudo-headers first).
type Headers [][2]string

// sameName compares header names without case; the lengths first, which
// tell most names apart without reading them (maps are searched on every
// call the guest makes).
func sameName(a, b string) bool {
	return len(a) == len(b) && (a == b || strings.EqualFold(a, b))
}

// Get returns the first value of key.
func (h Headers) Get(key string) (string, bool) {
	for _, kv := range h {
		if sameName(kv[0], key) {
			return kv[1], true
		}
	}
	return "", false
}

// Value is Get without the flag.
func (h Headers) Value(key string) string { v, _ := h.Get(key); return v }

// Values returns every value of key.
func (h Headers) Values(key string) []string {
	var out []string
	for _, kv := range h {
		if sameName(kv[0], key) {
			out = append(out, kv[1])
		}
	}
	return out
}

// Remove deletes every value of key.
func (h *Headers) Remove(key string) {
	out := (*h)[:0]
	for _, kv := range *h {
		if !sameName(kv[0], key) {
			out = append(out, kv)
		}
	}
	*h = out
}

// Add appends a value (key lower-cased, as Envoy stores it).
func (h *Headers) Add(key, value string) { *h = append(*h, [2]string{strings.ToLower(key), value}) }

// Replace sets the first value of key in place, or adds it. Like Envoy's
// setCopy (what proxy_replace_header_map_value calls), it leaves any later
// values of key alone: a filter that needs one value must remove the others.
func (h *Headers) Replace(key, value string) {
	for i, kv := range *h {
		if sameName(kv[0], key) {
			(*h)[i][1] = value
			return
		}
	}
	h.Add(key, value)
}

// LocalResponse is an answer the guest sent itself (proxy_send_local_response).
type LocalResponse struct {
	Status  int
	Headers Headers
	Body    []byte
}

// LowerKeys copies h with lower-case keys, with room for the headers a
// filter typically adds (Envoy's header maps grow in place too).
func LowerKeys(h Headers) Headers {
	out := make(Headers, len(h), len(h)+8)
	for i, kv := range h {
		out[i] = [2]string{strings.ToLower(kv[0]), kv[1]}
	}
	return out
}

// Callout is an HTTP call the guest dispatched (proxy_http_call).
type Callout struct {
	Token     uint32
	ContextID uint32
	Cluster   string
	Headers   Headers
	Body      []byte
	TimeoutMs uint32
}

// CalloutResponse is a callout's answer.
type CalloutResponse struct {
	Headers Headers // with ":status"
	Body    []byte
}
