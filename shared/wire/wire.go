// Package wire holds the JSON bodies that cross the filter ↔ controlsvc boundary
// and the error envelope every Tollgate HTTP error uses. Both halves import these
// types, so a field renamed here is renamed on both sides at once.
package wire

import "github.com/tollgate-rl/tollgate/shared/rules"

// Paths of the decision API.
const (
	PathCheck      = "/v1/rate-limit/check"
	PathBatchCheck = "/v1/rate-limit/batch-check"
	PathStatus     = "/v1/rate-limit/status" // + "/{id}/{endpoint}"
	PathReset      = "/v1/rate-limit/reset"
	PathConfig     = "/v1/rate-limit/config"
	PathCharge     = "/v1/rate-limit/charge"
)

// CheckRequest asks whether one request may pass. Only UserID and Endpoint are
// required; everything else has a documented default.
type CheckRequest struct {
	// UserID is the caller: a canonical identity ("user:alice", "key:k_1",
	// "ip:192.0.2.1") or a bare user id, read as "user:<id>".
	UserID string `json:"user_id"`
	// Endpoint is the request path, starting with "/" (no query string).
	Endpoint string `json:"endpoint"`
	// Method is the HTTP method; empty matches rules that name no method.
	Method string `json:"method,omitempty"`
	// Strategy, Limit and WindowSeconds override the configured rule for this
	// check (the plain API shape); without Limit the configured rules decide. They are
	// pointers so that an explicit 0 is told apart from "absent" and refused.
	Strategy      string `json:"strategy,omitempty"`
	Limit         *int64 `json:"limit,omitempty"`
	WindowSeconds *int64 `json:"window_seconds,omitempty"`
	// Tier and Tenant come from the caller's verified JWT claims.
	Tier   string `json:"tier,omitempty"`
	Tenant string `json:"tenant,omitempty"`
	// APIKey is the key as presented by the client. The service hashes it and
	// never stores or logs it raw.
	APIKey string `json:"api_key,omitempty"`
	// Cost is the number of tokens this request spends (default 1).
	Cost int64 `json:"cost,omitempty"`
	// Lease is how many extra tokens the caller wants for its local cache.
	Lease int64 `json:"lease,omitempty"`
	// Returned hands back unused tokens of an earlier lease for the same bucket.
	Returned int64 `json:"returned,omitempty"`
	// Spent reports the lease tokens of this bucket the caller spent locally
	// since its last check: usage counts requests made, not tokens leased.
	Spent int64 `json:"spent,omitempty"`
	// LeaseCharges says the caller can spend a lease under a rule whose
	// cost the response reports: it reads the response of every request it
	// admits on one and pays that cost from Lease.ChargeGranted first. A
	// caller that cannot is granted no lease under such a rule (admitting
	// on it would leave the response's cost unpaid).
	LeaseCharges bool `json:"lease_charges,omitempty"`
	// ChargeReturned hands back unused ChargeGranted tokens of an earlier
	// lease for the same bucket.
	ChargeReturned int64 `json:"charge_returned,omitempty"`
	// LeasedAt and ChargeLeasedAt are the Lease.LeasedAt and
	// Lease.ChargeLeasedAt of the lease Returned and ChargeReturned come
	// from, sent back as they came: a counter credits a hand-back only
	// when its stamp falls in its current stretch, and none without one.
	LeasedAt       int64 `json:"leased_at,omitempty"`
	ChargeLeasedAt int64 `json:"charge_leased_at,omitempty"`
	// ClientAddress is the address of a caller identified otherwise (a
	// verified JWT subject), so that per-address rules count it too.
	ClientAddress string `json:"client_address,omitempty"`
	// MethodOverride is the method a method-override header
	// (X-HTTP-Method-Override...) names, where the upstream may honour it:
	// rules on either method count the request.
	MethodOverride string `json:"method_override,omitempty"`
	// OverrideOnly counts only the rules MethodOverride selects and Method
	// does not, with no lease: the second check of a request whose
	// override came in its form body, after its headers were checked under
	// Method (each other rule counted it then).
	OverrideOnly bool `json:"override_only,omitempty"`
	// ReturnOnly hands back Returned and ChargeReturned (and reports Spent)
	// of a lease that ended unspent, and counts nothing: the filter's
	// return of a bucket no request came back to (a lease's leftover went
	// back only with its bucket's next check, and a client asking many
	// paths a few times each spent its tier's total on leases no one
	// used).
	ReturnOnly bool `json:"return_only,omitempty"`
	// ChargeNow is set in process only (the gRPC rate limit service,
	// whose caller reports no response): a rule whose cost a response
	// reports spends at admission what an unreported response costs, as
	// no charge follows. Never read from the wire.
	ChargeNow bool `json:"-"`
	// BodyBytes is the request body's size (its Content-Length, 0 without a
	// body; nil when unknown, a chunked body): what a rule's cost_from
	// request_body_bytes spends.
	BodyBytes *int64 `json:"body_bytes,omitempty"`
	// CostHeaders are the values of the request headers the filter is
	// configured to send (cost_headers), by lower-case name: what a rule's
	// cost_from request_header:<name> spends.
	CostHeaders map[string]string `json:"cost_headers,omitempty"`
}

