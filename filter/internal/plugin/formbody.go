package plugin

import (
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/internal/form"
	"github.com/tollgate-rl/tollgate/filter/internal/leasecache"
	"github.com/tollgate-rl/tollgate/filter/pluginconf"
	"github.com/tollgate-rl/tollgate/filter/proxywasm"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/types"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// A POST's form body may carry its method: Rails (Rack::MethodOverride),
// Laravel and Symfony route a POST with a _method field as the method it
// names. Envoy hands the filter the body only after the headers went on
// (a filter that holds them gets none: hostmodel.ErrRequestHeld), so the
// request is decided on its headers as a POST, the body is held whole
// (Envoy buffers it, up to its buffer limit, 413 past it) and read as it
// comes, and when it names another method the request is checked again,
// for the rules that method adds (wire.CheckRequest.OverrideOnly), the body
// held meanwhile: refused, the filter answers 429 and Envoy resets the
// upstream request, which got the headers and none of the body. (Until
// 2026-11-26 each chunk went on but the last, as an upstream cannot act on
// a form it has not read whole; Django's development server did, on the
// prefix a reset left it: an outsider's DELETEs ran 20 of 20 past a rule
// of 2.) A body
// override that names no method, or disagrees with a header's or the
// query's, is refused (400), as those are. method_override: strip cannot
// take a field out of a body already partly sent, so it counts one too.

// readsForm sets the request up to read its body for a method override
// when frameworks would read one there: a POST with a form body (Rack
// reads one without a content type as a form too). Such a body the
// scanners cannot read as an upstream may is refused (settled): one
// compressed (Express's body-parser inflates gzip and deflate bodies
// before method-override reads them) or in a charset a decoder may read
// as other than ASCII (body-parser decodes any "utf-" charset:
// form.OtherCharset). An outsider's DELETEs sent as such POSTs ran 50 of
// 50 past a DELETE rule of 2 a minute.
func (h *httpContext) readsForm(rq *request) (act types.Action, settled bool) {
	if rq.method != "POST" {
		return 0, false
	}
	if rq.contentTypes > len(rq.contentType) {
		// A type past those read could be the one an upstream reads.
		return h.refuse(400, "a POST with a body has at most "+strconv.Itoa(len(rq.contentType))+" Content-Type headers"), true
	}
	cts := rq.contentType[:rq.contentTypes]
	if h.form = form.New(cts...); h.form == nil {
		return 0, false
	}
	if !identityEncoding(rq.contentEncoding) {
		h.form = nil
		return h.refuse(415, "a form or JSON POST body must not be compressed (Content-Encoding)"), true
	}
	if form.OtherCharset(cts...) {
		h.form = nil
		return h.refuse(415, "a form or JSON POST body must be in UTF-8, US-ASCII, ISO-8859-1 or Windows-1252"), true
	}
	h.formLeft = -1
	if n, ok := rq.length(); ok {
		h.formLeft = n
	}
	return 0, false
}

// identityEncoding reports whether Content-Encoding values (joined with
// ",") leave a body as sent: none, or only "identity".
func identityEncoding(v string) bool {
	for v != "" {
		var c string
		c, v, _ = strings.Cut(v, ",")
		if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
			return false
		}
	}
	return true
}

// maxBodyRead is what one host call reads of a chunk (the scratch
// buffer's size: no allocation per chunk).
const maxBodyRead = 4096

// OnHttpRequestBody reads a form body for its method override; every other
// body goes on untouched.
func (h *httpContext) OnHttpRequestBody(bodySize int, endOfStream bool) types.Action {
	if h.bodyHeld {
		return types.ActionPause // the end waits for the override's check
	}
	sc := h.form
	if sc == nil || h.localReply || h.done {
		return types.ActionContinue
	}
	// The body is held (Pause buffers it): each call sees all of it so
	// far, of which the first formRead bytes were read before.
	for off := h.formRead; off < bodySize; off += maxBodyRead {
		b, err := proxywasm.GetHttpRequestBodyScratch(off, min(maxBodyRead, bodySize-off))
		if err != nil {
			break
		}
		sc.Feed(b)
	}
	if h.formLeft >= 0 {
		h.formLeft -= int64(bodySize - h.formRead)
	}
	h.formRead = max(h.formRead, bodySize)
	// A Content-Length body is decided when its last byte came, not only
	// at the end: Envoy's HTTP/1 codec passes the bytes, then the end
	// alone.
	if !endOfStream && h.formLeft != 0 {
		return types.ActionPause
	}
	h.form = nil
	return h.bodyOverride(sc.End())
}

// bodyOverride applies what the body said of its method.
func (h *httpContext) bodyOverride(o form.Overrides) types.Action {
	if o.Count == 0 {
		return types.ActionContinue
	}
	m := upperASCII(o.First)
	switch {
	case o.Conflict || !rules.ValidMethod(m) || h.override != "" && m != h.override:
		return h.refuse(400, "a method override (header, _method parameter or form field) must name one HTTP method")
	case m == h.method || m == h.override:
		return types.ActionContinue // counted with the headers
	}
	return h.checkOverride(m)
}

