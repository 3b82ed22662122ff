// Package rules is the rule model and the one matcher both halves use: the
// control service to decide, the filter to key its local cache by rule.
package rules

import (
	"slices"
	"strconv"

	"github.com/tollgate-rl/tollgate/shared/ascii"
	"github.com/tollgate-rl/tollgate/shared/fielderr"
)

// Scope says whose counter a rule spends from.
type Scope string

const (
	ScopeIP       Scope = "ip"       // callers whose address is known (anonymous, API-key and JWT callers), by client address
	ScopeUser     Scope = "user"     // callers with a verified JWT subject, and API-key callers by the key's user
	ScopeAPIKey   Scope = "api_key"  // callers with an API key
	ScopeTenant   Scope = "tenant"   // every caller of one tenant together
	ScopeIdentity Scope = "identity" // every caller, whatever its identity kind
	ScopeGlobal   Scope = "global"   // one counter for everybody
	ScopeEndpoint Scope = "endpoint" // one counter per path for everybody
)

// Scopes lists every scope in the order decisions report them.
var Scopes = []Scope{ScopeGlobal, ScopeEndpoint, ScopeTenant, ScopeIdentity, ScopeUser, ScopeAPIKey, ScopeIP}

// Shared reports whether a scope's counter is shared by callers (global,
// endpoint, tenant): a caller's reset never deletes it, and a caller's
// progressive penalty is not recorded on it.
func (s Scope) Shared() bool { return s == ScopeGlobal || s == ScopeEndpoint || s == ScopeTenant }

// Algorithm names a limiter script.
type Algorithm string

const (
	TokenBucket   Algorithm = "token_bucket"
	SlidingWindow Algorithm = "sliding_window"
	SlidingLog    Algorithm = "sliding_log"
	FixedWindow   Algorithm = "fixed_window"
	GCRA          Algorithm = "gcra"
)

// Algorithms lists every algorithm.
var Algorithms = []Algorithm{TokenBucket, SlidingWindow, SlidingLog, FixedWindow, GCRA}

// ValidAlgorithm reports whether a is a known algorithm.
func ValidAlgorithm(a Algorithm) bool { return slices.Contains(Algorithms, a) }

// Action is what a denial does.
type Action string

const (
	ActionReject  Action = "reject"
	ActionLogOnly Action = "log_only" // count and report, but let the request pass
	// ActionThrottle delays a refused request until the rule admits it,
	// when that is within the service's throttle_max_wait_ms; past it the
	// request is refused as with reject.
	ActionThrottle Action = "throttle"
)

// Period is a calendar period a rule may count instead of a window.
type Period string

// Periods.
const (
	PeriodDay   Period = "day"
	PeriodMonth Period = "month"
)

var tzChars = ascii.NewSet("A-Za-z0-9_+/-")

// validatePeriod checks the window or the calendar period. Whether the time
// zone exists is the service's to check (it loads it; the filter never
// does).
func (r *Rule) validatePeriod() error {
	switch r.Period {
	case "":
		if r.TimeZone != "" {
			return fielderr.New("time_zone", "is only read with a period")
		}
		if r.WindowSeconds < MinWindowSeconds || r.WindowSeconds > MaxWindowSeconds {
			return fielderr.New("window_seconds", "%d must be in %d..%d", r.WindowSeconds, MinWindowSeconds, MaxWindowSeconds)
		}
		return nil
	case PeriodDay, PeriodMonth:
	default:
		return fielderr.New("period", "%q must be %q or %q", r.Period, PeriodDay, PeriodMonth)
	}
	if r.WindowSeconds != 0 {
		return fielderr.New("window_seconds", "is given beside period %q: a rule counts one or the other", r.Period)
	}
	if r.Algorithm != FixedWindow {
		return fielderr.New("algorithm", "%q: a calendar period is counted as a fixed window (algorithm fixed_window)", r.Algorithm)
	}
	if r.TimeZone != "" && !tzChars.Match(r.TimeZone, 1, 64) {
		return fielderr.New("time_zone", "%q is not an IANA time zone name", r.TimeZone)
	}
	return nil
}

