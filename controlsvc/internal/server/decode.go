package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// decode reads one JSON value into dst. The body is capped at max_body_bytes
// (413 beyond). strict refuses unknown fields: admin requests, where a typo
// would silently do something else. The decision API accepts them, so that a
// newer filter can talk to an older service. The Content-Type is not checked:
// the body is JSON or it is refused, whatever it claims (curl's -d sends a
// form type).
func (s *Server) decode(c echo.Context, dst any, strict bool) error {
	limit := s.svc.Policy().Config.MaxBodyBytes
	r := c.Request()
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			e := apierr.New(http.StatusRequestEntityTooLarge, wire.CodePayloadTooLarge, fmt.Sprintf("request body is larger than %d bytes", limit))
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
	dec := json.NewDecoder(bytes.NewReader(body))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(dst); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &te):
			field := te.Field
			if field == "" {
				field = "body"
			}
			return apierr.Invalid(field, fmt.Sprintf("must be %s, not %s", jsonKind(te.Type.Kind().String()), te.Value))
		case errors.As(err, &se):
			return apierr.Invalid("body", fmt.Sprintf("malformed JSON at byte %d", se.Offset))
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return apierr.Invalid(field, "is not a known field")
		default:
			return apierr.Invalid("body", "malformed JSON")
		}
	}
	if dec.More() {
		return apierr.Invalid("body", "has data after the JSON object")
	}
	return nil
}

func jsonKind(goKind string) string {
	switch {
	case strings.HasPrefix(goKind, "int"), strings.HasPrefix(goKind, "uint"), strings.HasPrefix(goKind, "float"):
		return "a number"
	case goKind == "string":
		return "a string"
	case goKind == "bool":
		return "true or false"
	case goKind == "slice":
		return "an array"
	case goKind == "struct", goKind == "map", goKind == "ptr":
		return "an object"
	}
	return goKind
}
