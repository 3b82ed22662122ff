package wire

import (
	"github.com/tollgate-rl/tollgate/shared/rules"
	"strconv"
	"unicode/utf8"
)

// AppendCheckResponse appends d as JSON, byte for byte what encoding/json
// writes for it (HTML-safe escapes included), without reflection: the
// decision route writes one per decision. Its fuzz test holds it to
// json.Marshal.
func AppendCheckResponse(b []byte, d *CheckResponse) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = appendInt(b, `,"limit":`, d.Limit)
	if d.Quota != 0 {
		b = appendInt(b, `,"quota":`, d.Quota)
	}
	b = appendInt(b, `,"remaining":`, d.Remaining)
	b = appendInt(b, `,"reset_at":`, d.ResetAt)
	b = appendInt(b, `,"retry_after":`, d.RetryAfter)
	b = append(b, `,"strategy":`...)
	b = appendString(b, d.Strategy)
	b = appendInt(b, `,"window_seconds":`, d.WindowSeconds)
	b = append(b, `,"rule_id":`...)
	b = appendString(b, d.RuleID)
	b = appendInt(b, `,"lease":{"granted":`, d.Lease.Granted)
	b = appendInt(b, `,"ttl_ms":`, d.Lease.TTLMs)
	if d.Lease.ChargeGranted != 0 {
		b = appendInt(b, `,"charge_granted":`, d.Lease.ChargeGranted)
	}
	if d.Lease.LeasedAt != 0 {
		b = appendInt(b, `,"leased_at":`, d.Lease.LeasedAt)
	}
	if d.Lease.ChargeLeasedAt != 0 {
		b = appendInt(b, `,"charge_leased_at":`, d.Lease.ChargeLeasedAt)
	}
	b = append(b, '}')
	if d.Identity != "" {
		b = append(b, `,"identity":`...)
		b = appendString(b, d.Identity)
	}
	if d.Tier != "" {
		b = append(b, `,"tier":`...)
		b = appendString(b, d.Tier)
	}
	if d.Degraded {
		b = append(b, `,"degraded":true`...)
	}
	if d.LogOnly {
		b = append(b, `,"log_only":true`...)
	}
	if d.Refusal != nil {
		b = AppendRefusal(append(b, `,"refusal":`...), d.Refusal)
	}
	b = appendCharges(b, d.Charges)
	return append(b, '}')
}

// AppendRefusal appends r as encoding/json writes it (header names sorted).
func AppendRefusal(b []byte, r *rules.Response) []byte {
	b = append(b, '{')
	sep := ""
	if r.Status != 0 {
		b = appendInt(b, `"status":`, int64(r.Status))
		sep = ","
	}
	if r.Body != "" {
		b = appendString(append(b, sep+`"body":`...), r.Body)
		sep = ","
	}
	if len(r.Headers) > 0 {
		b = appendStringMap(append(b, sep+`"headers":`...), r.Headers)
	}
	return append(b, '}')
}

func appendInt(b []byte, key string, n int64) []byte {
	return strconv.AppendInt(append(b, key...), n, 10)
}

const hexLower = "0123456789abcdef"

// appendString writes s as encoding/json does: quotes, backslashes and
// controls escaped (\b \f \n \r \t short), <, > and & as \u escapes,
// invalid UTF-8 as \ufffd, U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexLower[c>>4], hexLower[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexLower[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// AppendCheckRequest appends r as JSON, byte for byte what encoding/json
// writes for it (omitted empty fields included): the filter sends one per
// callout, and reflection in the Wasm guest costs what this does not. Its
// fuzz test holds it to json.Marshal and to DecodeCheckRequest.
func AppendCheckRequest(b []byte, r *CheckRequest) []byte {
	b = append(b, `{"user_id":`...)
	b = appendString(b, r.UserID)
	b = append(b, `,"endpoint":`...)
	b = appendString(b, r.Endpoint)
	b = appendOptString(b, `,"method":`, r.Method)
	b = appendOptString(b, `,"strategy":`, r.Strategy)
	if r.Limit != nil {
		b = appendInt(b, `,"limit":`, *r.Limit)
	}
	if r.WindowSeconds != nil {
		b = appendInt(b, `,"window_seconds":`, *r.WindowSeconds)
	}
	b = appendOptString(b, `,"tier":`, r.Tier)
	b = appendOptString(b, `,"tenant":`, r.Tenant)
	b = appendOptString(b, `,"api_key":`, r.APIKey)
	for _, f := range [...]struct {
		key string
		n   int64
	}{{`,"cost":`, r.Cost}, {`,"lease":`, r.Lease}, {`,"returned":`, r.Returned}, {`,"spent":`, r.Spent}} {
		if f.n != 0 {
			b = appendInt(b, f.key, f.n)
		}
	}
	if r.LeaseCharges {
		b = append(b, `,"lease_charges":true`...)
	}
	if r.ChargeReturned != 0 {
		b = appendInt(b, `,"charge_returned":`, r.ChargeReturned)
	}
	if r.LeasedAt != 0 {
		b = appendInt(b, `,"leased_at":`, r.LeasedAt)
	}
	if r.ChargeLeasedAt != 0 {
		b = appendInt(b, `,"charge_leased_at":`, r.ChargeLeasedAt)
	}
	b = appendOptString(b, `,"client_address":`, r.ClientAddress)
	b = appendOptString(b, `,"method_override":`, r.MethodOverride)
	if r.OverrideOnly {
		b = append(b, `,"override_only":true`...)
	}
	if r.ReturnOnly {
		b = append(b, `,"return_only":true`...)
	}
	if r.BodyBytes != nil {
		b = appendInt(b, `,"body_bytes":`, *r.BodyBytes)
	}
	if len(r.CostHeaders) > 0 {
		b = appendStringMap(append(b, `,"cost_headers":`...), r.CostHeaders)
	}
	return append(b, '}')
}

// sortKeys sorts a few map keys in place: an insertion sort, for the
// handful a map here holds (sort.Strings linked pdqsort into the filter's
// module, 7 kB).
func sortKeys(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// appendStringMap writes m as encoding/json does: keys sorted.
func appendStringMap(b []byte, m map[string]string) []byte {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sortKeys(names)
	b = append(b, '{')
	for i, k := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(append(appendString(b, k), ':'), m[k])
	}
	return append(b, '}')
}

// appendOptString writes key and s unless s is empty (omitempty).
func appendOptString(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendString(append(b, key...), s)
}
