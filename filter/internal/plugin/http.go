package plugin

import (
	"math"
	"net/netip"
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/internal/digest"
	"github.com/tollgate-rl/tollgate/filter/internal/form"
	"github.com/tollgate-rl/tollgate/filter/internal/jwt"
	"github.com/tollgate-rl/tollgate/filter/internal/leasecache"
	"github.com/tollgate-rl/tollgate/filter/pluginconf"
	"github.com/tollgate-rl/tollgate/filter/proxywasm"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/headermap"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/types"
	"github.com/tollgate-rl/tollgate/shared/ascii"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/paths"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Upstream headers the filter owns. Client-supplied x-tollgate-* headers are
// removed before anything reads the request.
const (
	headerPrefix   = "x-tollgate-"
	headerIdentity = "x-tollgate-identity"
	headerTier     = "x-tollgate-tier"
	headerDecision = "x-tollgate-decision"
)

// Decisions written to x-tollgate-decision.
const (
	decisionAllowed  = "allowed"
	decisionDegraded = "degraded"
	decisionExempt   = "exempt"
	// decisionLogOnly: a rule would have refused the request but only logs
	// (a log_only rule, or the service's enabled = false).
	decisionLogOnly = "log_only"
)

// maxCalloutBody bounds what is read of the control service's answer.
const maxCalloutBody = 64 << 10

type httpContext struct {
	types.DefaultHttpContext
	p         *pluginContext
	contextID uint32
	// leads: this request's callout is the one its bucket's waiters wait
	// for; waiting: this request waits for another's (coalesce.go);
	// waited: it has waited (counted once). refill is the mark of the
	// refill it leads in the lease slot (0: none); bare: its answer
	// brought no lease nor denial, or it failed.
	leads, waiting, waited, bare bool
	refill                       int64

	// caller: id is its identity, or "" while it is the client address ip
	// (see ident: a lease hit never needs it as a string)
	id, tier, tenant, apiKey string
	ip                       netip.Addr
	bucket                   leasecache.Owner

	// requestID is the proxy's x-request-id (Envoy sets one on every
	// request), quoted in the filter's own error bodies so a client's
	// report can be matched with the proxy's logs.
	requestID string

	// What rules with a cost_from read, sent with the check: the body's
	// size (nil: unknown, a chunked body) and the configured cost headers.
	bodyBytes   *int64
	bodySize    int64 // what bodyBytes points at, when known (no allocation of its own)
	costHeaders map[string]string

	// The request as checked, for a charge after its response.
	path, method, override string
	// form reads the request's form body for a method override, held
	// until read whole (formbody.go); bodyHeld: it waits for the
	// override's check.
	form     form.Scanner
	formLeft int64 // Content-Length bytes the scanner has yet to see (-1: unknown)
	formRead int   // bytes of the held body read
	bodyHeld bool
	// overrideBucket is the bucket of the body's override (checkOverride),
	// bodyMethod the method it names.
	overrideBucket leasecache.Owner
	bodyMethod     string
	// charge is set when the response reports the request's cost.
	charge *charging

	verdict    verdict // for the response headers, when hasVerdict
	hasVerdict bool
	localReply bool
	responded  bool // the upstream's response headers came
	paused     bool
	done       bool // the stream ended; a late answer only updates shared state
	// start is when the callout left, in Unix nanoseconds (a lease it
	// brings counts its TTL from then: keepLease). The filter links no
	// package time (proxywasm.Time).
	start int64
}

// now is the wall clock: one host call (time.Now makes two).
func (h *httpContext) now() proxywasm.Time { return proxywasm.WallClock() }

// OnHttpRequestHeaders decides the request: from the lease cache when it
// can, else by a callout to the control service (the request pauses until
// onCheckResponse).
func (h *httpContext) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	p := h.p
	rq, err := h.readRequest()
	if err != nil {
		proxywasm.LogError("tollgate: read request headers: " + err.Error())
		return h.failure("read request headers")
	}
	if rq.forged > 0 {
		if err := stripForged(); err != nil {
			proxywasm.LogError("tollgate: strip client-supplied x-tollgate-* headers: " + err.Error())
			return h.failure("strip headers")
		}
	}
	// Two credentials of one kind are refused, never resolved by picking
	// one: the upstream might read the other.
	switch {
	case rq.auths > 1:
		return h.refuse(400, "more than one Authorization header")
	case rq.apiKeys > 1:
		return h.refuse(400, "more than one "+p.cfg.APIKeyHeader+" header")
	}
	// Most paths are canonical as sent, and pass the three checks below
	// as they are: one pass over them instead of four.
	path, canonical := paths.Canonical(rq.rawPath)
	if !canonical {
		if p.cfg.EscapedSlashes == pluginconf.EscapedSlashesReject && paths.HasEscapedSlash(rq.rawPath) {
			// Upstreams read it two ways (escaped_slashes in pluginconf):
			// no count could match them both.
			return h.refuse(400, "the request path has an escaped slash or a backslash (%2F, %5C or \\)")
		}
		if paths.HasDotSegment(rq.rawPath) {
			// Resolved here, an upstream behind a proxy that does not
			// resolve them (Envoy without normalize_path) gets them as
			// sent: a wildcard route there served what was counted as
			// another path.
			return h.refuse(400, "the request path has a '.' or '..' segment")
		}
		if path, err = paths.Normalize(rq.rawPath); err != nil {
			return h.refuse(400, "the request path cannot be counted as sent: "+err.Error())
		}
	}
	if p.excluded(rq.rawPath, path) {
		return types.ActionContinue
	}
	if !rules.ValidMethod(rq.method) {
		// The service would refuse it without counting anything: refused
		// here, such requests cost no callout each.
		return h.refuse(400, "the request method must be an upper-case HTTP method")
	}
	override, act, settled := h.methodOverride(&rq)
	if settled {
		return act
	}
	if !h.resolveIdentity(rq.auth, rq.xff, rq.realIP) {
		return types.ActionPause // answered 401
	}
	h.bucket = h.bucketOf(rq.method, override, path)

	// Kept before the lease is read: a request admitted on a lease of a
	// response-cost rule charges its response as this caller.
	h.path, h.method, h.override = path, rq.method, override
	if !endOfStream {
		if act, settled := h.readsForm(&rq); settled {
			return act
		}
	}
	now := h.now()
	var back handBack
	var refill refillSeen
	if p.cfg.Lease.Request > 0 {
		var act types.Action
		var settled bool
		if back, act, settled, refill = h.spendLease(now); settled {
			return act
		}
	}
	h.meter(&rq, endOfStream)
	if h.wait(back, refill) {
		return types.ActionPause // decided with the answer this bucket waits for
	}
	return h.callOut(back, now)
}

