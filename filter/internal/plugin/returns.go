package plugin

import (
	"unsafe"

	"github.com/tollgate-rl/tollgate/filter/internal/leasecache"
	"github.com/tollgate-rl/tollgate/filter/proxywasm"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// A lease's leftover goes back to the control service with its bucket's
// next check (spendLease). A bucket no request comes back to kept its
// tokens spent in the service's counters until their windows ended: an
// outsider's client asking 300 paths three times each got 300 of a tier's
// total of 1,000, and was refused for the rest of the minute with every
// lease long expired. So each VM remembers the leases it kept, and on a
// tick after one ends hands back what its bucket's slot still holds
// (leasecache.TakeEnded: once, whichever of this and a next check comes
// first) in a return-only check (wire.CheckRequest.ReturnOnly).

// keptLease is a lease this VM kept, until it ends: its bucket, when it
// ends, and what a check of that bucket says of the request (its strings
// in one buffer of their own: a lease outlives its request).
type keptLease struct {
	bucket leasecache.Owner
	endsMs int64
	req    wire.CheckRequest
}

const (
	// maxKept bounds the leases a VM remembers (each holds its path, up to
	// 8 KiB): past it the oldest is forgotten, and its leftover stays
	// spent until its bucket's next check or its window's end (the
	// limiter under-admits, never over).
	maxKept = 1024
	// returnTickMs is the tick's period while kept leases wait to end (a
	// hand-back comes at most this long after its lease ends).
	returnTickMs = 200
	// maxReturnsPerTick bounds the return-only checks one tick sends.
	maxReturnsPerTick = 64
)

// calloutReturn is the kind of a return-only check's callout
// (pluginContext.OnCalloutResponse).
const calloutReturn uint8 = 0

// keep remembers the lease h's bucket was granted, ending at endsMs.
func (h *httpContext) keep(endsMs int64) {
	p := h.p
	parts := [...]string{h.ident(), h.path, h.method, h.tier, h.tenant, h.apiKey, h.addressField(), h.override}
	n := 0
	for _, s := range parts {
		n += len(s)
	}
	buf := make([]byte, 0, n)
	for _, s := range parts {
		buf = append(buf, s...)
	}
	all := unsafe.String(unsafe.SliceData(buf), len(buf)) // buf is never written again
	var f [len(parts)]string
	for i, s := range parts {
		f[i], all = all[:len(s)], all[len(s):]
	}
	if len(p.kept) == maxKept {
		p.dropKept(maxKept / 4) // the oldest, a quarter at once: one copy per 256 leases
	}
	p.kept = append(p.kept, keptLease{bucket: h.bucket, endsMs: endsMs, req: wire.CheckRequest{
		UserID: f[0], Endpoint: f[1], Method: f[2], Tier: f[3], Tenant: f[4], APIKey: f[5], ClientAddress: f[6], MethodOverride: f[7],
		LeaseCharges: true, ReturnOnly: true,
	}})
	p.retick()
}

// returnEnded hands back what the kept leases that ended by nowMs left, in
// the order they were kept, at most maxReturnsPerTick a tick.
func (p *pluginContext) returnEnded(nowMs int64) {
	if p.breaker.Open() {
		// Kept for a tick after it closes (past maxKept the oldest go).
		// Not Allow: a hand-back would take the breaker's one probe and,
		// its answer unread, hold the breaker open a cooldown more (an
		// outsider's quiet client got 503s for 4.5 s after the service was
		// back).
		return
	}
	n, sent := 0, 0
	for ; n < len(p.kept) && p.kept[n].endsMs <= nowMs && sent < maxReturnsPerTick; n++ {
		k := &p.kept[n]
		e, returned := p.cache.TakeEnded(k.bucket, nowMs)
		if returned <= 0 && e.ChargeTokens <= 0 && e.Spent <= 0 {
			continue // a check of its bucket handed it back, or it was spent
		}
		sent++
		req := k.req
		req.Returned, req.Spent, req.ChargeReturned = min(returned, maxHandBack), min(e.Spent, maxHandBack), min(e.ChargeTokens, maxHandBack)
		req.LeasedAt, req.ChargeLeasedAt = e.LeasedAt, e.ChargeLeasedAt
		body := wire.AppendCheckRequest(p.bodyBuf[:0], &req)
		p.bodyBuf = body[:0]
		if _, err := proxywasm.DispatchHttpCallTo(p.cfg.ControlCluster, p.calloutHeaders, body, p.cfg.TimeoutMs, p, calloutReturn); err != nil {
			proxywasm.LogWarn("tollgate: lease hand-back to " + p.cfg.ControlCluster + " not dispatched: " + err.Error())
			continue
		}
		p.m.leaseReturns.Increment(1)
	}
	p.dropKept(n)
}

// dropKept forgets the n oldest kept leases (their strings with them).
func (p *pluginContext) dropKept(n int) {
	if n == 0 {
		return
	}
	m := copy(p.kept, p.kept[n:])
	clear(p.kept[m:])
	p.kept = p.kept[:m]
}

// OnCalloutResponse receives a return-only check's answer, which carries
// nothing to act on: a hand-back that failed leaves its tokens spent.
func (p *pluginContext) OnCalloutResponse(kind uint8, _, _, _ int) {}

// retick sets the tick's period to what the VM waits for: another VM's
// refill (coalesce.go), every millisecond; kept leases to end, every
// returnTickMs; nothing, no tick.
func (p *pluginContext) retick() {
	want := uint32(0)
	switch {
	case len(p.watched) > 0:
		want = watchTickMs
	case len(p.kept) > 0:
		want = returnTickMs
	}
	if want != p.tickMs && proxywasm.SetTickPeriodMilliSeconds(want) == nil {
		p.tickMs = want
	}
}