// Lease is the part of a decision the filter may spend locally.
type Lease struct {
	// Granted tokens were consumed in Redis on the caller's behalf.
	Granted int64 `json:"granted"`
	// TTLMs is how long the caller may spend them.
	TTLMs int64 `json:"ttl_ms"`
	// ChargeGranted tokens of the answer's one Charge rule were consumed
	// too (asked for with LeaseCharges): a request admitted on the lease
	// spends one of Granted and one of these, and its response's cost is
	// paid from these first. A lease under such a rule has both or none.
	ChargeGranted int64 `json:"charge_granted,omitempty"`
	// LeasedAt is opaque to the caller: it sends it back with the tokens it
	// hands back (CheckRequest.LeasedAt). It is a moment inside the current
	// stretch of every counter that granted the lease (a window; a
	// bucket's time since it was last full), in Unix microseconds on the
	// Redis server's clock, so that each credits a hand-back only into the
	// stretch its tokens came from. ChargeLeasedAt is the same for
	// ChargeGranted, whose counter is its rule's alone.
	LeasedAt       int64 `json:"leased_at,omitempty"`
	ChargeLeasedAt int64 `json:"charge_leased_at,omitempty"`
}

// MaxLeasedAt bounds a leased_at: Unix microseconds that Redis's Lua
// numbers hold exactly.
const MaxLeasedAt = 1 << 53

// CheckResponse is the decision. The HTTP status is 200 when Allowed and 429
// when not; the body is the same shape either way.
type CheckResponse struct {
	Allowed bool `json:"allowed"`
	// Limit is the most the deciding rule's counter admits at once (0 for
	// exempt callers): its bucket size under a burst, so Remaining never
	// exceeds it.
	Limit int64 `json:"limit"`
	// Quota is the deciding rule's sustained rate: requests per
	// WindowSeconds. It differs from Limit only under a burst.
	Quota int64 `json:"quota,omitempty"`
	// Remaining is what is left in Redis after this request and its lease.
	Remaining int64 `json:"remaining"`
	// ResetAt is when the quota is whole again, in Unix seconds.
	ResetAt int64 `json:"reset_at"`
	// RetryAfter is the number of seconds to wait before a retry can pass; 0
	// when allowed.
	RetryAfter    int64  `json:"retry_after"`
	Strategy      string `json:"strategy"`
	WindowSeconds int64  `json:"window_seconds"`
	// RuleID names the rule that decided ("exempt" for exempt callers).
	RuleID string `json:"rule_id"`
	Lease  Lease  `json:"lease"`
	// Identity is the canonical identity the decision was counted against.
	Identity string `json:"identity,omitempty"`
	// Tier is the tier the decision used.
	Tier string `json:"tier,omitempty"`
	// Degraded is true when Redis could not be asked and the fail-open policy
	// allowed the request without counting it.
	Degraded bool `json:"degraded,omitempty"`
	// LogOnly is true when a log_only rule would have denied the request.
	LogOnly bool `json:"log_only,omitempty"`
	// Refusal is the deciding rule's own response on a denial (its body a
	// template of rules.ResponseFields), for the filter to answer with.
	Refusal *rules.Response `json:"refusal,omitempty"`
	// Charges are the rules that counted an admitted request and take the
	// rest of its cost from the response (cost_from response_*): the
	// caller reads each one's cost there and sends it to PathCharge.
	Charges []Charge `json:"charges,omitempty"`
}