// bucketOf is the lease-cache bucket of this caller's request of method
// (counted under override too, when that is not ""). The raw API key goes
// into the keyed hash: only its 128-bit digest reaches shared data, and the
// hash is secret per process. The parts are those of Bucket(JWT subject,
// client address, api key, tier, tenant, method, path), each one there is,
// hashed where they lie: the client address's identity in a stack buffer.
func (h *httpContext) bucketOf(method, override, path string) leasecache.Owner {
	b := h.p.cache.NewBucket()
	var buf [64]byte
	if h.id != "" && !strings.HasPrefix(h.id, string(identity.KindIP)+":") {
		b.Add(h.id) // a verified subject (ident makes an address caller's later)
	}
	if h.ip.IsValid() {
		// A JWT caller's lease is its address's too: an ip rule counted it
		// from there.
		b.AddBytes(h.appendIPIdentity(buf[:0]))
	}
	if override == "" {
		b.Add(h.apiKey, h.tier, h.tenant, method, path)
	} else {
		b.Add(h.apiKey, h.tier, h.tenant, method, override, path)
	}
	return b.Owner()
}

// handBack is what a check reports of the bucket's last lease: its expired
// tokens of each pool, handed back with the lease's leased_at, and those
// spent locally.
type handBack struct{ returned, chargeReturned, spent, leasedAt, chargeLeasedAt int64 }

// overrideHeaders are the method override headers upstream frameworks
// honour; an underscore spelling counts as the same header (headerIs).
var overrideHeaders = [...]string{"x-http-method-override", "x-method-override", "x-http-method"}

// methodOverride applies method_override to the request's override
// headers. Counting, it returns the method they name (upper-cased, as the
// frameworks read it; "" when none or the request's own), and refuses
// headers that name no method or disagree: the upstream would pick one.
// Stripping, it removes them. settled is true when the request has its
// answer (act).
func (h *httpContext) methodOverride(rq *request) (method string, act types.Action, settled bool) {
	if rq.overrides == 0 && rq.queryOverride == 0 {
		return "", 0, false
	}
	if h.p.cfg.MethodOverride == pluginconf.MethodOverrideStrip {
		// Four names at most are kept; more headers than that are refused
		// rather than partly removed.
		if rq.overrides > len(rq.overrideNames) {
			return "", h.refuse(400, "too many method override headers"), true
		}
		for _, name := range rq.overrideNames[:rq.overrides] {
			if err := proxywasm.RemoveHttpRequestHeader(name); err != nil {
				proxywasm.LogError("tollgate: remove " + name + ": " + err.Error())
				return "", h.failure("strip method override"), true
			}
		}
		if rq.queryOverride > 0 {
			if err := proxywasm.ReplaceHttpRequestHeader(":path", withoutMethodParams(rq.rawPath)); err != nil {
				proxywasm.LogError("tollgate: strip _method from :path: " + err.Error())
				return "", h.failure("strip method override"), true
			}
		}
		return "", 0, false
	}
	m := upperASCII(rq.override)
	if rq.overrideConflict || !rules.ValidMethod(m) {
		return "", h.refuse(400, "a method override (header or _method parameter) must name one HTTP method"), true
	}
	if m == rq.method {
		return "", 0, false
	}
	return m, 0, false
}

// upperASCII upper-cases ASCII letters, as method override middleware does.
func upperASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if 'a' <= s[i] && s[i] <= 'z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'a' <= b[j] && b[j] <= 'z' {
					b[j] -= 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// request is what the filter reads of the request headers.
type request struct {
	rawPath, method, auth, xff, realIP string
	// forged counts client-supplied x-tollgate-* headers; auths and apiKeys
	// the credentials of each kind.
	forged, auths, apiKeys int
	// override is a method override header's (or _method parameter's)
	// value; overrides counts such headers (overrideNames holds the first
	// names, as sent, for removal), queryOverride such parameters
	// (override.go), and overrideConflict says two of them disagree.
	override         string
	overrides        int
	queryOverride    int
	overrideNames    [4]string
	overrideConflict bool
	// contentLength is the Content-Length header ("" when absent; the
	// lengths joined with "," when repeated); cost holds the values of the
	// configured cost headers, by their index (repeats joined with ",").
	contentLength string
	// contentType holds the Content-Type headers (the first four;
	// contentTypes counts them): a form body may carry a method override
	// (formbody.go).
	contentType  [4]string
	contentTypes int
	// contentEncoding holds the Content-Encoding headers' values, joined
	// with ",": a compressed form body is one the filter cannot read.
	contentEncoding string
	cost            [pluginconf.MaxCostHeaders]string
	costSeen        [pluginconf.MaxCostHeaders]bool
}

// length is the request's Content-Length when it is one plain number
// (not repeated, no sign, at most 15 digits).
func (rq *request) length() (int64, bool) {
	if rq.contentLength == "" || len(rq.contentLength) > 15 || rq.contentLength[0] == '+' {
		return 0, false
	}
	n, err := strconv.ParseInt(rq.contentLength, 10, 64)
	return n, err == nil && n >= 0
}

// join keeps one header's values: a repeat is joined with ",", which no
// number holds, so a service reading it as a number refuses it.
func join(old string, seen bool, v string) string {
	if !seen {
		return v
	}
	return old + "," + v
}

