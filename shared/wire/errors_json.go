//go:build !wasip1

package wire

import "encoding/json"

// Outside the filter's module only (the filter writes its envelopes with
// AppendErrorEnvelope, and encoding/json would carry reflect and fmt into
// it).

// MarshalJSON writes details as {} when there are none: every envelope has
// the same four fields, so a client reads details without a nil check.
func (b ErrorBody) MarshalJSON() ([]byte, error) {
	type plain ErrorBody
	if b.Details == nil {
		b.Details = map[string]any{}
	}
	return json.Marshal(plain(b))
}
