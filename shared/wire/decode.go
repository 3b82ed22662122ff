package wire

import (
	"errors"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"math"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrSyntax is returned by DecodeCheckResponse for bytes it does not accept.
var ErrSyntax = errors.New("wire: malformed decision body")

// DecodeCheckResponse parses a decision body without reflection. The filter
// decodes one per callout inside Wasm, where encoding/json was over a third of
// the callout path. It accepts what encoding/json accepts for this type (keys
// matched without case, unknown fields skipped, null leaving a field as it
// is), except that it refuses strings with invalid UTF-8 instead of repairing
// them; its fuzz test holds it to encoding/json's results.
func DecodeCheckResponse(b []byte, d *CheckResponse) error {
	var dec Decoder
	return dec.DecodeCheckResponse(b, d)
}

// Decoder is DecodeCheckResponse with memory kept from one decision to the
// next, for a reader of many (the filter, one per VM; not safe for
// concurrent use): the buffer strings are unescaped into, and the last few
// short strings read, which a decision repeats (its rule, strategy, tier;
// a caller's identity). Under wazero each allocation costs about as much
// as 300 ns of the decoder's own work: a Decoder takes a decision's from
// nine to about one.
type Decoder struct {
	scratch, keys []byte
	strs          [8]string
	next          int
}

// DecodeCheckResponse is the package's DecodeCheckResponse.
func (dec *Decoder) DecodeCheckResponse(b []byte, d *CheckResponse) error {
	p := parser{b: b, scratch: dec.scratch[:0], keys: dec.keys[:0], strs: dec}
	err := p.document(func(key []byte) error { return p.checkField(key, d) })
	dec.scratch, dec.keys = p.scratch[:0], p.keys[:0]
	return err
}

// maxInterned bounds the strings a Decoder keeps (8 of them at most).
const maxInterned = 64

// str is b as a string: one of the last strings read when b spells it,
// else a new one, kept when short.
func (dec *Decoder) str(b []byte) string {
	if len(b) > maxInterned {
		return string(b)
	}
	for _, s := range dec.strs {
		if s == string(b) { // compared without a copy
			return s
		}
	}
	s := string(b)
	dec.strs[dec.next] = s
	dec.next = (dec.next + 1) % len(dec.strs)
	return s
}

// document parses the whole input as one object, calling field per key.
func (p *parser) document(field func(key []byte) error) error {
	p.ws()
	if err := p.object(field); err != nil {
		return err
	}
	p.ws()
	if p.i != len(p.b) {
		return ErrSyntax
	}
	return nil
}

type parser struct {
	b []byte
	i int
	// scratch holds an unescaped string until it is copied out, so a body
	// costs one buffer, not one per string.
	scratch []byte
	// keys holds the key object passes to its field function.
	keys []byte
	// strs, when set, makes the strings str reads (a Decoder's).
	strs *Decoder
	// strictText refuses (errBadText) a string that is not Unicode text:
	// bytes that are not UTF-8, or half a surrogate pair escaped, which
	// encoding/json (and this parser without it) reads as U+FFFD.
	strictText bool
}

// errBadText is a string that strictText refuses.
var errBadText = errors.New("wire: a string is not UTF-8 text")

func (p *parser) checkField(key []byte, d *CheckResponse) error {
	if !ascii(key) {
		// encoding/json folds some non-ASCII letters into ASCII names (the
		// Kelvin sign, long s); refusing such keys keeps the two in step.
		return ErrSyntax
	}
	// Told apart by length first: a key is compared with the names of its
	// length only, not with every name in turn.
	switch len(key) {
	case 4:
		if EqualFoldASCII(key, "tier") {
			return p.str(&d.Tier)
		}
	case 5:
		switch {
		case EqualFoldASCII(key, "limit"):
			return p.integer(&d.Limit)
		case EqualFoldASCII(key, "quota"):
			return p.integer(&d.Quota)
		case EqualFoldASCII(key, "lease"):
			return p.lease(&d.Lease)
		}
	case 7:
		switch {
		case EqualFoldASCII(key, "allowed"):
			return p.boolean(&d.Allowed)
		case EqualFoldASCII(key, "rule_id"):
			return p.str(&d.RuleID)
		case EqualFoldASCII(key, "refusal"):
			if p.null() {
				d.Refusal = nil
				return nil
			}
			if d.Refusal == nil {
				d.Refusal = &rules.Response{}
			}
			return p.refusal(d.Refusal)
		case EqualFoldASCII(key, "charges"):
			return p.charges(&d.Charges)
		}
	case 8:
		switch {
		case EqualFoldASCII(key, "reset_at"):
			return p.integer(&d.ResetAt)
		case EqualFoldASCII(key, "strategy"):
			return p.str(&d.Strategy)
		case EqualFoldASCII(key, "identity"):
			return p.str(&d.Identity)
		case EqualFoldASCII(key, "degraded"):
			return p.boolean(&d.Degraded)
		case EqualFoldASCII(key, "log_only"):
			return p.boolean(&d.LogOnly)
		}
	case 9:
		if EqualFoldASCII(key, "remaining") {
			return p.integer(&d.Remaining)
		}
	case 11:
		if EqualFoldASCII(key, "retry_after") {
			return p.integer(&d.RetryAfter)
		}
	case 14:
		if EqualFoldASCII(key, "window_seconds") {
			return p.integer(&d.WindowSeconds)
		}
	}
	return p.skip(0)
}

// lease reads a decision's lease object into l.
func (p *parser) lease(l *Lease) error {
	if p.null() {
		return nil
	}
	return p.object(func(k []byte) error {
		if !ascii(k) {
			return ErrSyntax
		}
		switch {
		case EqualFoldASCII(k, "granted"):
			return p.integer(&l.Granted)
		case EqualFoldASCII(k, "ttl_ms"):
			return p.integer(&l.TTLMs)
		case EqualFoldASCII(k, "charge_granted"):
			return p.integer(&l.ChargeGranted)
		case EqualFoldASCII(k, "leased_at"):
			return p.integer(&l.LeasedAt)
		case EqualFoldASCII(k, "charge_leased_at"):
			return p.integer(&l.ChargeLeasedAt)
		}
		return p.skip(0)
	})
}

// DecodeRefusal reads a refusal AppendRefusal wrote (a cached denial's).
func DecodeRefusal(b []byte, r *rules.Response) error {
	p := parser{b: b}
	p.ws()
	if err := p.refusal(r); err != nil {
		return err
	}
	p.ws()
	if p.i != len(p.b) {
		return ErrSyntax
	}
	return nil
}

// refusal reads a rules.Response object into r as encoding/json would
// (into what r already holds: a repeated key merges).
func (p *parser) refusal(r *rules.Response) error {
	return p.object(func(k []byte) error {
		if !ascii(k) {
			return ErrSyntax
		}
		switch {
		case EqualFoldASCII(k, "status"):
			var n int64
			if p.null() {
				return nil
			}
			if err := p.integer(&n); err != nil {
				return err
			}
			r.Status = int(n)
			return nil
		case EqualFoldASCII(k, "body"):
			return p.str(&r.Body)
		case EqualFoldASCII(k, "headers"):
			if p.null() {
				r.Headers = nil
				return nil
			}
			if r.Headers == nil {
				r.Headers = map[string]string{}
			}
			return p.object(func(name []byte) error {
				n := string(name)
				if p.null() {
					r.Headers[n] = "" // encoding/json stores the zero value
					return nil
				}
				v := r.Headers[n]
				if err := p.str(&v); err != nil {
					return err
				}
				r.Headers[n] = v
				return nil
			})
		}
		return p.skip(0)
	})
}

func ascii(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

// EqualFoldASCII reports whether b equals the lower-case ASCII name without
// ASCII case: JSON keys here, header names and parameter keys in the
// filter. It allocates nothing.
func EqualFoldASCII[T string | []byte](b T, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

func (p *parser) ws() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n' || p.b[p.i] == '\r') {
		p.i++
	}
}

func (p *parser) next(c byte) bool {
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *parser) literal(lit string) bool {
	p.ws()
	if len(p.b)-p.i >= len(lit) && string(p.b[p.i:p.i+len(lit)]) == lit {
		p.i += len(lit)
		return true
	}
	return false
}

func (p *parser) null() bool { return p.literal("null") }

// object parses {"key": value, ...}, calling field with each key; field must
// consume the value, and use or copy the key before it does.
func (p *parser) object(field func(key []byte) error) error {
	if !p.next('{') {
		return ErrSyntax
	}
	if p.next('}') {
		return nil
	}
	for {
		p.ws()
		// Every object's keys share one buffer: field reads its key before
		// the value, which may be an object whose keys overwrite it.
		key := p.keys[:0]
		if err := p.rawString(&key); err != nil {
			return err
		}
		p.keys = key
		if !p.next(':') {
			return ErrSyntax
		}
		if err := field(key); err != nil {
			return err
		}
		if p.next('}') {
			return nil
		}
		if !p.next(',') {
			return ErrSyntax
		}
	}
}

func (p *parser) boolean(dst *bool) error {
	switch {
	case p.literal("true"):
		*dst = true
	case p.literal("false"):
		*dst = false
	case p.null():
	default:
		return ErrSyntax
	}
	return nil
}

// integer reads a JSON number that fits an int64; a fraction or exponent is
// refused, as encoding/json refuses it for an integer field.
func (p *parser) integer(dst *int64) error {
	if p.null() {
		return nil
	}
	start := p.i // p.null() has skipped the white space
	digits, ok := p.intPart()
	if !ok {
		return ErrSyntax
	}
	if p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		return ErrSyntax
	}
	// Accumulate in place (ParseInt would need a string: an allocation per
	// field), refusing anything outside int64.
	var n uint64
	for _, c := range p.b[digits:p.i] {
		d := uint64(c - '0')
		if n > (math.MaxUint64-d)/10 {
			return ErrSyntax
		}
		n = n*10 + d
	}
	neg := p.i > start && p.b[start] == '-'
	switch {
	case !neg && n > math.MaxInt64, neg && n > 1<<63:
		return ErrSyntax
	case neg:
		*dst = int64(-n) // two's complement: -(1<<63) stays MinInt64
	default:
		*dst = int64(n)
	}
	return nil
}