// readRequest reads the request headers in one pass; the API key goes to
// h.apiKey. The host's serialised map is one string and every value kept is
// a substring of it: one allocation for the whole read.
func (h *httpContext) readRequest() (request, error) {
	var rq request
	hm, err := proxywasm.GetHttpRequestHeaderMap()
	if err != nil {
		return rq, err
	}
	apiKeyHeader := h.p.cfg.APIKeyHeader
	costHeaders := h.p.cfg.CostHeaders
	lengths := h.p.readLengths
	err = headermap.Walk(hm, func(k, v string) bool {
		if n := len(k); n < 64 && lengths&(1<<n) == 0 && !headerHasPrefix(k, headerPrefix) {
			return true // no name read below is this long
		}
		for i, name := range costHeaders {
			// x_units counts as x-units, as for the API key: an upstream
			// that reads headers CGI-style sees both spellings as one.
			if headerIs(k, name) {
				rq.cost[i], rq.costSeen[i] = join(rq.cost[i], rq.costSeen[i], v), true
			}
		}
		// A name read here is one readLengths counts too.
		switch {
		case headerHasPrefix(k, headerPrefix):
			rq.forged++
		case wire.EqualFoldASCII(k, ":path"):
			rq.rawPath = v
		case wire.EqualFoldASCII(k, ":method"):
			rq.method = v
		case wire.EqualFoldASCII(k, "authorization"):
			rq.auths++
			rq.auth = v
		case headerIs(k, apiKeyHeader):
			// x_api_key counts too: an upstream that reads headers CGI-style
			// sees both spellings as one.
			rq.apiKeys++
			h.apiKey = v
		case wire.EqualFoldASCII(k, "x-forwarded-for"):
			if rq.xff != "" {
				v = rq.xff + "," + v // several lines: rare, joined as Envoy would
			}
			rq.xff = v
		case wire.EqualFoldASCII(k, "x-real-ip"):
			rq.realIP = v
		case wire.EqualFoldASCII(k, "content-length"):
			rq.contentLength = join(rq.contentLength, rq.contentLength != "", v)
		case wire.EqualFoldASCII(k, "content-type"):
			// Every one is read (formbody.go): frameworks take the first,
			// the last, or all joined.
			if rq.contentTypes < len(rq.contentType) {
				rq.contentType[rq.contentTypes] = v
			}
			rq.contentTypes++
		case headerIs(k, "content-encoding"):
			// content_encoding too: a CGI-style upstream reads both as one.
			rq.contentEncoding = join(rq.contentEncoding, rq.contentEncoding != "", v)
		case wire.EqualFoldASCII(k, "x-request-id"):
			if ascii.Printable.Match(v, 1, maxRequestID) {
				h.requestID = v
			}
		case isOverrideHeader(k):
			if rq.overrides > 0 && !strings.EqualFold(v, rq.override) {
				rq.overrideConflict = true
			}
			if rq.overrides < len(rq.overrideNames) {
				rq.overrideNames[rq.overrides] = k
			}
			rq.overrides++
			rq.override = v
		}
		return true
	})
	rq.queryOverrides()
	return rq, err
}

// readLengths has bit n set when a request header name readRequest reads
// is n bytes long (the x-tollgate- prefix aside, which a name of any length
// from 11 on may carry). A browser's request carries twenty headers and
// more, most of them none the filter reads: each is passed over on one test
// instead of a dozen comparisons.
func readLengths(apiKeyHeader string, costHeaders []string) uint64 {
	m := uint64(fixedReadLengths)
	if len(apiKeyHeader) < 64 {
		m |= 1 << len(apiKeyHeader)
	}
	for _, name := range costHeaders {
		if len(name) < 64 {
			m |= 1 << len(name)
		}
	}
	return m
}

// fixedReadLengths are the lengths of the names readRequest always reads:
// :path, :method, authorization, x-forwarded-for, x-real-ip,
// content-length, content-type, content-encoding and x-request-id, and the
// override headers
// (TestReadLengthsOfFixedNames spells them out).
const fixedReadLengths = 1<<len(":path") | 1<<len(":method") | 1<<len("authorization") | 1<<len("x-forwarded-for") |
	1<<len("x-real-ip") | 1<<len("content-length") | 1<<len("content-type") | 1<<len("content-encoding") | 1<<len("x-request-id") |
	1<<len("x-http-method-override") | 1<<len("x-method-override") | 1<<len("x-http-method")

func isOverrideHeader(k string) bool {
	for _, name := range overrideHeaders {
		if headerIs(k, name) {
			return true
		}
	}
	return false
}

// spendLease answers the request from the lease cache when it can: a token
// of a live lease lets it through, a cached denial refuses it (settled).
// Otherwise back holds the expired lease tokens the cache handed back, for
// the callout to return to the control service, and the lease tokens spent
// locally since the last callout, for it to report (usage counts requests
// made); or refill names the mark of a refill in flight on some VM, which
// the request may wait for (coalesce.go).
func (h *httpContext) spendLease(now proxywasm.Time) (back handBack, act types.Action, settled bool, refill refillSeen) {
	e, out, returned := h.p.cache.Take(h.bucket, now.UnixMilli())
	switch out {
	case leasecache.Hit:
		h.allowLeased(&e)
		return handBack{}, types.ActionContinue, true, refillSeen{}
	case leasecache.Refilling:
		return handBack{}, 0, false, refillSeen{pending: e.RefillID, bare: e.RefillBare == 1}
	case leasecache.Denied:
		h.deny(h.cachedDenial(&e, now))
		return handBack{}, types.ActionPause, true, refillSeen{}
	}
	// The service takes at most maxHandBack of each: more (leases merged
	// in one slot) is dropped, which only under-admits.
	return handBack{returned: min(returned, maxHandBack), chargeReturned: min(e.ChargeTokens, maxHandBack), spent: min(e.Spent, maxHandBack),
		leasedAt: e.LeasedAt, chargeLeasedAt: e.ChargeLeasedAt}, 0, false, refillSeen{}
}