// checkOverride asks the service about the rules method m adds to the
// request's; the body's end waits for the answer (onOverrideResponse). The
// lease cache answers first, from the bucket a header naming m counts in:
// a lease of it (which counts this request under m's rules, and its own
// method's again) lets the body go, a denial cached there refuses it, as
// a refused override answer caches one (without that, each refused form
// cost a check: 5,456 for 5,000 in an outsider's attack, against 16 to 30
// by header).
func (h *httpContext) checkOverride(m string) types.Action {
	p := h.p
	now := h.now()
	h.overrideBucket, h.bodyMethod = h.bucketOf(h.method, m, h.path), m
	if p.cfg.Lease.Request > 0 {
		switch e, out, _ := p.cache.Take(h.overrideBucket, now.UnixMilli()); out {
		case leasecache.Hit:
			if e.CostFrom != "" {
				// A lease with a response-cost rule's pool (a header
				// override's): a request admitted on it must have its
				// response read and paid from the pool, and an override's
				// check reads none. Asked instead, the service spends that
				// rule's cost at once; the lease's token is lost
				// (under-admission only). Admitted on it, an outsider's
				// 90 form overrides were served 33,840 tokens against
				// 5,000 (attack 60 A1).
				break
			}
			p.m.localHits.Increment(1)
			return types.ActionContinue
		case leasecache.Denied:
			h.deny(h.cachedDenial(&e, now))
			return types.ActionPause
		}
	}
	if !p.breaker.Allow(now.UnixNano()) {
		return h.overrideFailed("circuit breaker open")
	}
	body := wire.AppendCheckRequest(p.bodyBuf[:0], &wire.CheckRequest{
		UserID: h.ident(), Endpoint: h.path, Method: h.method, MethodOverride: m, OverrideOnly: true,
		Tier: h.tier, Tenant: h.tenant, APIKey: h.apiKey, ClientAddress: h.addressField(),
		BodyBytes: h.bodyBytes, CostHeaders: h.costHeaders,
	})
	p.bodyBuf = body[:0]
	if _, err := proxywasm.DispatchHttpCallTo(p.cfg.ControlCluster, p.calloutHeaders, body, p.cfg.TimeoutMs, h, calloutOverride); err != nil {
		p.breaker.Record(false, now.UnixNano())
		p.m.calloutFailures.Increment(1)
		return h.overrideFailed("dispatch: " + err.Error())
	}
	h.bodyHeld = true
	return types.ActionPause
}

// onOverrideResponse lets the held end of the body go on an admission and
// answers the client on a refusal. The lease cache keeps nothing of it: it
// is no decision of the bucket's own method.
func (h *httpContext) onOverrideResponse(numHeaders, bodySize int) {
	p := h.p
	now := h.now()
	status, hs, body, _ := calloutAnswer(numHeaders, bodySize) // no answer: status 0, a failure
	var d wire.CheckResponse
	switch {
	case (status == 200 || status == 429) && p.decoder.DecodeCheckResponse(body, &d) == nil && (status == 200) == d.Allowed && h.plausible(&d):
		p.breaker.Record(true, now.UnixNano())
		if h.done {
			return
		}
		if !d.Allowed {
			h.bodyHeld = false
			v := h.verdictOf(&d)
			if p.cfg.Lease.Request > 0 {
				h.cacheDenial(h.overrideBucket, v, now)
			}
			h.deny(v)
			return
		}
		if len(d.Charges) > 0 {
			// A rule whose cost the response reports, reached by the
			// body's method alone: the upstream got the headers
			// (Accept-Encoding and all) before the body named it, so its
			// response cannot be read as such a rule needs. Refused; what
			// the check held goes back with the charge the stream's end
			// sends as an error answer's (a local answer: the upstream
			// got no body). Admitted at a fixed cost, 2 completions were
			// served 450,022 tokens against a budget of 1,000 (attack 61
			// B1); admitted uncharged, 30 against 31 (attack 59 N1).
			h.bodyHeld = false
			h.override = h.bodyMethod // the charge names the rules it reached
			h.expectCharges(d.Charges)
			h.refuse(400, "a method override in the body cannot reach a rule whose cost the response reports (an LLM token budget): name the method in a header")
			return
		}
		if v := h.verdictOf(&d); v.limits.Limit > 0 && (!h.hasVerdict || v.limits.Remaining < h.verdict.limits.Remaining) {
			h.verdict, h.hasVerdict = v, true // the rule a client meets first
		}
		h.releaseBody()
	case status == 503 && answer(body).FailedClosed(), status >= 400 && status < 500 && status != 404 && status != 408 && !answer(body).RefusedCredential():
		h.bodyHeld = false
		h.relay(status, hs, body, now)
	default:
		p.breaker.Record(false, now.UnixNano())
		p.m.calloutFailures.Increment(1)
		if !h.done {
			h.overrideFailed("override check: status " + strconv.Itoa(status))
		}
	}
}

// overrideFailed applies the failure mode to a body override the service
// could not be asked about: fail_open lets the body go (the request was
// decided on its headers), fail_closed answers 503.
func (h *httpContext) overrideFailed(reason string) types.Action {
	proxywasm.LogDebug("tollgate: no decision on a form body's method override (" + reason + "); " + h.p.cfg.FailureMode)
	if h.p.cfg.FailureMode == pluginconf.FailClosed {
		h.bodyHeld = false
		h.sendError(503, wire.CodeServiceUnavailable, "rate limiter unavailable", nil)
		return types.ActionPause
	}
	h.p.m.degraded.Increment(1)
	return h.releaseBody()
}

// releaseBody lets the held end of the body go.
func (h *httpContext) releaseBody() types.Action {
	if h.bodyHeld {
		h.bodyHeld = false
		_ = proxywasm.ResumeHttpRequest()
	}
	return types.ActionContinue
}
