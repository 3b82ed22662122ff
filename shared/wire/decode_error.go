package wire

// ErrorAnswer is what a caller of the decision API acts on in an error
// envelope: its code, and the failure mode the service states when it
// could not decide.
type ErrorAnswer struct {
	Code string
	// FailureMode is details.failure_mode ("" when absent).
	FailureMode string
}

// FailedClosed reports whether the answer is the service's fail_closed
// refusal: it could not decide and refuses, whatever the caller's own mode.
func (e *ErrorAnswer) FailedClosed() bool {
	return e.Code == CodeServiceUnavailable && e.FailureMode == "fail_closed"
}

// RefusedCredential reports whether the answer refuses the caller's
// credential (the filter's decision token) rather than judges the client's
// request.
func (e *ErrorAnswer) RefusedCredential() bool {
	return e.Code == CodeUnauthorized || e.Code == CodeForbidden
}

// DecodeErrorAnswer reads an error envelope's code and failure mode without
// reflection, as DecodeCheckResponse reads a decision: keys matched without
// ASCII case, other fields skipped, the last of a repeated key winning. What
// is not an envelope of that shape is ErrSyntax. Its fuzz test holds it to
// encoding/json.
func DecodeErrorAnswer(b []byte, e *ErrorAnswer) error {
	p := parser{b: b}
	return p.document(p.only("error", 0, func() error {
		return p.nullableObject(func(key []byte) error {
			switch {
			case !ascii(key):
				return ErrSyntax
			case EqualFoldASCII(key, "code"):
				return p.str(&e.Code)
			case EqualFoldASCII(key, "details"):
				return p.nullableObject(p.only("failure_mode", 1, func() error { return p.str(&e.FailureMode) }))
			}
			return p.skip(1)
		})
	}))
}

// only is an object's field callback that reads the key name (matched
// without ASCII case) with read and skips every other key, at depth; a
// non-ASCII key is ErrSyntax, as encoding/json may fold one into a name.
func (p *parser) only(name string, depth int, read func() error) func(key []byte) error {
	return func(key []byte) error {
		switch {
		case !ascii(key):
			return ErrSyntax
		case EqualFoldASCII(key, name):
			return read()
		}
		return p.skip(depth)
	}
}

// nullableObject reads null (nothing) or an object, field by field.
func (p *parser) nullableObject(field func(key []byte) error) error {
	if p.null() {
		return nil
	}
	p.ws()
	return p.object(field)
}