// cachedDenial is the verdict of a denial the lease cache holds, with the
// wait left of the service's Retry-After: the denial was cached at
// DeniedUntilMs less what it is held for.
func (h *httpContext) cachedDenial(e *leasecache.Entry, now proxywasm.Time) verdict {
	v := cachedVerdict(e)
	waitMs := max(e.RetryAfter, 1) * 1000
	deniedAt := e.DeniedUntilMs - min(waitMs, denialHoldMs)
	v.limits.RetryAfter = max(1, (waitMs-(now.UnixMilli()-deniedAt)+999)/1000)
	v.limits.Remaining = 0
	return v
}

// maxHandBack is the most a check may return or report of each count (the
// service refuses more).
const maxHandBack = 1_000_000_000

// meter keeps what a rule's cost_from may read: the body's size (0 when the
// headers end the request; Content-Length when it is one plain number;
// unknown otherwise) and the configured cost headers present.
func (h *httpContext) meter(rq *request, endOfStream bool) {
	switch {
	case endOfStream:
		h.bodySize, h.bodyBytes = 0, &h.bodySize
	default:
		if n, ok := rq.length(); ok {
			h.bodySize, h.bodyBytes = n, &h.bodySize
		}
	}
	for i, name := range h.p.cfg.CostHeaders {
		if rq.costSeen[i] {
			if h.costHeaders == nil {
				h.costHeaders = make(map[string]string, len(h.p.cfg.CostHeaders))
			}
			v := rq.cost[i]
			if len(v) > 64 {
				v = v[:64] // the service refuses it either way; bounded
			}
			h.costHeaders[name] = v
		}
	}
}

// callOut asks the control service and pauses the request until
// onCheckResponse (or applies the failure mode when it cannot ask).
func (h *httpContext) callOut(back handBack, now proxywasm.Time) types.Action {
	p := h.p
	if !p.breaker.Allow(now.UnixNano()) {
		return h.failure("circuit breaker open")
	}
	body := wire.AppendCheckRequest(p.bodyBuf[:0], &wire.CheckRequest{
		UserID: h.ident(), Endpoint: h.path, Method: h.method, Tier: h.tier, Tenant: h.tenant,
		APIKey: h.apiKey, Lease: p.cfg.Lease.Request, Returned: back.returned, Spent: back.spent, ClientAddress: h.addressField(),
		MethodOverride: h.override, BodyBytes: h.bodyBytes, CostHeaders: h.costHeaders,
		// Every request admitted on a lease reads its response when the
		// lease says so (allowLeased).
		LeaseCharges: p.cfg.Lease.Request > 0, ChargeReturned: back.chargeReturned,
		LeasedAt: back.leasedAt, ChargeLeasedAt: back.chargeLeasedAt,
	})
	p.bodyBuf = body[:0] // keep what it grew to
	h.start = now.UnixNano()
	if _, err := proxywasm.DispatchHttpCallTo(p.cfg.ControlCluster, p.calloutHeaders, body, p.cfg.TimeoutMs, h, calloutCheck); err != nil {
		p.breaker.Record(false, now.UnixNano())
		p.m.calloutFailures.Increment(1)
		proxywasm.LogWarn("tollgate: callout to " + p.cfg.ControlCluster + " not dispatched: " + err.Error())
		return h.failure("dispatch: " + err.Error())
	}
	h.paused = true
	h.lead(now)
	return types.ActionPause
}

// stripForged removes every client-supplied x-tollgate-* header (and its
// x_tollgate_* spelling) in one host call, however many there are.
func stripForged() error {
	hs, err := proxywasm.GetHttpRequestHeaders()
	if err != nil {
		return err
	}
	kept := hs[:0]
	for _, kv := range hs {
		if !headerHasPrefix(kv[0], headerPrefix) {
			kept = append(kept, kv)
		}
	}
	return proxywasm.ReplaceHttpRequestHeaders(kept)
}

// excluded reports whether a request skips rate limiting: its normalised
// path matches excluded_paths, it was spelled that way, and it has no
// query. A path that only normalises to an excluded one
// ("/api/..;/healthz") may mean something else to the upstream, and so may
// a query: front controllers route by it (WordPress's ?rest_route=,
// CodeIgniter's "?/route": an outsider's /healthz?rest_route=/wp/v2/users
// reached the REST route uncounted). Both are counted.
func (p *pluginContext) excluded(rawPath, path string) bool {
	if len(p.cfg.ExcludedPaths) == 0 || strings.ContainsAny(rawPath, "?#") || rawPath != path {
		return false
	}
	for _, ex := range p.cfg.ExcludedPaths {
		if rules.MatchGlob(ex, path) {
			return true
		}
	}
	return false
}

