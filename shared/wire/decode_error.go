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
	return p.document(func(key []byte) error {
		if !ascii(key) {
			return ErrSyntax
		}
		if !EqualFoldASCII(key, "error") {
			return p.skip(0)
		}
		if p.null() {
			return nil
		}
		p.ws()
		return p.object(func(key []byte) error {
			switch {
			case !ascii(key):
				return ErrSyntax
			case EqualFoldASCII(key, "code"):
				return p.str(&e.Code)
			case EqualFoldASCII(key, "details"):
				if p.null() {
					return nil
				}
				p.ws()
				return p.object(func(key []byte) error {
					switch {
					case !ascii(key):
						return ErrSyntax
					case EqualFoldASCII(key, "failure_mode"):
						return p.str(&e.FailureMode)
					}
					return p.skip(1)
				})
			}
			return p.skip(1)
		})
	})
}