func (p *parser) str(dst *string) error {
	if p.null() {
		return nil
	}
	if err := p.rawString(&p.scratch); err != nil {
		return err
	}
	if p.strs != nil {
		*dst = p.strs.str(p.scratch)
		return nil
	}
	*dst = string(p.scratch)
	return nil
}

// rawString reads a JSON string into *dst (reusing its storage), unescaped.
func (p *parser) rawString(dst *[]byte) error {
	p.ws()
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return ErrSyntax
	}
	p.i++
	// Most strings are plain ASCII with no escape: found by one scan and
	// copied at once (a byte at a time, a key or value cost several times
	// as much inside Wasm, where decoding is a fifth of a callout).
	start := p.i
	for p.i < len(p.b) {
		if c := p.b[p.i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' {
			break
		}
		p.i++
	}
	out := append((*dst)[:0], p.b[start:p.i]...)
	if p.i < len(p.b) && p.b[p.i] == '"' {
		p.i++
		*dst = out
		return nil
	}
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			if !utf8.Valid(out) {
				if p.strictText {
					return errBadText
				}
				return ErrSyntax
			}
			*dst = out
			return nil
		case c < 0x20:
			return ErrSyntax
		case c == '\\':
			if p.i+1 >= len(p.b) {
				return ErrSyntax
			}
			e := p.b[p.i+1]
			p.i += 2
			switch e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, ok := p.hex4()
				if !ok {
					return ErrSyntax
				}
				if utf16.IsSurrogate(r) {
					// A high surrogate pairs with a following \u low one;
					// alone, it becomes U+FFFD (as encoding/json does).
					r2 := rune(-1)
					if p.i+1 < len(p.b) && p.b[p.i] == '\\' && p.b[p.i+1] == 'u' {
						save := p.i
						p.i += 2
						var ok2 bool
						if r2, ok2 = p.hex4(); !ok2 {
							return ErrSyntax
						}
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							out = utf8.AppendRune(out, dec)
							continue
						}
						p.i = save
					}
					if p.strictText {
						return errBadText
					}
					r = utf8.RuneError
				}
				out = utf8.AppendRune(out, r)
			default:
				return ErrSyntax
			}
		default:
			out = append(out, c)
			p.i++
		}
	}
	return ErrSyntax
}

