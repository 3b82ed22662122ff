package wire

// DecodeCheckRequest parses a check without reflection: the control
// service's hottest route decodes one per decision, and encoding/json was an
// eighth of its CPU there. It is as strict as the admin API's decoding
// (Decode with strict): keys are matched exactly, and a repeated key, a key
// spelled in another case or an unknown field is ErrSyntax, as is anything
// else it does not take (invalid UTF-8, a wrong type); the caller then
// decodes with Decode for the exact error. Two readers of one body (a proxy
// that takes the first user_id, this service the last) can never disagree.
// What it accepts, encoding/json accepts with the same result (fuzzed).
func DecodeCheckRequest(b []byte, r *CheckRequest) error {
	// Text that is not UTF-8 is refused, not read as U+FFFD: two callers'
	// different bytes would count as one (Decode names the field).
	p := parser{b: b, strictText: true}
	var seen uint32
	return p.document(func(key []byte) error { return p.requestField(key, r, &seen) })
}

// requestFields are the check's keys, in the order of their seen bits.
var requestFields = [...]string{"user_id", "endpoint", "method", "strategy", "limit", "window_seconds", "tier", "tenant",
	"api_key", "cost", "lease", "returned", "spent", "lease_charges", "charge_returned", "client_address", "method_override", "body_bytes", "cost_headers", "override_only", "leased_at", "charge_leased_at", "return_only"}

func (p *parser) requestField(key []byte, r *CheckRequest, seen *uint32) error {
	i := 0
	for i < len(requestFields) && string(key) != requestFields[i] {
		i++
	}
	if i == len(requestFields) || *seen&(1<<i) != 0 {
		return ErrSyntax // unknown, another case, or repeated
	}
	*seen |= 1 << i
	switch {
	case string(key) == "user_id":
		return p.str(&r.UserID)
	case string(key) == "endpoint":
		return p.str(&r.Endpoint)
	case string(key) == "method":
		return p.str(&r.Method)
	case string(key) == "strategy":
		return p.str(&r.Strategy)
	case string(key) == "limit":
		return p.optionalInteger(&r.Limit)
	case string(key) == "window_seconds":
		return p.optionalInteger(&r.WindowSeconds)
	case string(key) == "tier":
		return p.str(&r.Tier)
	case string(key) == "tenant":
		return p.str(&r.Tenant)
	case string(key) == "api_key":
		return p.str(&r.APIKey)
	case string(key) == "cost":
		return p.integer(&r.Cost)
	case string(key) == "lease":
		return p.integer(&r.Lease)
	case string(key) == "returned":
		return p.integer(&r.Returned)
	case string(key) == "spent":
		return p.integer(&r.Spent)
	case string(key) == "lease_charges":
		return p.boolean(&r.LeaseCharges)
	case string(key) == "charge_returned":
		return p.integer(&r.ChargeReturned)
	case string(key) == "leased_at":
		return p.integer(&r.LeasedAt)
	case string(key) == "charge_leased_at":
		return p.integer(&r.ChargeLeasedAt)
	case string(key) == "client_address":
		return p.str(&r.ClientAddress)
	case string(key) == "method_override":
		return p.str(&r.MethodOverride)
	case string(key) == "override_only":
		return p.boolean(&r.OverrideOnly)
	case string(key) == "return_only":
		return p.boolean(&r.ReturnOnly)
	case string(key) == "body_bytes":
		return p.optionalInteger(&r.BodyBytes)
	case string(key) == "cost_headers":
		if p.null() {
			r.CostHeaders = nil
			return nil
		}
		if r.CostHeaders == nil {
			r.CostHeaders = map[string]string{}
		}
		return p.object(func(name []byte) error {
			n := string(name)
			if _, repeated := r.CostHeaders[n]; repeated || p.null() {
				return ErrSyntax // strict: a name once, a string value
			}
			var v string
			if err := p.str(&v); err != nil {
				return err
			}
			r.CostHeaders[n] = v
			return nil
		})
	}
	return ErrSyntax
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
