package wire

// The charge's codecs, without reflection: the filter sends a charge after
// each response whose cost it read there, inside Wasm. Their fuzz tests hold
// them to encoding/json.

// AppendChargeRequest appends r as JSON, byte for byte what encoding/json
// writes for it.
func AppendChargeRequest(b []byte, r *ChargeRequest) []byte {
	b = append(b, `{"user_id":`...)
	b = appendString(b, r.UserID)
	b = append(b, `,"endpoint":`...)
	b = appendString(b, r.Endpoint)
	b = appendOptString(b, `,"method":`, r.Method)
	b = appendOptString(b, `,"tier":`, r.Tier)
	b = appendOptString(b, `,"tenant":`, r.Tenant)
	b = appendOptString(b, `,"api_key":`, r.APIKey)
	b = appendOptString(b, `,"client_address":`, r.ClientAddress)
	b = appendOptString(b, `,"method_override":`, r.MethodOverride)
	b = append(b, `,"charges":`...)
	if r.Charges == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, c := range r.Charges {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"rule_id":`...)
			b = appendString(b, c.RuleID)
			if c.Cost != nil {
				b = appendInt(b, `,"cost":`, *c.Cost)
			}
			b = appendOptString(b, `,"unreported":`, c.Unreported)
			if c.AtLeast != 0 {
				b = appendInt(b, `,"at_least":`, c.AtLeast)
			}
			b = appendReserved(b, c.Reserved, c.ReservedAt)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendCharges appends a CheckResponse's charges (omitted when empty).
func appendCharges(b []byte, cs []Charge) []byte {
	if len(cs) == 0 {
		return b
	}
	b = append(b, `,"charges":[`...)
	for i, c := range cs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"rule_id":`...)
		b = appendString(b, c.RuleID)
		b = append(b, `,"cost_from":`...)
		b = appendString(b, c.CostFrom)
		b = appendReserved(b, c.Reserved, c.ReservedAt)
		b = append(b, '}')
	}
	return append(b, ']')
}

// appendReserved appends a charge's reserved and reserved_at, each
// omitted when 0.
func appendReserved(b []byte, reserved, at int64) []byte {
	if reserved != 0 {
		b = appendInt(b, `,"reserved":`, reserved)
	}
	if at != 0 {
		b = appendInt(b, `,"reserved_at":`, at)
	}
	return b
}

// array reads a JSON array (or null, calling reset(true)) as encoding/json
// reads one into a slice: reset(false) first, then elem per element.
func (p *parser) array(reset func(null bool), elem func() error) error {
	if p.null() {
		reset(true)
		return nil
	}
	if !p.next('[') {
		return ErrSyntax
	}
	reset(false)
	if p.next(']') {
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		if p.next(']') {
			return nil
		}
		if !p.next(',') {
			return ErrSyntax
		}
	}
}

// grow makes room for one more element as encoding/json does: an element
// of the old backing array is reused (decoded into, merging), a new one is
// zero.
func grow[T any](s []T) []T {
	if len(s) < cap(s) {
		return s[:len(s)+1]
	}
	var zero T
	return append(s, zero)
}

// charges reads a CheckResponse's charges.
func (p *parser) charges(dst *[]Charge) error {
	return objects(p, dst, func(c *Charge, k []byte) error {
		switch {
		case EqualFoldASCII(k, "rule_id"):
			return p.str(&c.RuleID)
		case EqualFoldASCII(k, "cost_from"):
			return p.str(&c.CostFrom)
		case EqualFoldASCII(k, "reserved"):
			return p.integer(&c.Reserved)
		case EqualFoldASCII(k, "reserved_at"):
			return p.integer(&c.ReservedAt)
		}
		return p.skip(0)
	})
}

// objects reads an array of objects into *dst as encoding/json reads one
// into a slice of structs (restart, grow, null elements left as they are),
// calling field for each ASCII key of each element.
func objects[T any](p *parser, dst *[]T, field func(elem *T, key []byte) error) error {
	return p.array(func(null bool) { *dst = restart(*dst, null) }, func() error {
		*dst = grow(*dst)
		c := &(*dst)[len(*dst)-1]
		if p.null() {
			return nil
		}
		return p.object(func(k []byte) error {
			if !ascii(k) {
				return ErrSyntax
			}
			return field(c, k)
		})
	})
}

// restart empties a slice for an array about to be read into it, as
// encoding/json does: null makes it nil, an array (even of no elements) a
// non-nil slice.
func restart[T any](s []T, null bool) []T {
	switch {
	case null:
		return nil
	case s == nil:
		return []T{}
	}
	return s[:0]
}

// DecodeChargeResponse parses a charge's answer as encoding/json would.
func DecodeChargeResponse(b []byte, r *ChargeResponse) error {
	p := parser{b: b}
	return p.document(func(key []byte) error {
		if !ascii(key) {
			return ErrSyntax
		}
		if !EqualFoldASCII(key, "results") {
			return p.skip(0)
		}
		return objects(&p, &r.Results, func(c *ChargeResult, k []byte) error {
			switch {
			case EqualFoldASCII(k, "rule_id"):
				return p.str(&c.RuleID)
			case EqualFoldASCII(k, "charged"):
				return p.integer(&c.Charged)
			case EqualFoldASCII(k, "clamped"):
				return p.integer(&c.Clamped)
			case EqualFoldASCII(k, "limit"):
				return p.integer(&c.Limit)
			case EqualFoldASCII(k, "remaining"):
				return p.integer(&c.Remaining)
			case EqualFoldASCII(k, "reset_at"):
				return p.integer(&c.ResetAt)
			case EqualFoldASCII(k, "strategy"):
				return p.str(&c.Strategy)
			case EqualFoldASCII(k, "window_seconds"):
				return p.integer(&c.WindowSeconds)
			case EqualFoldASCII(k, "error"):
				return p.str(&c.Error)
			}
			return p.skip(0)
		})
	})
}