// Charge names a rule whose cost is read from the response, and where.
type Charge struct {
	RuleID string `json:"rule_id"`
	// CostFrom is the rule's cost_from: "response_header:<name>" or
	// "response_json:<path>[+<path>...]".
	CostFrom string `json:"cost_from"`
	// Reserved is what the admission holds of the rule's counter beyond
	// its 1 (the rule's reserve), taken in the stretch ReservedAt names
	// (Unix µs, Redis's clock: a lease's leased_at). The charge sends both
	// back: what the response did not use of it is handed back there, and
	// only the rest of a larger cost is charged.
	Reserved   int64 `json:"reserved,omitempty"`
	ReservedAt int64 `json:"reserved_at,omitempty"`
}

// MaxCharges bounds the charges of one check or charge request: a rule
// set has no more rules whose cost the response reports.
const MaxCharges = rules.MaxResponseCostRules

// ChargeRequest charges an admitted request the cost its response
// reported. It names the caller with the same fields as its check, so the
// service finds the same counters; only the decision credential's holder
// may send it.
type ChargeRequest struct {
	UserID         string `json:"user_id"`
	Endpoint       string `json:"endpoint"`
	Method         string `json:"method,omitempty"`
	Tier           string `json:"tier,omitempty"`
	Tenant         string `json:"tenant,omitempty"`
	APIKey         string `json:"api_key,omitempty"`
	ClientAddress  string `json:"client_address,omitempty"`
	MethodOverride string `json:"method_override,omitempty"`
	// Charges are what the response reported, one per Charge of the
	// check's answer.
	Charges []ChargeItem `json:"charges"`
}

// ChargeItem is one rule's cost as the response reported it.
type ChargeItem struct {
	RuleID string `json:"rule_id"`
	// Cost is the request's whole cost (the admission's 1 included): what
	// the response reported. Absent when it reported nothing usable;
	// Unreported then says why, and the rule's unreported cost is charged.
	Cost       *int64 `json:"cost,omitempty"`
	Unreported string `json:"unreported,omitempty"`
	// AtLeast, beside Unreported "cut", is the usage a stream reported
	// before it was cut: the charge is the larger of it and the rule's
	// unreported cost (a client that reset a stream it had read whole
	// paid the rule's cost only).
	AtLeast int64 `json:"at_least,omitempty"`
	// Reserved and ReservedAt are the check's, for its Charge.
	Reserved   int64 `json:"reserved,omitempty"`
	ReservedAt int64 `json:"reserved_at,omitempty"`
}

// Why a response's cost was not reported (ChargeItem.Unreported).
const (
	UnreportedMissing   = "missing"   // no such header or field
	UnreportedInvalid   = "invalid"   // not a number of 0 or more
	UnreportedMalformed = "malformed" // the body is not JSON
	UnreportedEncoded   = "encoded"   // a content-encoded body (gzip...)
	UnreportedTooLarge  = "too_large" // the body passed the filter's bound
	UnreportedCut       = "cut"       // the response ended before its end
	// UnreportedError: an error answer (status 400 or more) that reports
	// no usage; it costs its admission only (an LLM API bills no tokens
	// for a refused or failed request), never the rule's unreported cost.
	UnreportedError = "error"
)

// ChargeResponse answers a ChargeRequest, one result per charge in order.
type ChargeResponse struct {
	Results []ChargeResult `json:"results"`
}

// ChargeResult is where one rule stands after its charge.
type ChargeResult struct {
	RuleID string `json:"rule_id"`
	// Charged is what was spent now: the cost less the admission's 1, less
	// what would have taken the balance below minus the capacity (Clamped).
	Charged int64 `json:"charged"`
	Clamped int64 `json:"clamped,omitempty"`
	// Limit, Remaining and ResetAt are the rule's numbers after the
	// charge, as a check reports them.
	Limit         int64  `json:"limit"`
	Remaining     int64  `json:"remaining"`
	ResetAt       int64  `json:"reset_at"`
	Strategy      string `json:"strategy"`
	WindowSeconds int64  `json:"window_seconds"`
	// Error is set instead when this rule could not be charged (it no
	// longer applies to the request, or Redis failed).
	Error string `json:"error,omitempty"`
}

