package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// DescribeJSONError turns an encoding/json decode error into the field it is
// about ("body" when none) and a reason a person can act on. Both halves
// report bad JSON with it, so they say the same thing.
func DescribeJSONError(err error) (field, reason string) {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field = te.Field
		if field == "" {
			field = "body"
		}
		return field, fmt.Sprintf("must be %s, not %s", jsonKind(te.Type.Kind().String()), te.Value)
	case errors.As(err, &se):
		return "body", fmt.Sprintf("malformed JSON at byte %d", se.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "body", "malformed JSON (truncated)"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`), "is not a known field"
	}
	return "body", "malformed JSON"
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
