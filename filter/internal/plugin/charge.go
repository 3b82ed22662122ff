package plugin

import (
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/internal/usage"
	"github.com/tollgate-rl/tollgate/filter/proxywasm"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/headermap"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/types"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// A request under a rule whose cost the response reports (LLM tokens) is
// admitted at 1; the filter reads the rest from the response and charges
// it (wire.PathCharge). Only such requests read a body: every other stream
// returns from the body callback at once.

// maxUsageBody bounds the JSON body read for its usage; a larger answer is
// charged as reporting none (wire.UnreportedTooLarge).
const maxUsageBody = 1 << 20

// How the response's cost is read.
const (
	readHeaders = iota // every cost was in the headers (or reported none): the headers wait for the charge
	readJSON           // the body is buffered until its end, which waits for the charge
	readEvents         // server-sent events pass as they come; the last chunk waits for the charge
)

// A response whose cost is in its body lets its headers go at once: a
// filter that holds the response headers gets no body from Envoy until it
// resumes them (proxy-wasm-cpp-host turns the headers' StopIteration into
// StopAllIterationAndWatermark), so headers held for the body's usage
// would never be resumed. Such a response's X-RateLimit-* fields say where
// the caller stood at its admission; the charge's answer reaches the next
// response.

// headersHeld reports whether the response's headers still wait for its
// charge (their rate-limit fields then say where the caller stands after
// it).
func (ch *charging) headersHeld() bool { return ch.mode == readHeaders }

// charging is what a request under response costs carries to its response.
type charging struct {
	items []wire.ChargeItem // one per rule; Cost or Unreported once read
	// The response_json rules' paths, all in one list (each rule's from
	// jsonAt[i] to jsonAt[i+1]), so a body is read once.
	paths  [][]string
	jsonAt []int
	json   []bool // items[i] reads the body
	mode   int
	events *usage.Events
	// failed: the upstream answered an error (status 400 or more but a
	// timeout's, failedStatus); if it reports no usage, the request costs
	// its admission only.
	failed bool
	sent   bool // the charge went (or could not)
	// held: the response waits for the charge's answer.
	held bool
}

// expectCharges keeps the charges of an admission. An answer's cost_from
// the filter cannot read is ignored (the service never sends one), never
// trusted into a parse. The upstream is asked for an unencoded answer:
// a gzip body reports nothing the filter can read.
func (h *httpContext) expectCharges(cs []wire.Charge) {
	ch := h.charge // an override's check adds to the admission's
	if ch == nil {
		ch = &charging{jsonAt: []int{0}}
	}
	for _, c := range cs {
		src, expr, err := rules.ParseCostFrom(c.CostFrom)
		if err != nil || !src.AfterResponse() || len(ch.items) == wire.MaxCharges {
			continue
		}
		it := wire.ChargeItem{RuleID: c.RuleID}
		if c.Reserved > 0 && c.Reserved <= rules.MaxQuantity && c.ReservedAt > 0 && c.ReservedAt <= wire.MaxLeasedAt {
			// Sent back with the charge, which hands back what the
			// response did not use of it (an implausible one is not:
			// the reserve stays spent, under-admission only).
			it.Reserved, it.ReservedAt = c.Reserved, c.ReservedAt
		}
		ch.items = append(ch.items, it)
		ch.json = append(ch.json, src == rules.CostResponseJSON)
		if src == rules.CostResponseJSON {
			paths, _ := rules.CostPaths(expr)
			ch.paths = append(ch.paths, paths...)
		} else {
			ch.paths = append(ch.paths, []string{expr}) // the header's name, read from the headers
		}
		ch.jsonAt = append(ch.jsonAt, len(ch.paths))
	}
	if len(ch.items) == 0 {
		return
	}
	h.charge = ch
	_ = proxywasm.RemoveHttpRequestHeader("accept-encoding")
}

// chargeOnHeaders reads the costs the headers report and decides how the
// body is read.
func (h *httpContext) chargeOnHeaders(endOfStream bool) types.Action {
	ch := h.charge
	hs, err := proxywasm.GetHttpResponseHeaderMap()
	if err != nil {
		hs = ""
	}
	var contentType, encoding string
	values := make([]string, len(ch.items))
	found := make([]bool, len(ch.items))
	_ = headermap.Walk(hs, func(k, v string) bool {
		switch {
		case k == ":status":
			ch.failed = failedStatus(v)
		case wire.EqualFoldASCII(k, "content-type"):
			contentType = v
		case wire.EqualFoldASCII(k, "content-encoding"):
			encoding = v
		}
		for i := range ch.items {
			if !ch.json[i] && !found[i] && wire.EqualFoldASCII(k, ch.paths[ch.jsonAt[i]][0]) {
				values[i], found[i] = v, true
			}
		}
		return true
	})
	body := false
	for i := range ch.items {
		switch {
		case !ch.json[i] && !found[i]:
			h.unreported(i, wire.UnreportedMissing)
		case !ch.json[i]:
			h.reported(i, headerUsage(values[i]))
		case encoding != "" && !strings.EqualFold(encoding, "identity"):
			h.unreported(i, wire.UnreportedEncoded)
		case endOfStream:
			h.unreported(i, wire.UnreportedMissing)
		default:
			body = true
		}
	}
	switch {
	case !body:
		return h.sendCharge()
	case strings.HasPrefix(strings.ToLower(strings.TrimSpace(contentType)), "text/event-stream"):
		ch.mode, ch.events = readEvents, usage.NewEvents(ch.paths)
		return types.ActionContinue
	}
	ch.mode = readJSON
	return types.ActionContinue // the body is read as it comes (see headersHeld)
}

// headerUsage reads a cost header as a JSON number would be read.
func headerUsage(v string) wire.Usage {
	v = strings.TrimSpace(v)
	u := make([]wire.Usage, 1)
	if wire.ReadUsage([]byte(`{"v":`+v+`}`), [][]string{{"v"}}, u) != nil || strings.ContainsAny(v, "{[\"") {
		return wire.Usage{Found: true}
	}
	return u[0]
}

func (h *httpContext) reported(i int, u wire.Usage) {
	if !u.Valid {
		h.unreported(i, wire.UnreportedInvalid)
		return
	}
	n := u.N
	h.charge.items[i].Cost = &n
}

// failedStatus says an answer's status is an error that ran no model: 400
// or more, but for 408 and 504, timeouts, which a proxy answers while the
// model may still run and bill (Envoy's route timeout, 15 s by default,
// answers 504 through this filter to a client that asked for a long
// completion; an inner LLM gateway answers 408 or 504): those report
// nothing and cost the rule's cost, as a cut stream does (charged 1, an
// outsider's 50 such answers were billed 205,000 tokens: attack 54 F4).
func failedStatus(v string) bool {
	return len(v) == 3 && v >= "400" && v != "408" && v != "504"
}

func (h *httpContext) unreported(i int, why string) {
	if h.charge.failed && why != wire.UnreportedCut {
		why = wire.UnreportedError
	}
	if h.charge.items[i].Cost == nil && h.charge.items[i].Unreported == "" {
		h.charge.items[i].Unreported = why
		h.p.m.chargesUnreported.Increment(1)
	}
}

// OnHttpResponseBody reads a body only for a request under response costs.
func (h *httpContext) OnHttpResponseBody(bodySize int, endOfStream bool) types.Action {
	ch := h.charge
	switch {
	case ch == nil || h.localReply:
		return types.ActionContinue
	case ch.held:
		return types.ActionPause // the response waits for its charge's answer
	case ch.sent:
		return types.ActionContinue
	}
	switch ch.mode {
	case readJSON:
		if bodySize > maxUsageBody {
			// Charged as reporting none, and the body streams on rather
			// than waiting for the charge: Envoy resets a response whose
			// headers went out once what a filter buffers of it passes the
			// connection's buffer limit (1 MiB by default).
			h.unreportedBody(wire.UnreportedTooLarge)
			h.sendCharge()
			ch.held = false
			return types.ActionContinue
		}
		if !endOfStream {
			return types.ActionPause // buffered until its end
		}
		b, err := proxywasm.GetHttpResponseBody(0, bodySize)
		vals := make([]wire.Usage, len(ch.paths))
		if err != nil || wire.ReadUsage(b, ch.paths, vals) != nil {
			h.unreportedBody(wire.UnreportedMalformed)
			return h.sendCharge()
		}
		h.bodyUsage(vals)
		return h.sendCharge()
	case readEvents:
		if bodySize > 0 {
			if b, err := proxywasm.GetHttpResponseBody(0, bodySize); err == nil {
				ch.events.Feed(b)
			}
		}
		if !endOfStream {
			return types.ActionContinue
		}
		if vals := ch.events.End(); ch.events.Reliable() {
			h.bodyUsage(vals)
		} else {
			h.unreportedBody(wire.UnreportedMalformed)
		}
		return h.sendCharge() // the last chunk waits for the charge
	}
	return types.ActionContinue
}

// bodyUsage sets the body rules' costs from what their paths found.
func (h *httpContext) bodyUsage(vals []wire.Usage) {
	ch := h.charge
	for i := range ch.items {
		if !ch.json[i] {
			continue
		}
		n, ok, invalid := usage.Total(vals[ch.jsonAt[i]:ch.jsonAt[i+1]])
		switch {
		case invalid:
			h.unreported(i, wire.UnreportedInvalid)
		case !ok:
			h.unreported(i, wire.UnreportedMissing)
		default:
			h.reported(i, wire.Usage{Found: true, Valid: true, N: n})
		}
	}
}

func (h *httpContext) unreportedBody(why string) {
	for i := range h.charge.items {
		if h.charge.json[i] {
			h.unreported(i, why)
		}
	}
}

// chargeCut charges a response that ended before the filter read its cost
// (the client or the upstream went away): the rule's unreported cost. The
// charge belongs to the root context, so it is sent all the same.
func (h *httpContext) chargeCut() {
	if h.charge == nil || h.charge.sent {
		return
	}
	why := wire.UnreportedCut
	if (h.localReply || h.bodyHeld || h.form != nil) && !h.responded {
		// The filter answered the request itself after its headers were
		// admitted (a form body's override refused, a body it cannot
		// read), or the stream ended while it held the body (read for an
		// override, or waiting for the override's check): the upstream
		// got no body and served nothing, as an error answer reporting
		// none (charged as cut, a refused update cost its caller 1,000
		// tokens: attack 60 A3).
		why = wire.UnreportedError
	} else if ch := h.charge; ch.mode == readEvents && ch.events != nil {
		// A stream cut after it reported usage: a client that read a
		// 10,000-token answer whole and reset the connection paid the
		// rule's cost only, 1,000 (attack 63 S1). Finished ("[DONE]",
		// no event lost after its values), its usage is final; else what
		// it reported is the least it cost (an event lost after it may
		// have carried more, never less of a sum).
		if vals := ch.events.End(); ch.events.Done() && ch.events.Reliable() {
			h.bodyUsage(vals)
		} else {
			h.reportedBeforeCut(vals)
		}
	}
	h.unreportedBody(why)
	for i := range h.charge.items {
		h.unreported(i, why)
	}
	h.sendCharge()
}

// reportedBeforeCut keeps what a cut stream's events reported for each
// body rule, the least its charge may be (wire.ChargeItem.AtLeast).
func (h *httpContext) reportedBeforeCut(vals []wire.Usage) {
	ch := h.charge
	for i := range ch.items {
		if !ch.json[i] {
			continue
		}
		if n, ok, _ := usage.Total(vals[ch.jsonAt[i]:ch.jsonAt[i+1]]); ok {
			ch.items[i].AtLeast = n
		}
	}
}

// sendCharge sends the costs read; the response waits for the answer
// (Pause) unless the charge could not be sent.
func (h *httpContext) sendCharge() types.Action {
	p, ch := h.p, h.charge
	ch.sent = true
	if h.payFromLease() {
		return types.ActionContinue
	}
	// The same caller fields as the check's, so the same counters.
	body := wire.AppendChargeRequest(p.bodyBuf[:0], &wire.ChargeRequest{
		UserID: h.ident(), Endpoint: h.path, Method: h.method, Tier: h.tier, Tenant: h.tenant, APIKey: h.apiKey,
		ClientAddress: h.addressField(), MethodOverride: h.override, Charges: ch.items,
	})
	p.bodyBuf = body[:0] // the host copies the body
	p.m.charges.Increment(1)
	if _, err := proxywasm.DispatchHttpCallTo(p.cfg.ControlCluster, p.chargeHeaders, body, p.cfg.TimeoutMs, h, calloutCharge); err != nil {
		p.m.chargeFailures.Increment(1)
		proxywasm.LogWarn("tollgate: charge not dispatched (its cost is lost): " + err.Error())
		return types.ActionContinue
	}
	if h.done {
		return types.ActionContinue
	}
	ch.held = true
	return types.ActionPause
}

// payFromLease pays a response's cost from the bucket's lease when it
// holds that rule's pool (leasecache.TakeN): all of it, and nothing is
// sent (true), or what the pool has, the charge then sending the rest. The
// pool's tokens were spent in Redis when the lease was granted, so the
// counter ends the same either way: the sum of the costs reported.
func (h *httpContext) payFromLease() bool {
	ch := h.charge
	if h.p.cfg.Lease.Request == 0 || len(ch.items) != 1 || ch.items[0].Cost == nil || *ch.items[0].Cost <= 1 {
		return false
	}
	it := &ch.items[0]
	need := *it.Cost - 1 // the admission spent 1
	taken, e, ok := h.p.cache.TakeN(h.bucket, it.RuleID, need, h.now().UnixMilli())
	if !ok {
		return false
	}
	h.p.m.leasePaid.Increment(uint64(taken))
	if taken < need {
		rest := *it.Cost - taken
		it.Cost = &rest
		return false
	}
	if l := &h.verdict.limits; h.hasVerdict && !h.done && ch.headersHeld() && l.RuleID == it.RuleID && l.RuleID == e.RuleID {
		// What the rule's counter had left at the lease's grant, and the
		// pool still to spend: the caller's, as a lease hit counts it.
		l.Remaining = e.Remaining + e.ChargeTokens
		h.writeLimitHeaders()
	}
	return true
}

// onChargeResponse writes where the caller stands after the charge into
// the held response's headers, and lets the response go.
func (h *httpContext) onChargeResponse(numHeaders, bodySize, _ int) {
	p := h.p
	defer h.releaseResponse()
	status, _, body, _ := calloutAnswer(numHeaders, bodySize) // no answer: status 0, refused
	var r wire.ChargeResponse
	if status != 200 || wire.DecodeChargeResponse(body, &r) != nil {
		p.m.chargeFailures.Increment(1)
		proxywasm.LogWarn("tollgate: charge refused or unanswered (status " + strconv.Itoa(status) + "); its cost is lost")
		return
	}
	if h.done || !h.hasVerdict || !h.charge.headersHeld() {
		return // the headers went out before the body
	}
	// The rule a client meets first after the charge: the least left.
	l := &h.verdict.limits
	for _, c := range r.Results {
		if c.Error != "" || c.Limit <= 0 || c.Remaining < 0 {
			continue
		}
		if c.RuleID == l.RuleID || c.Remaining < l.Remaining {
			*l = wire.Limits{RuleID: c.RuleID, Strategy: c.Strategy, Limit: c.Limit, Remaining: c.Remaining, ResetAt: c.ResetAt,
				WindowSeconds: c.WindowSeconds}
		}
	}
	h.writeLimitHeaders()
}

// releaseResponse lets a response held for its charge go on.
func (h *httpContext) releaseResponse() {
	if h.charge != nil && h.charge.held && !h.done {
		h.charge.held = false
		_ = proxywasm.ResumeHttpResponse()
	}
}