// resolveIdentity picks the caller: a verified JWT subject, else the client
// address (an API key travels beside it and the service resolves it). It
// returns false when it has answered 401 itself.
func (h *httpContext) resolveIdentity(auth, xff, realIP string) bool {
	p := h.p
	if p.verifier != nil && len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
		now := h.now()
		addr, addrOK := h.clientAddress(xff, realIP)
		var client tokenClient
		charged := 0
		c, err := p.verifier.VerifyIf(strings.TrimSpace(auth[7:]), now.UnixNano(), func(checks int) bool {
			// Asked only before the dear parts (a long payload, the
			// signature checks). An address-less request (none in Envoy)
			// counts as the zero address.
			if charged == 0 {
				client = p.tokenClient(addr)
			}
			if !p.badTokens.allow(client, now.UnixMilli()) {
				return false
			}
			charged += checks
			return true
		})
		if err != nil && charged > 0 {
			// What was spent on a token that failed counts, check by
			// check: a token without kid tried against four keys is four
			// (one counted, an outsider's 200 addresses kept the VM at 97 %
			// of a core within the budget: attack 45 A2).
			p.badTokens.failed(client, now.UnixMilli(), charged)
		}
		if err == nil {
			if sub := tokenName(c.Subject); sub != "" {
				h.id = identity.ID{Kind: identity.KindUser, Value: sub}.String()
				if rules.ValidTierName(c.Tier) {
					h.tier = c.Tier
				}
				h.tenant = tokenName(c.Tenant)
				// The subject is who calls; per-address rules still count
				// where from (sent as client_address, and in the bucket).
				if addrOK {
					h.ip = addr
				}
				return true
			}
		}
		if p.cfg.JWT.RejectInvalid {
			p.m.rejected.Increment(1)
			if err == jwt.ErrNotVerified || charged == 0 && !p.badTokens.allow(p.tokenClient(addr), now.UnixMilli()) {
				// Not checked: this second's bad-token checks are spent
				// (badtokens.go), and the token may well be valid. A 401
				// would have its client drop the session; this asks it
				// to come back once the second is over. A token that
				// failed a cheap check gets the same answer then: a 401
				// for it beside a 503 for a token that passed them told
				// an outsider which issuer, audience and key ids are
				// accepted, without a signature. Before its address is
				// out of checks the two still differ, since only what
				// passed the cheap checks spends them: the 17th forged
				// token of a second tells (security.md, "Known and
				// kept"; attack 47 B1).
				h.sendError(503, wire.CodeServiceUnavailable, "the bearer token could not be checked now; retry", [][2]string{{"retry-after", "1"}})
				return false
			}
			h.sendError(401, wire.CodeUnauthorized, "the bearer token is invalid or expired", [][2]string{{"www-authenticate", `Bearer error="invalid_token"`}})
			return false
		}
	}
	if len(h.apiKey) > 256 {
		h.apiKey = h.apiKey[:256] // the service refuses it as malformed
	}
	ip, ok := h.clientAddress(xff, realIP)
	if !ok {
		h.id = identity.UnknownIP.String()
		return true
	}
	// The identity string waits until something keeps it (ident): a lease
	// hit only hashes it.
	h.ip = ip
	return true
}

// clientAddress is the caller's address as Envoy resolved it and the
// trusted proxies forwarded it, bucketed (an IPv6 prefix); false when there
// is none.
func (h *httpContext) clientAddress(xff, realIP string) (netip.Addr, bool) {
	p := h.p
	// The address is parsed into a netip.Addr and dropped: a scratch read
	// (one guest allocation less per request).
	source, _ := proxywasm.GetPropertyScratch(sourceAddress)
	addr, _, err := identity.ClientIP(identity.ClientIPInput{
		SourceAddress: source, ForwardedFor: xff, XFFTrustedHops: p.cfg.XFFTrustedHops,
		RealIP: realIP, TrustRealIP: p.cfg.TrustXRealIP,
	})
	if err != nil {
		return netip.Addr{}, false
	}
	return identity.Bucket(addr, p.cfg.IPv6Prefix), true
}

// addressField is the client_address a check and a charge send: a JWT
// caller's address ("" for an address caller: it is its user_id).
func (h *httpContext) addressField() string {
	if h.id != "" && h.ip.IsValid() && !strings.HasPrefix(h.id, string(identity.KindIP)+":") {
		return h.ip.String()
	}
	return ""
}

// ident is the caller's identity: the one resolved, or the client
// address's, made into a string on first use.
func (h *httpContext) ident() string {
	if h.id == "" && h.ip.IsValid() {
		var buf [64]byte
		h.id = string(h.appendIPIdentity(buf[:0]))
	}
	return h.id
}

// appendIPIdentity appends the client address's identity, "ip:" and the
// address as netip.Addr.String spells it (identity.KindIP's canonical form).
func (h *httpContext) appendIPIdentity(b []byte) []byte {
	b = append(b, string(identity.KindIP)...)
	b = append(b, ':')
	return h.ip.AppendTo(b)
}

// sourceAddress is the property Envoy resolves the client address into,
// its path in the ABI's NUL-separated form.
const sourceAddress = "source\x00address"

// refuse answers a request the filter will not decide (ambiguous
// credentials, a path it cannot normalise) with 400 INVALID_INPUT.
func (h *httpContext) refuse(status uint32, msg string) types.Action {
	h.p.m.rejected.Increment(1)
	h.sendError(status, wire.CodeInvalidInput, msg, nil)
	return types.ActionPause
}

// OnHttpStreamDone marks the stream finished: a callout answer that arrives
// later still brings its lease and breaker outcome, but nothing else.
func (h *httpContext) OnHttpStreamDone() {
	h.done = true
	h.chargeCut()
}

// The kinds of callout an HTTP context makes (OnCalloutResponse).
const (
	calloutCheck uint8 = iota
	calloutCharge
	calloutOverride
)

// OnCalloutResponse delivers a callout's answer to its handler: the
// context is the binding's receiver, so a callout allocates no closure.
func (h *httpContext) OnCalloutResponse(kind uint8, numHeaders, bodySize, numTrailers int) {
	switch kind {
	case calloutCheck:
		h.onCheckResponse(numHeaders, bodySize, numTrailers)
	case calloutCharge:
		h.onChargeResponse(numHeaders, bodySize, numTrailers)
	case calloutOverride:
		h.onOverrideResponse(numHeaders, bodySize)
	}
}