// Window bounds, in seconds: a second to an hour.
const (
	MinWindowSeconds = 1
	MaxWindowSeconds = 3600
)

// MaxQuantity bounds a limit, a burst and a cost: the Lua scripts count in
// doubles, which hold whole numbers exactly only up to 2^53. Above it a
// counter would round, and a limit of 2^63 would overflow the arithmetic.
const MaxQuantity = 1<<53 - 1

// MaxPriority bounds a rule's priority either way, so that an operator's
// ordering is never decided by overflow or by a number no one can read.
const MaxPriority = 1_000_000

// Rule is one rate limit.
type Rule struct {
	ID string `json:"id" toml:"id"`
	// Tiers, Methods and Path select requests; an empty list matches all, an
	// empty Path matches every path.
	Tiers   []string `json:"tiers,omitempty" toml:"tiers"`
	Methods []string `json:"methods,omitempty" toml:"methods"`
	Path    string   `json:"path,omitempty" toml:"path"`
	Scope   Scope    `json:"scope" toml:"scope"`
	// Algorithm, Limit and WindowSeconds define the quota; Burst is the bucket
	// size of token_bucket and gcra (0 means Limit).
	Algorithm     Algorithm `json:"algorithm" toml:"algorithm"`
	Limit         int64     `json:"limit" toml:"limit"`
	WindowSeconds int64     `json:"window_seconds" toml:"window_seconds"`
	Burst         int64     `json:"burst,omitempty" toml:"burst"`
	// Cost is what one request spends (0 means 1).
	Cost int64 `json:"cost,omitempty" toml:"cost"`
	// CostFrom takes each request's cost from the request instead:
	// "request_header:<name>" (an integer header; absent: Cost) or
	// "request_body_bytes" (the body's size); or from the response:
	// "response_header:<name>", "response_json:<path>[+<path>...]"
	// (admission spends 1, the rest is charged after the response, and
	// Cost is then what a response that reports nothing is charged; see
	// UnreportedCost). See CostSource.
	CostFrom string `json:"cost_from,omitempty" toml:"cost_from"`
	// EstimateFrom, beside a cost_from read from the response, is what must
	// be left to admit a request: "request_header:<name>" (a max_tokens
	// the client declares). Admission still spends 1; absent, 1.
	EstimateFrom string `json:"estimate_from,omitempty" toml:"estimate_from"`
	// Reserve, beside a cost_from read from the response, is what an
	// admission holds of the counter until its response is charged: a
	// request is admitted only while that much is left (or its estimate,
	// when more), the part its response did not use is handed back, and
	// the rest of a larger cost is charged. It bounds what one caller can
	// have in flight (at most what is left over Reserve requests at once);
	// set it to the most one request can cost (the max_tokens the upstream
	// enforces). 0: 1, the admission alone (nothing held).
	Reserve int64  `json:"reserve,omitempty" toml:"reserve"`
	Action  Action `json:"action,omitempty" toml:"action"`
	// Priority: higher wins within a scope; ties go to the more specific path.
	Priority int `json:"priority,omitempty" toml:"priority"`
	// Enabled defaults to true when absent.
	Enabled *bool `json:"enabled,omitempty" toml:"enabled"`
	// PerEndpoint counts each path separately instead of across the rule.
	PerEndpoint bool `json:"per_endpoint,omitempty" toml:"per_endpoint"`
	// Period counts a calendar day or month (fixed_window, aligned to the
	// period's start in TimeZone, an IANA name; default UTC) instead of
	// WindowSeconds.
	Period   Period `json:"period,omitempty" toml:"period"`
	TimeZone string `json:"time_zone,omitempty" toml:"time_zone"`
	// Response is the rule's own answer to what it refuses (nil: the
	// standard 429 with the RATE_LIMIT_EXCEEDED envelope).
	Response *Response `json:"response,omitempty" toml:"response"`
	// Runtime marks a rule made through the admin API rather than the
	// config file; it is never stored, the service sets it as it lays
	// the runtime rules over the file's. A scope has a winner of each
	// kind (Set.Match).
	Runtime bool `json:"-" toml:"-"`
}

