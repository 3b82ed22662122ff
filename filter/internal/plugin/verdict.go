package plugin

import (
	"cmp"
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/internal/leasecache"
	"github.com/tollgate-rl/tollgate/filter/proxywasm"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/headermap"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/types"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// verdict is what the filter tells about a decided request: where the
// deciding rule stands (the 429 body and the rate-limit header fields) and
// who was counted, in which tier (the upstream identity headers). It comes
// from the control service's answer or from the lease cache, and this file
// holds every conversion between the three.
type verdict struct {
	limits         wire.Limits
	identity, tier string
	// refusal is the deciding rule's own response on a denial, as JSON
	// (wire.AppendRefusal; "": the standard 429). Kept encoded: it is
	// cached with the denial and read only when a request is refused.
	refusal string
}

// verdictOf is the verdict of the control service's answer for this
// request; the answer's identity and tier default to the ones the filter
// resolved. The lease cache keeps the strategy too, so the client sees the
// same fields whether a request was answered from the cache or not.
func (h *httpContext) verdictOf(d *wire.CheckResponse) verdict {
	l := d.Limits()
	v := verdict{limits: l, identity: cmp.Or(d.Identity, h.ident()), tier: cmp.Or(d.Tier, h.tier)}
	if d.Refusal != nil && !d.Allowed {
		v.refusal = string(wire.AppendRefusal(nil, d.Refusal))
	}
	return v
}

// cachedVerdict is the verdict a lease cache entry was stored with.
func cachedVerdict(e *leasecache.Entry) verdict {
	return verdict{
		limits: wire.Limits{RuleID: e.RuleID, Strategy: e.Strategy, Limit: e.Limit, Quota: e.Quota, Remaining: e.Remaining, ResetAt: e.ResetAt,
			WindowSeconds: e.WindowSeconds, RetryAfter: e.RetryAfter},
		identity: e.Identity, tier: e.Tier, refusal: e.Refusal,
	}
}

// entry is the lease cache record of v for bucket owner, without tokens or
// a denial (the caller sets those).
func (v *verdict) entry(owner leasecache.Owner) leasecache.Entry {
	l := &v.limits
	return leasecache.Entry{Owner: owner, Limit: l.Limit, Quota: l.Quota, Remaining: l.Remaining, ResetAt: l.ResetAt,
		WindowSeconds: l.WindowSeconds, RetryAfter: l.RetryAfter, RuleID: l.RuleID, Strategy: l.Strategy, Identity: v.identity, Tier: v.tier,
		Refusal: v.refusal}
}

// allow lets the request through with the identity headers upstream; a
// verdict with a limit is written into the response headers later.
func (h *httpContext) allow(v verdict, decision string) {
	_ = proxywasm.ReplaceHttpRequestHeader(headerIdentity, v.identity)
	if v.tier != "" {
		_ = proxywasm.ReplaceHttpRequestHeader(headerTier, v.tier)
	}
	_ = proxywasm.ReplaceHttpRequestHeader(headerDecision, decision)
	if v.limits.Limit > 0 {
		h.verdict, h.hasVerdict = v, true
	}
}

// allowLeased lets the request through on a token of the cached lease e.
// The lease's other tokens are this caller's to spend, so they count as
// remaining.
func (h *httpContext) allowLeased(e *leasecache.Entry) {
	h.p.m.localHits.Increment(1)
	h.p.m.allowed.Increment(1)
	v := cachedVerdict(e)
	v.limits.Remaining += leasedTo(e.RuleID, e.ChargeRule, e.Tokens, e.ChargeTokens)
	if e.CostFrom != "" {
		// Admitted on the rule's pool: its response pays the rest.
		h.expectCharges([]wire.Charge{{RuleID: e.ChargeRule, CostFrom: e.CostFrom}})
	}
	h.allow(v, decisionAllowed)
}

// leasedTo is what a lease holds of rule ruleID's tokens, which the client
// counts as left: the pool of chargeRule (the rule whose cost the response
// reports; "" when the lease has no pool) when that is ruleID, the lease's
// tokens otherwise.
func leasedTo(ruleID, chargeRule string, tokens, chargeTokens int64) int64 {
	if chargeRule != "" && chargeRule == ruleID {
		return chargeTokens
	}
	return tokens
}

// deny answers 429 itself, with the RATE_LIMIT_EXCEEDED envelope the control
// service sends (wire.Exceeded), Retry-After and the rate-limit header
// fields; or, when the deciding rule has its own response, with that.
func (h *httpContext) deny(v verdict) {
	h.p.m.denied.Increment(1)
	if v.refusal != "" {
		var r rules.Response
		// An answer is the service's, but a refusal that would not pass
		// the service's own checks (a 200, a framing header) is never sent.
		if err := wire.DecodeRefusal([]byte(v.refusal), &r); err == nil && r.Validate() == nil {
			h.denyWith(&r, v)
			return
		}
	}
	// Rendered into the plugin's reused buffers: the retry-after value and
	// the rate-limit fields into headerBuf, the map and the body beside.
	p := h.p
	buf := strconv.AppendInt(p.headerBuf[:0], v.limits.RetryAfter, 10)
	retryEnd := len(buf)
	buf, fields := wire.AppendHeaderFields(buf, p.headerFields[:0], &v.limits, p.headerSet, h.headerClock(), true)
	reply := append(p.replyFields[:0], headermap.Field{Name: "content-type", Value: jsonType},
		headermap.Field{Name: "retry-after", Value: buf[:retryEnd]})
	for _, f := range fields {
		reply = append(reply, headermap.Field{Name: f.Name, Value: f.Value(buf)})
	}
	p.replyMap = headermap.AppendEncodeFields(p.replyMap[:0], reply)
	p.replyBody = wire.AppendExceeded(p.replyBody[:0], &v.limits, h.requestID)
	p.headerBuf, p.replyFields = buf[:0], reply[:0]
	h.localReply = true
	_ = proxywasm.SendHttpResponseEncoded(429, p.replyMap, p.replyBody, -1)
}

// jsonType is the refusal's content-type.
var jsonType = []byte("application/json")

// OnHttpResponseHeaders writes the verdict back to the client, rendered
// into the plugin's reused buffer (the host copies each value).
func (h *httpContext) OnHttpResponseHeaders(_ int, endOfStream bool) types.Action {
	if h.localReply || h.responded {
		return types.ActionContinue // one response a stream: its charge is sent once
	}
	h.responded = true
	if h.hasVerdict {
		h.writeLimitHeaders()
	}
	if h.charge != nil {
		return h.chargeOnHeaders(endOfStream)
	}
	return types.ActionContinue
}

// writeLimitHeaders writes the verdict's rate-limit fields into the
// response headers.
func (h *httpContext) writeLimitHeaders() {
	p := h.p
	buf, fields := wire.AppendHeaderFields(p.headerBuf[:0], p.headerFields[:0], &h.verdict.limits, p.headerSet, h.headerClock(), false)
	for _, f := range fields {
		_ = proxywasm.ReplaceHttpResponseHeaderBytes(f.Name, f.Value(buf))
	}
	p.headerBuf = buf[:0] // keep what it grew to
}

// limitHeaders appends the rate-limit header fields the configuration
// selects (Retry-After wins over the IETF t= on a 429).
func (h *httpContext) limitHeaders(dst [][2]string, v *verdict, denied bool) [][2]string {
	return wire.AppendHeaders(dst, &v.limits, h.p.headerSet, h.headerClock(), denied)
}

// headerClock is the Unix second the IETF fields count from; without them
// no field reads the clock, and the response costs no clock call.
func (h *httpContext) headerClock() int64 {
	if !h.p.headerSet.IETF {
		return 0
	}
	return h.now().Unix()
}

// denyWith answers a denial with the rule's own response: its status, its
// body rendered with this refusal's numbers, its headers, then Retry-After
// and the rate-limit fields (which it cannot override).
func (h *httpContext) denyWith(r *rules.Response, v verdict) {
	l := &v.limits
	body := r.Render(rules.ResponseValues{Limit: l.SustainedQuota(), Remaining: l.Remaining, ResetAt: l.ResetAt, RetryAfter: l.RetryAfter,
		WindowSeconds: l.WindowSeconds, RuleID: l.RuleID, Strategy: l.Strategy, RequestID: h.requestID})
	headers := make([][2]string, 0, len(r.Headers)+8)
	if _, ok := r.Headers["content-type"]; !ok {
		headers = append(headers, [2]string{"content-type", "application/json"})
	}
	prefix := strings.ToLower(h.p.cfg.Headers.Prefix)
	for name, value := range r.Headers {
		if prefix != "" && strings.HasPrefix(name, prefix) {
			continue // the rate-limit fields are the filter's, under any prefix
		}
		headers = append(headers, [2]string{name, value})
	}
	headers = append(headers, [2]string{"retry-after", strconv.FormatInt(l.RetryAfter, 10)})
	headers = h.limitHeaders(headers, &v, true)
	h.localReply = true
	_ = proxywasm.SendHttpResponse(uint32(r.StatusCode()), headers, []byte(body), -1)
}
