package rules

import (
	"strings"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
)

// CostSource is where a rule's cost_from takes a request's cost from.
type CostSource int

// Cost sources.
const (
	CostFixed         CostSource = iota // the rule's cost (1 by default)
	CostRequestHeader                   // an integer request header
	CostBodyBytes                       // the request body's size
)

// Cost source spellings.
const (
	costHeaderPrefix = "request_header:"
	costBodyBytes    = "request_body_bytes"
)

// ParseCostFrom reads a cost_from: the source and, for a header, its
// lower-case name.
func ParseCostFrom(s string) (CostSource, string, *fielderr.Error) {
	switch {
	case s == "":
		return CostFixed, "", nil
	case s == costBodyBytes:
		return CostBodyBytes, "", nil
	case strings.HasPrefix(s, costHeaderPrefix):
		name := s[len(costHeaderPrefix):]
		if !headerNameChars.Match(name, 1, 64) {
			return 0, "", fielderr.New("cost_from", "%q: a header is named in lower-case letters, digits and '-' (1 to 64)", s)
		}
		return CostRequestHeader, name, nil
	case strings.HasPrefix(s, "response_header:"), strings.HasPrefix(s, "response_json:"):
		return 0, "", fielderr.New("cost_from", "%q: costs known only after the response are not supported yet", s)
	}
	return 0, "", fielderr.New("cost_from", "%q must be request_header:<name> or request_body_bytes", s)
}
