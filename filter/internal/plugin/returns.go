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
// ends, and what a check of that bucket says of the request, its eight
// strings (identity, path, method, tier, tenant, API key, client address,
// method override) one after another in one string of their own (a lease
// outlives its request), by their lengths.
type keptLease struct {
	bucket leasecache.Owner
	endsMs int64
	parts  string
	lens   [8]uint16
}

// request is the return-only check of k's bucket.
func (k *keptLease) request() wire.CheckRequest {
	var f [len(k.lens)]string
	all := k.parts
	for i, n := range k.lens {
		f[i], all = all[:n], all[n:]
	}
	return wire.CheckRequest{UserID: f[0], Endpoint: f[1], Method: f[2], Tier: f[3], Tenant: f[4], APIKey: f[5], ClientAddress: f[6],
		MethodOverride: f[7], LeaseCharges: true, ReturnOnly: true}
}

const (
	// maxKept and maxKeptBytes bound the leases a VM remembers, in number
	// and in their strings' bytes (a path is up to 8 KiB): past either the
	// oldest are forgotten, and their leftovers stay spent until their
	// buckets' next checks or their windows' ends (the limiter
	// under-admits, never over). Large enough that pushing another
	// caller's leases out takes many thousands of leases a second on each
	// VM (at 1,024, an outsider's 3,200 requests did it, and the caller
	// it pushed out was refused for the rest of the minute).
	maxKept      = 16384
	maxKeptBytes = 2 << 20
	// returnTickMs is the tick's period while kept leases wait to end (a
	// hand-back comes at most this long after its lease ends).
	returnTickMs = 200
	// maxReturnsPerTick bounds the return-only checks one tick sends
	// (1,280 a second a VM at most).
	maxReturnsPerTick = 256
)

// calloutReturn is the kind of a return-only check's callout
// (pluginContext.OnCalloutResponse).
const calloutReturn uint8 = 0

// keep remembers the lease h's bucket was granted, ending at endsMs.
func (h *httpContext) keep(endsMs int64) {
	p := h.p
	parts := [...]string{h.ident(), h.path, h.method, h.tier, h.tenant, h.apiKey, h.addressField(), h.override}
	k := keptLease{bucket: h.bucket, endsMs: endsMs}
	n := 0
	for i, s := range parts {
		if len(s) > 0xffff {
			return // no part is this long (a path is 8 KiB at most)
		}
		k.lens[i] = uint16(len(s))
		n += len(s)
	}
	buf := make([]byte, 0, n)
	for _, s := range parts {
		buf = append(buf, s...)
	}
	k.parts = unsafe.String(unsafe.SliceData(buf), len(buf)) // buf is never written again
	for p.keptLen() > 0 && (p.keptLen() >= maxKept || p.keptBytes+n > maxKeptBytes) {
		p.dropKept(1)
	}
	p.kept = append(p.kept, k)
	p.keptBytes += n
	p.retick()
}

// keptLen is how many kept leases the VM remembers.
func (p *pluginContext) keptLen() int { return len(p.kept) - p.keptHead }

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
	sent := 0
	for p.keptLen() > 0 && sent < maxReturnsPerTick {
		k := &p.kept[p.keptHead]
		if k.endsMs > nowMs {
			break
		}
		e, returned := p.cache.TakeEnded(k.bucket, nowMs)
		if returned > 0 || e.ChargeTokens > 0 || e.Spent > 0 {
			sent++
			req := k.request()
			req.Returned, req.Spent, req.ChargeReturned = min(returned, maxHandBack), min(e.Spent, maxHandBack), min(e.ChargeTokens, maxHandBack)
			req.LeasedAt, req.ChargeLeasedAt = e.LeasedAt, e.ChargeLeasedAt
			body := wire.AppendCheckRequest(p.bodyBuf[:0], &req)
			p.bodyBuf = body[:0]
			if _, err := proxywasm.DispatchHttpCallTo(p.cfg.ControlCluster, p.calloutHeaders, body, p.cfg.TimeoutMs, p, calloutReturn); err != nil {
				proxywasm.LogWarn("tollgate: lease hand-back to " + p.cfg.ControlCluster + " not dispatched: " + err.Error())
			} else {
				p.m.leaseReturns.Increment(1)
			}
		}
		p.dropKept(1)
	}
}

// dropKept forgets the n oldest kept leases (their strings with them): a
// queue whose head moves on, its array compacted once the head passed half
// of it (a copy per so many drops, not one each).
func (p *pluginContext) dropKept(n int) {
	for ; n > 0 && p.keptLen() > 0; n-- {
		p.keptBytes -= len(p.kept[p.keptHead].parts)
		p.kept[p.keptHead] = keptLease{}
		p.keptHead++
	}
	if p.keptLen() == 0 {
		p.kept, p.keptHead = p.kept[:0], 0
	} else if p.keptHead >= 64 && 2*p.keptHead >= len(p.kept) {
		m := copy(p.kept, p.kept[p.keptHead:])
		clear(p.kept[m:])
		p.kept, p.keptHead = p.kept[:m], 0
	}
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
	case p.keptLen() > 0:
		want = returnTickMs
	}
	if want != p.tickMs && proxywasm.SetTickPeriodMilliSeconds(want) == nil {
		p.tickMs = want
	}
}
