// Package fielderr is the one error type for "field X is bad because Y": the
// control service's config, the rule model, the decision API's request
// validation and the filter's plugin configuration all return it, so a caller
// reads the field and the reason as values, never by parsing error text.
package fielderr

import (
	"strings"
)

// Error names a bad field by its path ("rules[2].limit", "lease.max",
// "user_id") and says why. Field is "" while the code that found the problem
// does not know where its input came from; the caller names it with In.
type Error struct {
	Field  string
	Reason string
	// Kind is the sentinel the error belongs to (identity.ErrInvalid...), for
	// errors.Is; nil when there is none.
	Kind error
}

// New returns the error of field with a formatted reason.
func New(field, format string, args ...any) *Error {
	if len(args) > 0 {
		format = formatArgs(format, args)
	}
	return &Error{Field: field, Reason: format}
}

func (e *Error) Error() string {
	switch {
	case e.Field != "":
		return e.Field + ": " + e.Reason
	case e.Kind != nil:
		return e.Kind.Error() + ": " + e.Reason
	}
	return e.Reason
}

// Unwrap returns Kind.
func (e *Error) Unwrap() error { return e.Kind }

// In returns a copy whose path is prefixed by parent: "rules" + "[2].id" is
// "rules[2].id", "lease" + "max" is "lease.max", and a field-less error
// becomes parent itself.
func (e *Error) In(parent string) *Error {
	out := *e
	switch {
	case e.Field == "":
		out.Field = parent
	case strings.HasPrefix(e.Field, "["):
		out.Field = parent + e.Field
	default:
		out.Field = parent + "." + e.Field
	}
	return &out
}

// As returns err's *Error, if it is or wraps one (as errors.As finds it,
// through Unwrap() error and Unwrap() []error: errors.As itself would link
// reflection's type comparisons into the filter's module, 55 kB with
// their data).
func As(err error) (*Error, bool) {
	for err != nil {
		if fe, ok := err.(*Error); ok {
			return fe, true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if fe, ok := As(e); ok {
					return fe, true
				}
			}
			return nil, false
		default:
			return nil, false
		}
	}
	return nil, false
}

// At places err under field: a field error keeps its reason and kind, with
// its path prefixed by field; any other error becomes field's reason.
func At(field string, err error) *Error {
	if fe, ok := As(err); ok {
		return fe.In(field)
	}
	return &Error{Field: field, Reason: err.Error()}
}