// onCheckResponse handles the control service's answer (or its absence).
func (h *httpContext) onCheckResponse(numHeaders, bodySize, _ int) {
	p := h.p
	defer h.release() // the bucket's waiters take from what it brought
	now := h.now()
	p.m.calloutLatency.Record(uint64(max(now.UnixNano()-h.start, 0) / 1e6))
	status, hs, body, why := calloutAnswer(numHeaders, bodySize)
	if why != "" {
		h.calloutFailed(now, why)
		return
	}
	switch {
	case status == 200 || status == 429:
		var d wire.CheckResponse
		if err := p.decoder.DecodeCheckResponse(body, &d); err != nil || (status == 200) != d.Allowed {
			h.calloutFailed(now, "unparsable answer")
			return
		}
		if !h.plausible(&d) {
			h.calloutFailed(now, "implausible answer")
			return
		}
		p.breaker.Record(true, now.UnixNano())
		if h.done {
			h.keepLate(&d, now)
			return
		}
		h.decided(&d, now)
	case status == 503 && answer(body).FailedClosed():
		// The service could not decide and its failure mode is
		// fail_closed: it is the one source of truth when it answers, so
		// the client gets its 503 whatever this filter's failure_mode.
		h.relay(status, hs, body, now)
	case (status == 401 || status == 403) && answer(body).RefusedCredential():
		// The service refused the filter itself (a missing or rotated
		// decision_token, a field it needs the credential for): a
		// misconfiguration, not an answer about the client.
		proxywasm.LogError("tollgate: the control service refused the filter's credential (decision_token): status " + strconv.Itoa(status))
		h.calloutFailed(now, "credential refused")
	case status >= 400 && status < 500 && status != 404 && status != 408:
		// The service judged the request (an API key error...): pass its
		// answer to the client as it was sent.
		h.relay(status, hs, body, now)
	default:
		h.calloutFailed(now, "status "+strconv.Itoa(status))
	}
}

// calloutAnswer reads the answer of the callout being delivered: its
// status, its serialised headers and its body (up to maxCalloutBody); why
// says what it lacks ("" when it has headers: a reset has none).
func calloutAnswer(numHeaders, bodySize int) (status int, hs string, body []byte, why string) {
	if numHeaders == 0 {
		return 0, "", nil, "stream reset"
	}
	hs, err := proxywasm.GetHttpCallResponseHeaderMap()
	if err == nil {
		err = headermap.Walk(hs, func(k, v string) bool {
			if k == ":status" {
				status, _ = strconv.Atoi(v)
			}
			return true
		})
	}
	if err != nil {
		return 0, "", nil, "no response headers"
	}
	if bodySize > 0 {
		body, _ = proxywasm.GetHttpCallResponseBody(0, min(bodySize, maxCalloutBody))
	}
	return status, hs, body, ""
}

// relay answers the client with the service's own answer.
func (h *httpContext) relay(status int, hs string, body []byte, now proxywasm.Time) {
	h.bare = true // no lease: its waiters call out themselves (release)
	h.p.breaker.Record(true, now.UnixNano())
	if h.done {
		return
	}
	h.p.m.rejected.Increment(1)
	h.localReply = true
	_ = proxywasm.SendHttpResponse(uint32(status), passThrough(hs), body, -1)
}

// passThrough keeps the headers of the service's own answer that mean
// something to the client (content-type, WWW-Authenticate, Retry-After...):
// not pseudo-headers, framing or connection headers, which the proxy sets.
// hs is the answer's serialised header map.
func passThrough(hs string) [][2]string {
	var out [][2]string
	_ = headermap.Walk(hs, func(k, v string) bool {
		switch {
		case strings.HasPrefix(k, ":"), k == "content-length", k == "transfer-encoding", k == "connection",
			k == "keep-alive", k == "date", k == "server", k == "x-request-id":
		default:
			out = append(out, [2]string{k, v})
		}
		return true
	})
	return out
}

// answer reads the service's error envelope (wire.DecodeErrorAnswer); a
// body that is not one reads as no code, so it means neither fail_closed
// nor a refused credential.
func answer(body []byte) *wire.ErrorAnswer {
	var e wire.ErrorAnswer
	if wire.DecodeErrorAnswer(body, &e) != nil {
		return &wire.ErrorAnswer{}
	}
	return &e
}

// maxLeaseTTLMs bounds how long a granted lease is spent locally,
// whatever the answer says.
const maxLeaseTTLMs = 60_000

// plausible checks what the filter is about to cache and write into headers:
// an identity and tier it would send upstream must be well-formed, and a
// lease is never larger or longer than asked for.
func (h *httpContext) plausible(d *wire.CheckResponse) bool {
	if d.Identity != "" {
		if _, err := identity.Parse(d.Identity); err != nil || !strings.Contains(d.Identity, ":") {
			return false
		}
	}
	if d.Tier != "" && !rules.ValidTierName(d.Tier) {
		return false
	}
	if d.Lease.Granted < 0 || d.Lease.TTLMs < 0 || d.Lease.ChargeGranted < 0 || len(d.Charges) > wire.MaxCharges ||
		d.Lease.LeasedAt < 0 || d.Lease.LeasedAt > wire.MaxLeasedAt || d.Lease.ChargeLeasedAt < 0 || d.Lease.ChargeLeasedAt > wire.MaxLeasedAt {
		return false
	}
	d.Lease.Granted = min(d.Lease.Granted, h.p.cfg.Lease.Request)
	d.Lease.TTLMs = min(d.Lease.TTLMs, maxLeaseTTLMs)
	d.Lease.ChargeGranted = min(d.Lease.ChargeGranted, maxHandBack)
	if (d.Lease.ChargeGranted > 0) != (len(d.Charges) > 0) || len(d.Charges) > 1 {
		// A lease under a response cost holds that one rule's pool; one
		// without it would admit requests whose responses nobody charges.
		// Not kept (its tokens are lost: under-admission only).
		d.Lease.Granted, d.Lease.ChargeGranted = 0, 0
	}
	return true
}

