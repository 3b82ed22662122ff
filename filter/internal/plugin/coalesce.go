package plugin

import (
	"github.com/tollgate-rl/tollgate/filter/internal/leasecache"
	"github.com/tollgate-rl/tollgate/filter/proxywasm"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/types"
)

// Coalescing: when a bucket's lease runs out or ends, every request of
// that bucket that arrives before the refill's answer would call out too,
// each taking a lease of its own; under load (callers' leases ending
// together, the service slower for it) that was most of the calls a
// benchmark made. Instead, while one request of a bucket waits for the
// control service, later requests of that bucket on this VM wait for the
// same answer and then take from the lease it brought; one that finds
// none calls out itself.
//
// Across VMs (Envoy's workers, each its own VM) the refill is marked in
// the bucket's slot (leasecache.MarkRefill): a request of that bucket on
// another VM finds it Refilling and waits too, watched by this VM's tick
// (shared data notifies no one): every millisecond while anything waits,
// the waiters look at the slot again and take from the lease the refill
// put there, answer from its denial, or call out once that refill is over.
// So a bucket's refill costs one call, not one per VM, and the tokens it
// brings are not split among leases the VMs each took.
//
// A request waits for one refill at most, never for the next: the one its
// group waits for is named by its mark, and once it is answered each
// waiter decides alone: from the lease or denial it brought, or by calling
// out itself when it brought neither or failed. And once a bucket's refill
// brought no lease (the service's enabled = false, shadow mode, degraded
// answers) or failed, its requests call out at once, until one brings a
// lease, rather than add a refill's round trip to their own. So a failing
// service costs a waiter two timeouts at most, and the requests after it
// one each, as without coalescing (the breaker then answers at once); not
// one per callout that follows (found by an outsider's attack: waits of
// seconds, and four to six timeouts, before the refills were named). A
// refill's failure is not its waiters': sharing it made one slow check
// fail every request that waited for it (fail_closed: 188 503s where
// calling out made one; a second attack).

// maxWaiters bounds the requests waiting on one callout.
const maxWaiters = 64

// maxWatched bounds the buckets a VM watches for another VM's refill; past
// it a request calls out as it would without the mark. Each watched bucket
// costs a shared-data read a millisecond: with a thousand, under a slow
// service, that was 1.5 CPU-seconds a second and 30 times slower lease
// hits for everyone on the VM (an outsider's attack).
const maxWatched = 64

// watchTickMs is the tick's period while requests wait for another VM's
// refill: the most such a request waits past the refill's answer.
const watchTickMs = 1

// lead marks this request's callout as its bucket's refill, for this VM's
// other requests and, in the slot, for the other VMs' until the callout's
// timeout at most (release ends it sooner).
func (h *httpContext) lead(now proxywasm.Time) {
	p := h.p
	if p.cfg.Lease.Request == 0 {
		return
	}
	if _, ok := p.inflight[h.bucket]; !ok {
		p.inflight[h.bucket] = nil
		h.leads = true
		ms := now.UnixMilli()
		h.refill, _ = p.cache.MarkRefill(h.bucket, ms+int64(p.cfg.TimeoutMs), ms)
	}
}

// refillSeen is what a lease slot said of its bucket's refills: the mark of
// one in flight (0: none), and whether the last answered brought no lease
// (bare).
type refillSeen struct {
	pending int64
	bare    bool
}

// wait pauses a request that found nothing to spend and nothing to hand
// back behind its bucket's refill: this VM's (await) or, when the slot
// says another VM's refill is in flight, that one (watch). False: the
// request calls out itself, as it does when the bucket's last refill
// brought no lease (the service's enabled = false, shadow mode, degraded
// answers): waiting for one that brings none either would only add its
// round trip to the request's own.
func (h *httpContext) wait(back handBack, seen refillSeen) bool {
	if back != (handBack{}) || seen.bare {
		return false
	}
	return h.await() || seen.pending != 0 && h.watch(seen.pending)
}

// watched is a bucket whose waiters wait for another VM's refill, named by
// its mark.
type watched struct {
	bucket leasecache.Owner
	refill int64
}

