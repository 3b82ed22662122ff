package server

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// decode reads one JSON value into dst. The body is capped at max_body_bytes
// (413 beyond). strict refuses unknown fields, repeated keys and keys in
// another case: every route but a status query's is strict, the decision
// API too (a repeated user_id could be read one way by a proxy in front and
// another here; upgrade the service before the filter when a release adds
// a field). The Content-Type is not checked:
// the body is JSON or it is refused, whatever it claims (curl's -d sends a
// form type).
func (s *Server) decode(c echo.Context, dst any, strict bool) error {
	limit := s.set.Load().maxBodyBytes
	r := c.Request()
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			e := apierr.New(apierr.KindTooLarge, wire.CodePayloadTooLarge, fmt.Sprintf("request body is larger than %d bytes", limit))
			e.Details = map[string]any{"max_bytes": limit}
			return e
		}
		return apierr.Invalid("body", "could not be read")
	}
	return decodeJSON(body, dst, strict)
}

// decodeJSON is decode without HTTP: a pure function, fuzzed.
func decodeJSON(body []byte, dst any, strict bool) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return apierr.Invalid("body", "is empty; a JSON object is required")
	}
	if r, ok := dst.(*wire.CheckRequest); ok {
		// The decision route's fast path; what it does not take (an odd
		// key, a wrong type) is decoded again below for the exact error.
		if wire.DecodeCheckRequest(body, r) == nil {
			return nil
		}
		*r = wire.CheckRequest{}
	}
	if err := wire.Decode(body, dst, strict); err != nil {
		fe, _ := fielderr.As(err) // wire.Decode fails with field errors only
		return apierr.Invalid(cmp.Or(fe.Field, "body"), fe.Reason)
	}
	return nil
}
