package wire

// DecodeCheckRequest parses a check without reflection: the control
// service's hottest route decodes one per decision, and encoding/json was an
// eighth of its CPU there. It accepts a subset of what encoding/json accepts
// for this type, with the same result (keys matched without ASCII case,
// unknown fields skipped, the last of a repeated key winning); anything else
// (non-ASCII keys, invalid UTF-8, a wrong type) is ErrSyntax, and the caller
// decodes with encoding/json instead, for its exact error. Its fuzz test holds
// it to encoding/json's results.
func DecodeCheckRequest(b []byte, r *CheckRequest) error {
	p := parser{b: b}
	return p.document(func(key []byte) error { return p.requestField(key, r) })
}

func (p *parser) requestField(key []byte, r *CheckRequest) error {
	if !ascii(key) {
		return ErrSyntax
	}
	switch {
	case EqualFoldASCII(key, "user_id"):
		return p.str(&r.UserID)
	case EqualFoldASCII(key, "endpoint"):
		return p.str(&r.Endpoint)
	case EqualFoldASCII(key, "method"):
		return p.str(&r.Method)
	case EqualFoldASCII(key, "strategy"):
		return p.str(&r.Strategy)
	case EqualFoldASCII(key, "limit"):
		return p.optionalInteger(&r.Limit)
	case EqualFoldASCII(key, "window_seconds"):
		return p.optionalInteger(&r.WindowSeconds)
	case EqualFoldASCII(key, "tier"):
		return p.str(&r.Tier)
	case EqualFoldASCII(key, "tenant"):
		return p.str(&r.Tenant)
	case EqualFoldASCII(key, "api_key"):
		return p.str(&r.APIKey)
	case EqualFoldASCII(key, "cost"):
		return p.integer(&r.Cost)
	case EqualFoldASCII(key, "lease"):
		return p.integer(&r.Lease)
	case EqualFoldASCII(key, "returned"):
		return p.integer(&r.Returned)
	case EqualFoldASCII(key, "client_address"):
		return p.str(&r.ClientAddress)
	case EqualFoldASCII(key, "method_override"):
		return p.str(&r.MethodOverride)
	}
	return p.skip(0)
}

// optionalInteger reads an integer into a pointer field: null makes it nil,
// as encoding/json does.
func (p *parser) optionalInteger(dst **int64) error {
	if p.null() {
		*dst = nil
		return nil
	}
	var n int64
	if err := p.integer(&n); err != nil {
		return err
	}
	*dst = &n
	return nil
}