// decided applies a decision of the control service.
func (h *httpContext) decided(d *wire.CheckResponse, now proxywasm.Time) {
	p := h.p
	v := h.verdictOf(d)
	if !d.Allowed {
		h.denied(v, now)
		return
	}
	if h.keepLease(&v, d.Lease, d.Charges, now) {
		chargeRule := ""
		if d.Lease.ChargeGranted > 0 {
			chargeRule = d.Charges[0].RuleID // plausible: exactly one
		}
		v.limits.Remaining += leasedTo(v.limits.RuleID, chargeRule, d.Lease.Granted, d.Lease.ChargeGranted)
	} else {
		h.bare = true // its waiters call out themselves (release)
		if !d.Degraded && v.limits.Limit > 0 {
			// The bucket's last limit, for the fallback while the service
			// cannot be asked (a lease carries it otherwise).
			_ = p.cache.Put(v.entry(h.bucket), now.UnixMilli())
		}
	}
	decision := decisionAllowed
	switch {
	case d.Degraded:
		// Nothing was counted: there are no numbers to tell the client.
		decision = decisionDegraded
		v.limits = wire.Limits{}
		p.m.degraded.Increment(1)
	case d.RuleID == rules.IDExempt:
		decision = decisionExempt
	case d.LogOnly:
		decision = decisionLogOnly
	}
	p.m.allowed.Increment(1)
	h.allow(v, decision)
	if len(d.Charges) > 0 {
		h.expectCharges(d.Charges)
	}
	h.resume()
}

// denialHoldMs bounds how long a denial is answered from the cache: a
// reset, a raised override or a key's new tier reaches a client this filter
// refused within it. Past it the next request asks the service again, so a
// client that keeps knocking costs one callout a second per bucket.
const denialHoldMs = 1000

// denied applies a denial of the control service: it is cached until its
// Retry-After, for denialHoldMs at most, the caller's fallback window is
// spent (fallback.Exhaust), and the request is answered 429 unless a
// concurrent callout of this caller brought a lease (those tokens are
// paid for).
func (h *httpContext) denied(v verdict, now proxywasm.Time) {
	p := h.p
	p.fallback.Exhaust(h.ident(), now.UnixMilli()) // refused: nothing degraded either
	if p.cfg.FailureMode != pluginconf.FailClosed {
		// And on the proxy's other VMs: each has a fallback of its own,
		// which gave a refused caller its limit on every other worker (an
		// outsider's 300 degraded through 4 VMs with a fallback of 100).
		windowMs := p.cfg.Fallback.WindowSeconds * 1000
		_ = p.cache.Put(leasecache.Entry{Owner: h.refusedMark(), Limit: p.cfg.Fallback.Limit, WindowSeconds: p.cfg.Fallback.WindowSeconds,
			DeniedUntilMs: now.UnixMilli() + windowMs}, now.UnixMilli())
	}
	if p.cfg.Lease.Request > 0 {
		h.cacheDenial(h.bucket, v, now)
		if le, out, _ := p.cache.Take(h.bucket, now.UnixMilli()); out == leasecache.Hit {
			h.allowLeased(&le)
			h.resume()
			return
		}
	} else {
		// Without leases nothing answers from the slot; the fallback reads
		// it: nothing left until the decision's reset.
		_ = p.cache.Put(v.entry(h.bucket), now.UnixMilli())
	}
	h.deny(v)
}

// refusedMark is the lease-cache slot that marks this caller refused by the
// service for the fallback's window (denied): a bucket of its own, which no
// request's bucket is (its first part holds a NUL, which no identity does).
func (h *httpContext) refusedMark() leasecache.Owner {
	return h.p.cache.Bucket("\x00refused", h.ident())
}

// cacheDenial caches a denial of owner's bucket for its Retry-After,
// denialHoldMs at most (a live lease stays in the slot).
func (h *httpContext) cacheDenial(owner leasecache.Owner, v verdict, now proxywasm.Time) {
	e := v.entry(owner)
	e.DeniedUntilMs = now.UnixMilli() + min(max(v.limits.RetryAfter, 1)*1000, denialHoldMs)
	_ = h.p.cache.Put(e, now.UnixMilli())
}

// keepLease caches the tokens of a granted lease for this request's bucket,
// spendable for the lease's TTL; it reports whether there were any. The TTL
// counts from when the check was sent, not from the answer: the service
// measured it (up to a window's end) at some moment after the send, so the
// lease ends by then however long the answer took on its way, a stalled
// proxy or a slow network included, with no clock shared.
func (h *httpContext) keepLease(v *verdict, l wire.Lease, charges []wire.Charge, now proxywasm.Time) bool {
	if h.p.cfg.Lease.Request == 0 || l.Granted == 0 {
		return false
	}
	e := v.entry(h.bucket)
	sentMs := min(h.start/1e6, now.UnixMilli())
	e.Tokens, e.ExpiresMs, e.LeasedAt = l.Granted, sentMs+l.TTLMs, l.LeasedAt
	if l.ChargeGranted > 0 {
		// plausible checked there is one charge.
		e.ChargeTokens, e.ChargeRule, e.CostFrom = l.ChargeGranted, charges[0].RuleID, charges[0].CostFrom
		e.ChargeLeasedAt = l.ChargeLeasedAt
	}
	_ = h.p.cache.Put(e, now.UnixMilli())
	h.keep(e.ExpiresMs) // handed back on a tick if no request comes back for it
	return true
}

// calloutFailed records a failed callout and applies the failure mode.
func (h *httpContext) calloutFailed(now proxywasm.Time, reason string) {
	h.bare = true // the next refills are not waited for either (release)
	h.p.breaker.Record(false, now.UnixNano())
	h.p.m.calloutFailures.Increment(1)
	if !h.done {
		h.failure(reason)
	}
}

// keepLate keeps what an answer that arrived after its stream ended brought:
// the tokens of a granted lease were spent in Redis and belong in the cache
// (dropping them would only under-admit, but waste the caller's quota).
func (h *httpContext) keepLate(d *wire.CheckResponse, now proxywasm.Time) {
	if d.Allowed {
		v := h.verdictOf(d)
		h.keepLease(&v, d.Lease, d.Charges, now)
	}
}

