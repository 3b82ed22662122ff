package rules

import (
	"strings"

	"github.com/tollgate-rl/tollgate/shared/ascii"
	"github.com/tollgate-rl/tollgate/shared/fielderr"
)

// CostSource is where a rule's cost_from takes a request's cost from.
type CostSource int

// Cost sources.
const (
	CostFixed          CostSource = iota // the rule's cost (1 by default)
	CostRequestHeader                    // an integer request header
	CostBodyBytes                        // the request body's size
	CostResponseHeader                   // an integer response header, charged after the response
	CostResponseJSON                     // numbers in the response's JSON body (or its last server-sent event carrying them), summed
)

// AfterResponse reports whether the cost is known only once the upstream
// answered: admission spends 1, and the rest is charged after the response.
func (s CostSource) AfterResponse() bool { return s == CostResponseHeader || s == CostResponseJSON }

// Cost source spellings.
const (
	costHeaderPrefix         = "request_header:"
	costBodyBytes            = "request_body_bytes"
	costResponseHeaderPrefix = "response_header:"
	costResponseJSONPrefix   = "response_json:"
)

// Bounds of a response_json cost: at most MaxCostPaths paths summed, each of
// at most MaxCostPathDepth names of 1 to 64 letters, digits, '_' and '-'.
const (
	MaxCostPaths     = 4
	MaxCostPathDepth = 4
)

var jsonNameChars = ascii.NewSet("A-Za-z0-9_-")

// ParseCostFrom reads a cost_from: the source and, for a header, its
// lower-case name; for response_json, the paths as written ("a.b+c.d").
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
	case strings.HasPrefix(s, costResponseHeaderPrefix):
		name := s[len(costResponseHeaderPrefix):]
		if !headerNameChars.Match(name, 1, 64) {
			return 0, "", fielderr.New("cost_from", "%q: a header is named in lower-case letters, digits and '-' (1 to 64)", s)
		}
		return CostResponseHeader, name, nil
	case strings.HasPrefix(s, costResponseJSONPrefix):
		expr := s[len(costResponseJSONPrefix):]
		if _, err := CostPaths(expr); err != nil {
			return 0, "", fielderr.New("cost_from", "%q: %s", s, err.Reason)
		}
		return CostResponseJSON, expr, nil
	}
	return 0, "", fielderr.New("cost_from", "%q must be request_header:<name>, request_body_bytes, response_header:<name> or response_json:<path>[+<path>...]", s)
}

// CostSourceOf reads a cost_from that ParseCostFrom accepted, without
// checking it again or allocating: what the decision path asks of every
// rule of every check. name is the header's name, or the response_json
// expression.
func CostSourceOf(s string) (src CostSource, name string) {
	switch {
	case s == "":
		return CostFixed, ""
	case s == costBodyBytes:
		return CostBodyBytes, ""
	case strings.HasPrefix(s, costHeaderPrefix):
		return CostRequestHeader, s[len(costHeaderPrefix):]
	case strings.HasPrefix(s, costResponseHeaderPrefix):
		return CostResponseHeader, s[len(costResponseHeaderPrefix):]
	case strings.HasPrefix(s, costResponseJSONPrefix):
		return CostResponseJSON, s[len(costResponseJSONPrefix):]
	}
	return CostFixed, ""
}

// CostPaths splits a response_json expression into its paths, each a list
// of object member names: "usage.input_tokens+usage.output_tokens" is
// [[usage input_tokens] [usage output_tokens]].
func CostPaths(expr string) ([][]string, *fielderr.Error) {
	parts := strings.Split(expr, "+")
	if len(parts) > MaxCostPaths {
		return nil, fielderr.New("cost_from", "at most %d paths are summed", MaxCostPaths)
	}
	out := make([][]string, 0, len(parts))
	for _, p := range parts {
		names := strings.Split(p, ".")
		if len(names) > MaxCostPathDepth {
			return nil, fielderr.New("cost_from", "a path is at most %d names deep", MaxCostPathDepth)
		}
		for _, n := range names {
			if !jsonNameChars.Match(n, 1, 64) {
				return nil, fielderr.New("cost_from", "a path is names of 1 to 64 letters, digits, '_' and '-' joined by '.'")
			}
		}
		out = append(out, names)
	}
	return out, nil
}

// UnreportedCost is what a response that reports no cost is charged in all
// (a missing, malformed or negative usage, a stream cut before its last
// event, an encoded body): the rule's cost when set, else its capacity. A
// client that could make the upstream leave its usage out (a stream asked
// for without usage) must not get the request for 1.
func (r *Rule) UnreportedCost() int64 {
	if r.Cost > 0 {
		return r.Cost
	}
	return r.Capacity()
}

// chargeable lists the algorithms that can take a charge below zero: a
// sliding log keeps one entry per admission and is left out.
var chargeable = []Algorithm{FixedWindow, SlidingWindow, TokenBucket, GCRA}