func (p *parser) hex4() (rune, bool) {
	if len(p.b)-p.i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.b[p.i : p.i+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	p.i += 4
	return r, true
}

// skip consumes any JSON value (nesting bounded, so hostile depth costs no
// stack).
func (p *parser) skip(depth int) error {
	if depth > 64 {
		return ErrSyntax
	}
	p.ws()
	if p.i >= len(p.b) {
		return ErrSyntax
	}
	switch c := p.b[p.i]; {
	case c == '{':
		return p.object(func([]byte) error { return p.skip(depth + 1) })
	case c == '[':
		p.i++
		if p.next(']') {
			return nil
		}
		for {
			if err := p.skip(depth + 1); err != nil {
				return err
			}
			if p.next(']') {
				return nil
			}
			if !p.next(',') {
				return ErrSyntax
			}
		}
	case c == '"':
		var s []byte
		return p.rawString(&s)
	case p.literal("true"), p.literal("false"), p.null():
		return nil
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number()
	}
	return ErrSyntax
}

// intPart consumes an optional minus and the integer digits of a JSON number
// (no leading zeros); it returns where the digits start.
func (p *parser) intPart() (digits int, ok bool) {
	if p.i < len(p.b) && p.b[p.i] == '-' {
		p.i++
	}
	digits = p.i
	for p.i < len(p.b) && '0' <= p.b[p.i] && p.b[p.i] <= '9' {
		p.i++
	}
	return digits, p.i > digits && (p.b[digits] != '0' || p.i-digits == 1)
}

// number consumes a JSON number of any form (for skipped fields).
func (p *parser) number() error {
	if _, ok := p.intPart(); !ok {
		return ErrSyntax
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		d := p.i
		for p.i < len(p.b) && '0' <= p.b[p.i] && p.b[p.i] <= '9' {
			p.i++
		}
		if p.i == d {
			return ErrSyntax
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		d := p.i
		for p.i < len(p.b) && '0' <= p.b[p.i] && p.b[p.i] <= '9' {
			p.i++
		}
		if p.i == d {
			return ErrSyntax
		}
	}
	return nil
}