// failure applies the failure mode: fail_closed answers 503; fail_open
// lets the request pass, marked degraded, under the fallback: a bucket
// whose last decision the proxy saw gets fallback.share of that limit per
// its window, counted across the proxy's VMs (a bucket with nothing left, or
// refused, stays refused until its reset), and all of a caller's buckets
// together at most callerCap per VM and fallback window; a caller never
// seen gets the configured per-VM fallback limit.
func (h *httpContext) failure(reason string) types.Action {
	p := h.p
	proxywasm.LogDebug("tollgate: no decision (" + reason + "); " + p.cfg.FailureMode)
	if p.cfg.FailureMode == pluginconf.FailClosed {
		h.sendError(503, wire.CodeServiceUnavailable, "rate limiter unavailable", nil)
		return types.ActionPause
	}
	now := h.now()
	if until := p.cache.DeniedUntil(h.refusedMark(), now.UnixMilli()); until > 0 {
		// The service refused this caller within the fallback's window,
		// on some VM of the proxy (denied).
		h.deny(verdict{limits: wire.Limits{RuleID: "fallback", Limit: p.cfg.Fallback.Limit, WindowSeconds: p.cfg.Fallback.WindowSeconds,
			RetryAfter: max(1, (until-now.UnixMilli()+999)/1000), ResetAt: (until + 999) / 1000}})
		return types.ActionPause
	}
	if r := p.cache.Fallback(h.bucket, now.UnixMilli(), p.cfg.Fallback.Share); r.Known {
		if r.Allowed {
			// A bucket is one path (and method) of the caller: without a
			// bound across them, a caller that had the proxy see many
			// paths before the outage would get each one's share, many
			// times the tier's total across paths (an outsider's attack:
			// 7,815 in a second where the total was 100 per 10 s).
			limit := callerCap(r, p.cfg.Fallback.Limit, p.cfg.Fallback.WindowSeconds)
			if ok, waitMs := p.fallback.AllowUpTo(h.ident(), now.UnixMilli(), limit); !ok {
				r.Allowed, r.WaitMs, r.Quota, r.WindowSeconds = false, waitMs, limit, p.cfg.Fallback.WindowSeconds
			}
		}
		if !r.Allowed {
			h.deny(verdict{limits: wire.Limits{RuleID: "fallback", Limit: r.Quota, WindowSeconds: r.WindowSeconds,
				RetryAfter: max(1, (r.WaitMs+999)/1000), ResetAt: (now.UnixMilli() + r.WaitMs + 999) / 1000}})
			return types.ActionPause
		}
		p.m.degraded.Increment(1)
		p.m.allowed.Increment(1)
		h.allow(verdict{identity: h.ident(), tier: h.tier}, decisionDegraded)
		return h.resume()
	}
	ok, waitMs := p.fallback.Allow(h.ident(), now.UnixMilli())
	if !ok {
		h.deny(verdict{limits: wire.Limits{RuleID: "fallback", Limit: p.cfg.Fallback.Limit, WindowSeconds: p.cfg.Fallback.WindowSeconds,
			RetryAfter: max(1, (waitMs+999)/1000), ResetAt: (now.UnixMilli() + waitMs + 999) / 1000}})
		return types.ActionPause
	}
	p.m.degraded.Increment(1)
	p.m.allowed.Increment(1)
	h.allow(verdict{identity: h.ident(), tier: h.tier}, decisionDegraded)
	return h.resume()
}

// callerCap bounds what all of a caller's known buckets pass together per
// VM and fallback window (windowSeconds): its bucket's share of its limit,
// scaled from the bucket's window to that one, or the configured fallback
// limit when that is more. A caller's largest limit is thus what its
// buckets share, never the sum of every path's.
func callerCap(r leasecache.FallbackResult, fallbackLimit, windowSeconds int64) int64 {
	n := float64(r.Share) * float64(windowSeconds) / float64(max(r.WindowSeconds, 1))
	if n >= float64(math.MaxInt64) {
		return math.MaxInt64
	}
	return max(fallbackLimit, int64(n), 1)
}

// resume continues a paused request; it returns the action for a request
// that was not paused yet.
func (h *httpContext) resume() types.Action {
	if h.paused {
		h.paused = false
		_ = proxywasm.ResumeHttpRequest()
	}
	return types.ActionContinue
}

// maxRequestID bounds the x-request-id quoted in an error body (Envoy's are
// 36-character UUIDs).
const maxRequestID = 128

func (h *httpContext) sendError(status uint32, code, msg string, extra [][2]string) {
	body := wire.AppendErrorEnvelope(make([]byte, 0, 160), &wire.ErrorBody{Code: code, Message: msg, RequestID: h.requestID})
	h.localReply = true
	_ = proxywasm.SendHttpResponse(status, append([][2]string{{"content-type", "application/json"}}, extra...), body, -1)
}

// headerIs compares a header name with a lower-case hyphenated one, ASCII
// case-insensitively and reading "_" as "-": proxies and frameworks that map
// headers CGI-style (HTTP_X_API_KEY) treat the two spellings as one header.
func headerIs[T string | []byte](name T, lower string) bool {
	return len(name) == len(lower) && headerHasPrefix(name, lower)
}

func headerHasPrefix[T string | []byte](name T, lower string) bool {
	if len(name) < len(lower) {
		return false
	}
	for i := 0; i < len(lower); i++ {
		c := name[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		} else if c == '_' {
			c = '-'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// tokenName is a verified token's subject (or tenant) as an identity's
// value: the claim as it is, or, when it cannot be one (a control or
// invisible character, longer than an identity holds), "~sha256:" and the
// first 16 bytes of its SHA-256 in hex: the same caller every time, and
// drawn as no other; either way a valid user id. Dropped, such a subject's caller was counted by its
// address in the default tier, its tier and tenant lost with it, while the
// upstream served it as the token's user (attack 55 F2). A claim that
// begins as a digest does is digested too: kept, a user who chose the
// subject "~sha256:<hex>" was the caller whose subject has that digest
// (attack 56 F3). "" for no claim.
func tokenName(claim string) string {
	if claim == "" {
		return ""
	}
	if _, err := identity.User(claim); err == nil && !strings.HasPrefix(claim, identity.DigestPrefix) {
		return claim
	}
	return identity.Digested(digest.Sum256([]byte(claim)))
}
