package rules

import (
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/shared/ascii"
	"github.com/tollgate-rl/tollgate/shared/fielderr"
)

// Response is a rule's own answer to the requests it refuses: the status,
// a body rendered from a template, and extra header fields. Retry-After
// and the rate-limit header fields are added as for any refusal.
type Response struct {
	// Status is 429 (the default when 0), 403 or 503.
	Status int `json:"status,omitempty" toml:"status"`
	// Body is a template: each {{name}} of ResponseFields is replaced by
	// the refusal's value (numbers, and names from closed alphabets: the
	// request id, which a client may choose, is cut to letters, digits and
	// ._:-, so nothing a client sends can break out of a JSON string or
	// HTML text). Empty: the standard RATE_LIMIT_EXCEEDED envelope.
	Body string `json:"body,omitempty" toml:"body"`
	// Headers are added to the refusal (content-type among them: the
	// default is application/json).
	Headers map[string]string `json:"headers,omitempty" toml:"headers"`
}

// Bounds of a response: it is stored with the filter's cached denials.
const (
	MaxResponseBody    = 4096
	MaxResponseHeaders = 16
	maxHeaderValue     = 512
)

// ResponseFields are the names a body template may hold, each as
// {{name}}: the decision's numbers, the deciding rule, the request's id.
var ResponseFields = []string{"limit", "remaining", "reset_at", "retry_after", "window_seconds", "rule_id", "strategy", "request_id"}

// ResponseValues are the values a template is rendered with.
type ResponseValues struct {
	Limit, Remaining, ResetAt, RetryAfter, WindowSeconds int64
	RuleID, Strategy, RequestID                          string
}

func (v *ResponseValues) value(name string) string {
	switch name {
	case "limit":
		return strconv.FormatInt(v.Limit, 10)
	case "remaining":
		return strconv.FormatInt(v.Remaining, 10)
	case "reset_at":
		return strconv.FormatInt(v.ResetAt, 10)
	case "retry_after":
		return strconv.FormatInt(v.RetryAfter, 10)
	case "window_seconds":
		return strconv.FormatInt(v.WindowSeconds, 10)
	case "rule_id":
		return v.RuleID
	case "strategy":
		return v.Strategy
	case "request_id":
		return safeID(v.RequestID)
	}
	return ""
}

var idSafe = ascii.NewSet("A-Za-z0-9._:-")

// safeID keeps a request id to letters, digits and ._:- (others become _),
// at most 128 bytes: a client may choose its x-request-id, and the body may
// be JSON or HTML.
func safeID(s string) string {
	if len(s) > 128 {
		s = s[:128]
	}
	if idSafe.Match(s, 0, 128) {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		if !idSafe[c] {
			b[i] = '_'
		}
	}
	return string(b)
}

var (
	headerNameChars = ascii.NewSet("a-z0-9-")
	// Fields the proxy or the refusal itself owns: framing, connection,
	// pseudo-headers, and the ones every refusal sets.
	reservedHeaders = []string{"content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
		"proxy-connection", "host", "retry-after", "set-cookie", "refresh", "clear-site-data", "location"}
)

// MaxResponseEncoded bounds a response as its JSON travels with a denial
// (every '<' is six bytes there): well inside what the filter reads of an
// answer and keeps with a cached denial.
const MaxResponseEncoded = 16 << 10

// encodedLen is about what r's JSON takes: each byte JSON escapes as
// \u00XX counts six.
func (r *Response) encodedLen() int {
	n := len(`{"status":429,"body":"","headers":{}}`)
	size := func(s string) int {
		m := len(s) + 3
		for i := 0; i < len(s); i++ {
			if c := s[i]; c < 0x20 || c == '<' || c == '>' || c == '&' || c == '"' || c == '\\' {
				m += 5
			}
		}
		return m
	}
	n += size(r.Body)
	for k, v := range r.Headers {
		n += size(k) + size(v)
	}
	return n
}

// Validate checks a response, naming the bad field ("status",
// "headers[\"x\"]", "body").
func (r *Response) Validate() *fielderr.Error {
	switch r.Status {
	case 0, 429, 403, 503:
	default:
		return fielderr.New("status", "%d must be 429, 403 or 503", r.Status)
	}
	if len(r.Body) > MaxResponseBody {
		return fielderr.New("body", "is %d bytes; at most %d", len(r.Body), MaxResponseBody)
	}
	if err := checkTemplate(r.Body); err != nil {
		return err
	}
	if len(r.Headers) > MaxResponseHeaders {
		return fielderr.New("headers", "at most %d fields", MaxResponseHeaders)
	}
	for name, v := range r.Headers {
		field := "headers[" + strconv.Quote(name) + "]"
		switch {
		case !headerNameChars.Match(name, 1, 64):
			return fielderr.New(field, "a field name is 1 to 64 lower-case letters, digits and '-'")
		case slices.Contains(reservedHeaders, name) || strings.HasPrefix(name, "x-ratelimit-") || strings.HasPrefix(name, "ratelimit") ||
			strings.HasPrefix(name, "x-tollgate-"):
			return fielderr.New(field, "is set by the proxy or by every refusal; it cannot be given")
		case !ascii.Printable.Match(v, 0, maxHeaderValue):
			return fielderr.New(field, "the value must be printable ASCII, at most %d bytes", maxHeaderValue)
		}
	}
	if n := r.encodedLen(); n > MaxResponseEncoded {
		return fielderr.New("body", "with the headers takes %d bytes as JSON (each <, >, &, \" and \\ takes six); at most %d", n, MaxResponseEncoded)
	}
	return nil
}

// checkTemplate refuses a {{ that does not open a known field.
func checkTemplate(t string) *fielderr.Error {
	for rest := t; ; {
		i := strings.Index(rest, "{{")
		if i < 0 {
			return nil
		}
		rest = rest[i+2:]
		name, after, ok := strings.Cut(rest, "}}")
		if !ok || !slices.Contains(ResponseFields, name) {
			return fielderr.New("body", "{{%s is not one of the fields %v written as {{name}}", cut(rest, 20), ResponseFields)
		}
		rest = after
	}
}

func cut(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// StatusCode is the refusal's status.
func (r *Response) StatusCode() int {
	if r.Status == 0 {
		return 429
	}
	return r.Status
}

// Render is the body with its fields replaced (a template Validate
// accepted).
func (r *Response) Render(v ResponseValues) string {
	var b strings.Builder
	rest := r.Body
	for {
		i := strings.Index(rest, "{{")
		if i < 0 {
			b.WriteString(rest)
			return b.String()
		}
		b.WriteString(rest[:i])
		name, after, ok := strings.Cut(rest[i+2:], "}}")
		if !ok || !slices.Contains(ResponseFields, name) {
			b.WriteString(rest[i:]) // never for a validated template
			return b.String()
		}
		b.WriteString(v.value(name))
		rest = after
	}
}