// IsEnabled reports whether the rule takes part in matching.
func (r *Rule) IsEnabled() bool { return r.Enabled == nil || *r.Enabled }

// CountsPerEndpoint reports whether the rule keeps a counter per path: the
// endpoint scope always does.
func (r *Rule) CountsPerEndpoint() bool { return r.PerEndpoint || r.Scope == ScopeEndpoint }

// EffectiveCost is the cost of one request under this rule.
func (r *Rule) EffectiveCost() int64 {
	if r.Cost <= 0 {
		return 1
	}
	return r.Cost
}

// Capacity is the most one counter admits at once: the bucket size (Burst)
// of token_bucket and gcra when set, else Limit. The window algorithms admit
// at most Limit per window whatever Burst says.
func (r *Rule) Capacity() int64 {
	if r.Burst > 0 && (r.Algorithm == TokenBucket || r.Algorithm == GCRA) {
		return r.Burst
	}
	return r.Limit
}

// Name patterns (no regexp: this package compiles into the filter's module).
const (
	idPattern   = "^[a-z0-9][a-z0-9_.-]{0,127}$"
	tierPattern = "^[a-z0-9_]{1,64}$"
)

var (
	idFirst     = ascii.NewSet("a-z0-9")
	idChars     = ascii.NewSet("a-z0-9_.-")
	tierChars   = ascii.NewSet("a-z0-9_")
	methodChars = ascii.NewSet("A-Z")
)

func validID(s string) bool { return len(s) > 0 && idFirst[s[0]] && idChars.Match(s, 1, 128) }

// Rule ids the service gives decisions no configured rule made. The filter
// reads IDExempt in an answer as "not rate limited", so no configured rule
// may take one of these names.
const (
	IDExempt   = "exempt"   // the caller is exempt
	IDOverride = "override" // a per-caller quota set through the admin API
	IDRequest  = "request"  // a limit given in the check itself
)

// Reserved reports whether id is one of the ids no configured rule may take.
func Reserved(id string) bool { return id == IDExempt || id == IDOverride || id == IDRequest }

// ValidMethod reports whether m is an HTTP method as rules name them: 1 to
// 16 upper-case letters. Methods are case-sensitive, so "post" is not POST
// and matches no rule that names POST; it is refused, not counted apart.
func ValidMethod(m string) bool { return methodChars.Match(m, 1, 16) }

// ValidTierName reports whether s is a valid tier name: ^[a-z0-9_]{1,64}$.
func ValidTierName(s string) bool { return tierChars.Match(s, 1, 64) }

// maxListed bounds a rule's tier and method lists.
const maxListed = 32

// Names are what a rule's validation errors call the fields whose names
// differ between the rule's sources: the config file (FileNames) and the
// admin API, which reads one rule a request. Each source's errors carry its
// own names from the start.
type Names struct {
	ID, Path, Tiers string
	// Tier names the i-th entry of Tiers.
	Tier func(i int) string
}

// FileNames are the config file's field names.
var FileNames = Names{ID: "id", Path: "path", Tiers: "tiers", Tier: func(i int) string { return "tiers[" + strconv.Itoa(i) + "]" }}

// Validate checks one rule and returns a *fielderr.Error naming the bad field
// as the config file does.
func (r *Rule) Validate() error { return r.ValidateAs(FileNames) }

