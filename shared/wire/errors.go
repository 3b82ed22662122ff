package wire

// Error codes of the envelope: one per kind of failure a client can act on,
// fixed by the API contract (DESIGN.md) and shared by the filter and service.
const (
	CodeInvalidInput       = "INVALID_INPUT"
	CodeInvalidLimit       = "INVALID_LIMIT"
	CodeInvalidStrategy    = "INVALID_STRATEGY"
	CodeNotFound           = "NOT_FOUND"
	CodeRateLimited        = "RATE_LIMITED"
	CodeInternal           = "INTERNAL_ERROR"
	CodeServiceUnavailable = "SERVICE_UNAVAILABLE"
	CodeUnauthorized       = "UNAUTHORIZED"
	CodePayloadTooLarge    = "PAYLOAD_TOO_LARGE"
	CodeMethodNotAllowed   = "METHOD_NOT_ALLOWED"
	// CodeReadOnly: the thing comes from the config file; change it there.
	CodeReadOnly = "READ_ONLY"
	// CodeConflict: other changes kept coming first; send it again.
	CodeConflict = "CONFLICT"
	// CodeForbidden: the caller may not say this (a field only the filter,
	// holding the decision API's service credential, may send).
	CodeForbidden = "FORBIDDEN"
	// CodeIdempotencyKeyReused: a batch idempotency key came back with
	// another request.
	CodeIdempotencyKeyReused = "IDEMPOTENCY_KEY_REUSED"

	CodeInvalidAPIKey     = "INVALID_API_KEY"
	CodeMissingAPIKey     = "MISSING_API_KEY"
	CodeAPIKeyRevoked     = "API_KEY_REVOKED"
	CodeAPIKeyExpired     = "API_KEY_EXPIRED"
	CodeRateLimitExceeded = "RATE_LIMIT_EXCEEDED"
)

// ErrorEnvelope is the body of every Tollgate error response.
type ErrorEnvelope struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody is the inside of the envelope.
type ErrorBody struct {
	Code      string         `json:"code"`
	Message   string         `json:"message"`
	Details   map[string]any `json:"details"`
	RequestID string         `json:"request_id,omitempty"`
}
