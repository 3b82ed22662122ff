// Package apierr is the one error type the control service's layers return to
// a client: what went wrong (a Kind), the envelope code and the message. It
// knows nothing of HTTP: the server maps a Kind to a status, in one place.
package apierr

import (
	"maps"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Kind is the class of a failure, which the server answers with a status.
type Kind int

// Kinds. The zero value is KindInternal: an error built without a kind is the
// service's fault, never blamed on the client.
const (
	KindInternal     Kind = iota // the service failed
	KindInvalid                  // the request is malformed or out of bounds
	KindUnauthorized             // a credential is missing or wrong
	KindForbidden                // the credential does not allow this
	KindNotFound                 // the thing named does not exist
	KindConflict                 // the request clashes with the stored state
	KindTooLarge                 // the body is over the limit
	KindUnavailable              // a dependency (Redis) is not answering
)

// ClientError reports whether the kind blames the request, not the service.
func (k Kind) ClientError() bool { return k != KindInternal && k != KindUnavailable }

// Error is an error for a client: a kind and an envelope code.
type Error struct {
	Kind    Kind
	Code    string
	Message string
	Details map[string]any
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
func New(kind Kind, code, message string) *Error {
	return &Error{Kind: kind, Code: code, Message: message}
}

// Invalid is an INVALID_INPUT naming the bad field.
func Invalid(field, reason string) *Error {
	return &Error{Kind: KindInvalid, Code: wire.CodeInvalidInput, Message: "invalid " + field + ": " + reason,
		Details: map[string]any{"field": field, "reason": reason}}
}

// InvalidValue refuses a well-formed value out of its bounds, with the
// code its field has on every route: INVALID_LIMIT for a limit's numbers,
// INVALID_STRATEGY for an algorithm, INVALID_INPUT for the rest (the check
// API and the admin API answer one bad value alike).
func InvalidValue(field, reason string) *Error {
	e := Invalid(field, reason)
	e.Code = valueCode(field)
	return e
}

// valueCode is the envelope code of a bad value of field.
func valueCode(field string) string {
	switch field {
	case "limit", "window_seconds", "burst", "burst_capacity", "total_limit":
		return wire.CodeInvalidLimit
	case "algorithm", "strategy":
		return wire.CodeInvalidStrategy
	}
	if strings.HasPrefix(field, "endpoints[") { // a tier's endpoint limit
		return wire.CodeInvalidLimit
	}
	return wire.CodeInvalidInput
}

// InvalidAt is Invalid for err found in field: a field error keeps its
// reason (its path placed under field), any other error is the reason.
func InvalidAt(field string, err error) *Error {
	fe := fielderr.At(field, err)
	return Invalid(fe.Field, fe.Reason)
}

// InvalidLimit is an INVALID_LIMIT naming the bad field.
func InvalidLimit(field, reason string) *Error {
	e := Invalid(field, reason)
	e.Code = wire.CodeInvalidLimit
	return e
}

// Forbidden is a FORBIDDEN: field needs the decision API's credential.
func Forbidden(field string) *Error {
	return &Error{Kind: KindForbidden, Code: wire.CodeForbidden,
		Message: field + " may only be sent with the decision API's service credential",
		Details: map[string]any{"field": field}}
}

// ForbiddenBecause is Forbidden with the reason spelled out.
func ForbiddenBecause(field, reason string) *Error {
	e := Forbidden(field)
	e.Message = field + ": " + reason
	return e
}

// Unavailable is a SERVICE_UNAVAILABLE caused by err.
func Unavailable(message string, err error) *Error {
	return &Error{Kind: KindUnavailable, Code: wire.CodeServiceUnavailable, Message: message, Err: err}
}

// Failed is an INTERNAL_ERROR caused by err, which only the log sees.
func Failed(err error) *Error {
	return &Error{Kind: KindInternal, Code: wire.CodeInternal, Message: "internal error", Err: err}
}

// Bounds on what an answer quotes of its input: an error names the bad
// value so a caller can find it, but a 900 KB number must not come back as a
// 1.8 MB answer.
const (
	MaxMessage = 512
	MaxDetail  = 256
)

// Body is the envelope's inside, without a request id. The message and the
// details' strings are cut to MaxMessage and MaxDetail bytes.
func (e *Error) Body() wire.ErrorBody {
	b := wire.ErrorBody{Code: e.Code, Message: clip(e.Message, MaxMessage), Details: e.Details}
	cloned := false
	for k, v := range e.Details {
		if s, ok := v.(string); ok && len(s) > MaxDetail {
			if !cloned { // the error's own map stays whole, for logs
				b.Details, cloned = maps.Clone(e.Details), true
			}
			b.Details[k] = clip(s, MaxDetail)
		}
	}
	return b
}

// clip cuts s to at most n bytes on a character boundary, saying how much
// was left out.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - 32 // room for the note
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "... (" + strconv.Itoa(len(s)) + " bytes)"
}