// ValidateAs is Validate with the fields named as n says.
func (r *Rule) ValidateAs(n Names) error {
	bad := func(field, format string, args ...any) error {
		return fielderr.New(field, format, args...)
	}
	if !validID(r.ID) {
		return bad(n.ID, "%q must match %s", r.ID, idPattern)
	}
	if Reserved(r.ID) {
		return bad(n.ID, "%q is reserved for decisions no configured rule makes", r.ID)
	}
	// Matching walks these lists on every request.
	if len(r.Tiers) > maxListed {
		return bad(n.Tiers, "at most %d tiers", maxListed)
	}
	if len(r.Methods) > maxListed {
		return bad("methods", "at most %d methods", maxListed)
	}
	for i, t := range r.Tiers {
		if !ValidTierName(t) {
			return bad(n.Tier(i), "%q must match %s", t, tierPattern)
		}
		if slices.Contains(r.Tiers[:i], t) {
			return bad(n.Tier(i), "%q is listed twice", t)
		}
	}
	for i, m := range r.Methods {
		if !ValidMethod(m) {
			return bad("methods["+strconv.Itoa(i)+"]", "%q must be an upper-case HTTP method", m)
		}
		if slices.Contains(r.Methods[:i], m) {
			return bad("methods["+strconv.Itoa(i)+"]", "%q is listed twice", m)
		}
	}
	if r.Path != "" {
		if err := ValidateGlob(r.Path); err != nil {
			return bad(n.Path, "%v", err)
		}
	}
	if !slices.Contains(Scopes, r.Scope) {
		return bad("scope", "%q must be one of %v", r.Scope, Scopes)
	}
	if !ValidAlgorithm(r.Algorithm) {
		return bad("algorithm", "%q must be one of %v", r.Algorithm, Algorithms)
	}
	if r.Limit <= 0 || r.Limit > MaxQuantity {
		return bad("limit", "%d must be in 1..%d", r.Limit, MaxQuantity)
	}
	if err := r.validatePeriod(); err != nil {
		return err
	}
	src, _, err := ParseCostFrom(r.CostFrom)
	if err != nil {
		return err
	}
	if src.AfterResponse() && !slices.Contains(chargeable, r.Algorithm) {
		return bad("algorithm", "%q cannot take a cost charged after the response; use one of %v", r.Algorithm, chargeable)
	}
	if r.EstimateFrom != "" {
		est, _, err := ParseCostFrom(r.EstimateFrom)
		switch {
		case err != nil || est != CostRequestHeader:
			return bad("estimate_from", "%q must be request_header:<name> (lower-case letters, digits and '-')", r.EstimateFrom)
		case !src.AfterResponse():
			return bad("estimate_from", "is read only beside a cost_from of the response (response_header:, response_json:)")
		}
	}
	switch {
	case r.Reserve != 0 && !src.AfterResponse():
		return bad("reserve", "is held only beside a cost_from of the response (response_header:, response_json:)")
	case r.Reserve != 0 && (r.Scope.Shared() || r.Scope == ScopeIP):
		// One caller could hold a counter others share whole, as
		// reserves of requests it keeps open and ends as errors costing
		// 1 each (attack 58 F2: 50 of 50 other users refused).
		return bad("reserve", "is held only on a caller's own counters (scope user, api_key or identity): on a %s counter one caller's requests in flight would hold it for every caller", r.Scope)
	}
	if r.Burst < 0 || r.Burst > MaxQuantity {
		return bad("burst", "%d must be in 0..%d", r.Burst, MaxQuantity)
	}
	if r.Priority < -MaxPriority || r.Priority > MaxPriority {
		return bad("priority", "%d must be in %d..%d", r.Priority, -MaxPriority, MaxPriority)
	}
	if r.Cost < 0 || r.Cost > r.Capacity() {
		return bad("cost", "%d must be in 0..%d (the rule's capacity)", r.Cost, r.Capacity())
	}
	if r.Reserve < 0 || r.Reserve > r.Capacity() {
		// More could never be left: no request would pass.
		return bad("reserve", "%d must be in 0..%d (the rule's capacity)", r.Reserve, r.Capacity())
	}
	switch r.Action {
	case "", ActionReject, ActionLogOnly, ActionThrottle:
	default:
		return bad("action", "%q must be %q, %q or %q", r.Action, ActionReject, ActionLogOnly, ActionThrottle)
	}
	if r.Response != nil {
		if err := r.Response.Validate(); err != nil {
			return err.In("response")
		}
	}
	return nil
}