// watch makes this request the first of its bucket to wait for another
// VM's refill (marked refill), and starts the tick that looks for its
// answer.
func (h *httpContext) watch(refill int64) bool {
	p := h.p
	if _, ok := p.inflight[h.bucket]; ok || len(p.watched) >= maxWatched {
		return false // its waiters are full (await), or too many buckets are watched
	}
	p.inflight[h.bucket] = nil
	if p.tickMs != watchTickMs {
		if err := proxywasm.SetTickPeriodMilliSeconds(watchTickMs); err != nil {
			delete(p.inflight, h.bucket)
			return false
		}
		p.tickMs = watchTickMs
	}
	p.watched = append(p.watched, watched{h.bucket, refill})
	return h.await()
}

// await queues this request behind its bucket's refill in flight; false
// when there is none (or too many wait already).
func (h *httpContext) await() bool {
	p := h.p
	waiters, ok := p.inflight[h.bucket]
	if !ok || len(waiters) >= maxWaiters {
		return false
	}
	p.inflight[h.bucket] = append(waiters, h)
	if !h.waited {
		h.waited = true
		p.m.refillWaits.Increment(1)
	}
	h.waiting, h.paused = true, true
	return true
}

// OnTick looks again at the refills other VMs' requests wait for: a
// bucket whose slot still names its refill in flight waits on, at the cost
// of one shared-data read; the others' waiters are decided (wake). The tick
// stops when nothing is watched.
func (p *pluginContext) OnTick() {
	watched := p.watched
	p.watched = p.watchedSpare[:0]
	now := proxywasm.WallClock().UnixMilli()
	for _, w := range watched {
		if p.cache.Refills(w.bucket, now) == w.refill {
			p.watched = append(p.watched, w) // its group stays in p.inflight
			continue
		}
		p.wake(w.bucket, w.refill)
	}
	p.watchedSpare = watched[:0]
	if p.keptLen() > 0 && now >= p.nextReturnMs {
		p.nextReturnMs = now + returnTickMs
		p.returnEnded(now)
	}
	p.retick()
	_ = proxywasm.SetEffectiveContext(p.rootID)
}

// wake decides again the requests waiting for bucket b's refill, each in
// its own context (the caller restores its own after): this VM's own
// refill (refill 0), or another VM's, named by its mark. While that mark
// stands, the first waiter watches on and the rest wait with it, with no
// look at the slot of their own. Otherwise each takes from the lease the
// refill brought, answers from its denial, or calls out itself.
func (p *pluginContext) wake(b leasecache.Owner, refill int64) {
	waiters := p.inflight[b]
	delete(p.inflight, b)
	again := false
	for _, w := range waiters {
		w.waiting = false
		if w.done {
			continue
		}
		if err := proxywasm.SetEffectiveContext(w.contextID); err != nil {
			continue // gone meanwhile
		}
		if again && w.await() {
			continue
		}
		again = w.decideWaited(refill)
	}
}

// release ends this request's lead: its mark leaves the slot (unless a
// later one replaced it; saying whether the answer brought no lease) and
// each waiter takes a token of the lease the answer brought, answers from
// a cached denial, or calls out itself; each in its own context.
func (h *httpContext) release() {
	if !h.leads {
		return
	}
	p := h.p
	h.leads = false
	if h.refill != 0 {
		// A lease or denial put in the slot cleared the mark already.
		p.cache.EndRefill(h.bucket, h.refill, h.bare)
		h.refill = 0
	}
	p.wake(h.bucket, 0)
	_ = proxywasm.SetEffectiveContext(h.contextID)
}

// decideWaited decides a request that waited for another VM's refill
// (refill, its mark; 0: none, this VM's own): it takes a token of the lease
// the refill brought, answers from its denial, or calls out itself; while
// the slot still names the refill as in flight, it waits on (true).
func (h *httpContext) decideWaited(refill int64) (waits bool) {
	now := h.now()
	back, act, settled, seen := h.spendLease(now)
	switch {
	case settled:
		if act == types.ActionContinue {
			h.resume()
		}
		return false
	case refill != 0 && seen.pending == refill && h.wait(back, seen):
		return true
	}
	h.callOut(back, now)
	return false
}
