// Package apierr is the one error type the control service's handlers return.
// The HTTP layer turns it into the seed envelope in exactly one place.
package apierr

import (
	"net/http"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Error is an error with an HTTP status and an envelope code.
type Error struct {
	Status  int
	Code    string
	Message string
	Details map[string]any
	// Headers are added to the response (Retry-After...).
	Headers map[string]string
	// Err is the cause, for logs; it never reaches the client.
	Err error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Code + ": " + e.Message + ": " + e.Err.Error()
	}
	return e.Code + ": " + e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// New builds an error.
func New(status int, code, message string) *Error {
	return &Error{Status: status, Code: code, Message: message}
}

// Invalid is a 400 INVALID_INPUT naming the bad field.
func Invalid(field, reason string) *Error {
	return &Error{Status: http.StatusBadRequest, Code: wire.CodeInvalidInput, Message: "invalid " + field + ": " + reason,
		Details: map[string]any{"field": field, "reason": reason}}
}

// InvalidLimit is a 400 INVALID_LIMIT naming the bad field.
func InvalidLimit(field, reason string) *Error {
	e := Invalid(field, reason)
	e.Code = wire.CodeInvalidLimit
	return e
}

// Forbidden is a 403 FORBIDDEN: field needs the decision API's credential.
func Forbidden(field string) *Error {
	return &Error{Status: http.StatusForbidden, Code: wire.CodeForbidden,
		Message: field + " may only be sent with the decision API's service credential",
		Details: map[string]any{"field": field}}
}

// ForbiddenBecause is Forbidden with the reason spelled out.
func ForbiddenBecause(field, reason string) *Error {
	e := Forbidden(field)
	e.Message = field + ": " + reason
	return e
}

// Unavailable is a 503 SERVICE_UNAVAILABLE caused by err.
func Unavailable(message string, err error) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Code: wire.CodeServiceUnavailable, Message: message, Err: err}
}

// Body is the envelope's inside, without a request id.
func (e *Error) Body() wire.ErrorBody {
	return wire.ErrorBody{Code: e.Code, Message: e.Message, Details: e.Details}
}