// BatchCheckRequest runs several checks in one round trip. A repeated
// IdempotencyKey within five minutes replays the first answer.
type BatchCheckRequest struct {
	IdempotencyKey string         `json:"idempotency_key,omitempty"`
	Checks         []CheckRequest `json:"checks"`
}

// BatchResult is one check's answer inside a batch.
type BatchResult struct {
	UserID   string `json:"user_id"`
	Endpoint string `json:"endpoint"`
	CheckResponse
	// Error is set instead of a decision when this check's input was invalid.
	Error *ErrorBody `json:"error,omitempty"`
}

// BatchCheckResponse answers a BatchCheckRequest, in request order.
type BatchCheckResponse struct {
	Results []BatchResult `json:"results"`
	// Replayed is true when this answer was stored under the idempotency key.
	Replayed bool `json:"replayed,omitempty"`
}

// StatusResponse reads a counter without spending from it.
type StatusResponse struct {
	UserID          string  `json:"user_id"`
	Endpoint        string  `json:"endpoint"`
	Identity        string  `json:"identity"`
	Tier            string  `json:"tier,omitempty"`
	RuleID          string  `json:"rule_id"`
	Limit           int64   `json:"limit"`
	Quota           int64   `json:"quota,omitempty"`
	Remaining       int64   `json:"remaining"`
	ResetAt         int64   `json:"reset_at"`
	Strategy        string  `json:"strategy"`
	WindowSeconds   int64   `json:"window_seconds"`
	UsagePercentage float64 `json:"usage_percentage"`
	// Rules are the counters of every rule that would count the caller's
	// next request (the one above decides).
	Rules []RuleStatus `json:"rules,omitempty"`
}

// RuleStatus is where one rule's counter stands.
type RuleStatus struct {
	RuleID        string `json:"rule_id"`
	Scope         string `json:"scope"`
	Limit         int64  `json:"limit"`
	Remaining     int64  `json:"remaining"`
	ResetAt       int64  `json:"reset_at"`
	Strategy      string `json:"strategy"`
	WindowSeconds int64  `json:"window_seconds"`
}

// StatusRequest is what GET PathStatus/{user_id}/{endpoint} names: the path's
// two segments and the query's method, tier, tenant and (to read the counter
// of a limit checks name themselves) strategy, limit and window_seconds.
type StatusRequest struct {
	UserID, Endpoint, Method, Tier, Tenant string
	Strategy                               string
	Limit, WindowSeconds                   *int64
}

// ResetRequest clears the counters of one identity and endpoint.
type ResetRequest struct {
	UserID   string `json:"user_id"`
	Endpoint string `json:"endpoint"`
	Method   string `json:"method,omitempty"`
	Tier     string `json:"tier,omitempty"`
	Tenant   string `json:"tenant,omitempty"`
}

// ResetResponse confirms a reset.
type ResetResponse struct {
	UserID      string `json:"user_id"`
	Endpoint    string `json:"endpoint"`
	KeysDeleted int64  `json:"keys_deleted"`
	ResetAt     string `json:"reset_at"`
}

// ConfigRequest sets a per-identity, per-endpoint override (admin API).
type ConfigRequest struct {
	UserID        string `json:"user_id"`
	Endpoint      string `json:"endpoint"`
	Limit         int64  `json:"limit"`
	WindowSeconds int64  `json:"window_seconds"`
	Strategy      string `json:"strategy"`
	// BurstCapacity is the bucket size for token_bucket and gcra (default Limit).
	BurstCapacity int64 `json:"burst_capacity,omitempty"`
}

// ConfigResponse echoes the stored override.
type ConfigResponse struct {
	ConfigRequest
	UpdatedAt string `json:"updated_at"`
}

// ExampleDecisionToken is the placeholder decision token that the shipped
// filter configurations carry. A control service refuses it as its
// TOLLGATE_DECISION_TOKEN (a token printed in a public example is no
// credential), so a filter still carrying it is refused by every service.
const ExampleDecisionToken = "CHANGE-ME-to-the-control-service-TOLLGATE_DECISION_TOKEN"
