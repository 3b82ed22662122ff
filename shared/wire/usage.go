package wire

import (
	"math"
	"strconv"

	"github.com/tollgate-rl/tollgate/shared/rules"
)

// Usage is what a response reported at one cost path (rules.CostPaths).
type Usage struct {
	// Found: the path leads to a value; Valid: a number of 0 or more,
	// whose amount is N (a fraction rounded up, anything from 2^53 on
	// MaxUsage).
	Found, Valid bool
	N            int64
}

// MaxUsage is the most one reported number counts for: the counters'
// bound (rules.MaxQuantity, what doubles hold exactly); a charge stops at
// the rule's floor anyway.
const MaxUsage = rules.MaxQuantity

// ReadUsage reads the values at paths in a JSON document (an LLM answer's
// usage object, an SSE event's data) into out (one per path; a repeated
// key: the last). A malformed document is an error; a path that leads
// nowhere, or through something other than objects, is not Found. The walk
// is bounded like every parse here: nesting, and only the members on a
// path are looked into.
func ReadUsage(b []byte, paths [][]string, out []Usage) error {
	p := parser{b: b}
	p.ws()
	if p.i < len(p.b) && p.b[p.i] != '{' {
		if err := p.skip(0); err != nil {
			return err
		}
	} else if err := p.usageObject(paths, 0, out); err != nil {
		return err
	}
	p.ws()
	if p.i != len(p.b) {
		return ErrSyntax
	}
	return nil
}

// usageObject reads an object at depth d of the paths.
func (p *parser) usageObject(paths [][]string, d int, out []Usage) error {
	return p.object(func(key []byte) error {
		var leaves [8]int
		n, deeper := 0, false
		for i, path := range paths {
			switch {
			case d >= len(path) || string(key) != path[d]:
			case d == len(path)-1 && n < len(leaves):
				leaves[n] = i
				n++
			default:
				deeper = true
			}
		}
		p.ws()
		if deeper && p.i < len(p.b) && p.b[p.i] == '{' {
			for _, i := range leaves[:n] {
				out[i] = Usage{Found: true} // an object where a number was wanted
			}
			return p.usageObject(paths, d+1, out)
		}
		if n == 0 {
			return p.skip(d)
		}
		u, err := p.usageValue()
		for _, i := range leaves[:n] {
			out[i] = u
		}
		return err
	})
}

// usageValue reads the value at a path's end: a number as a usage,
// anything else as found but invalid.
func (p *parser) usageValue() (Usage, error) {
	p.ws()
	start := p.i
	if p.i < len(p.b) && (p.b[p.i] == '-' || '0' <= p.b[p.i] && p.b[p.i] <= '9') {
		if err := p.number(); err != nil {
			return Usage{}, err
		}
		return number(p.b[start:p.i]), nil
	}
	if err := p.skip(0); err != nil {
		return Usage{}, err
	}
	return Usage{Found: true}, nil
}

// number reads a JSON number's text as a usage: negative is invalid, a
// fraction rounds up, a huge one counts as MaxUsage.
func number(s []byte) Usage {
	if s[0] == '-' {
		// -0 is 0; anything else below zero is invalid.
		f, err := strconv.ParseFloat(string(s), 64)
		if err != nil || f != 0 {
			return Usage{Found: true}
		}
		return Usage{Found: true, Valid: true}
	}
	if n, err := strconv.ParseInt(string(s), 10, 64); err == nil {
		return Usage{Found: true, Valid: true, N: min(n, MaxUsage)}
	}
	f, err := strconv.ParseFloat(string(s), 64)
	if err != nil && f == 0 {
		return Usage{Found: true}
	}
	// Past int64, or a fraction or exponent: ParseFloat says +Inf for a
	// number too large for a double.
	if f >= MaxUsage || math.IsInf(f, 1) {
		return Usage{Found: true, Valid: true, N: MaxUsage}
	}
	return Usage{Found: true, Valid: true, N: int64(math.Ceil(f))}
}
