package plugin

import (
	"time"

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
// put there, answer from its denial, or call out once the mark is gone.
// So a bucket's refill costs one call, not one per VM, and the tokens it
// brings are not split among leases the VMs each took.

// maxWaiters bounds the requests waiting on one callout.
const maxWaiters = 64

// maxWatched bounds the buckets a VM watches for another VM's refill; past
// it a request calls out as it would without the mark.
const maxWatched = 1024

// watchTickMs is the tick's period while requests wait for another VM's
// refill: the most such a request waits past the refill's answer.
const watchTickMs = 1

// lead marks this request's callout as its bucket's refill, for this VM's
// other requests and, in the slot, for the other VMs' until the callout's
// timeout at most (release ends it).
func (h *httpContext) lead(now time.Time) {
	p := h.p
	if p.cfg.Lease.Request == 0 {
		return
	}
	if p.inflight == nil {
		p.inflight = map[leasecache.Owner][]*httpContext{}
	}
	if _, ok := p.inflight[h.bucket]; !ok {
		p.inflight[h.bucket] = nil
		h.leads = true
		ms := now.UnixMilli()
		p.cache.MarkRefill(h.bucket, ms+int64(p.cfg.TimeoutMs), ms)
	}
}

// wait pauses a request that found nothing to spend and nothing to hand
// back behind its bucket's refill: this VM's (await) or, when the slot
// says another VM's is in flight (refilling), that one (watch). False:
// the request calls out itself.
func (h *httpContext) wait(back handBack, refilling bool) bool {
	if back != (handBack{}) {
		return false
	}
	return h.await() || refilling && h.watch()
}

// watch makes this request the first of its bucket to wait for another
// VM's refill, and starts the tick that looks for its answer.
func (h *httpContext) watch() bool {
	p := h.p
	if _, ok := p.inflight[h.bucket]; ok || len(p.watched) >= maxWatched {
		return false // its waiters are full (await), or too many buckets are watched
	}
	if p.inflight == nil {
		p.inflight = map[leasecache.Owner][]*httpContext{}
	}
	p.inflight[h.bucket] = nil
	if len(p.watched) == 0 && !p.ticking {
		if err := proxywasm.SetTickPeriodMilliSeconds(watchTickMs); err != nil {
			delete(p.inflight, h.bucket)
			return false
		}
		p.ticking = true
	}
	p.watched = append(p.watched, h.bucket)
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

// OnTick looks again for the requests watching other VMs' refills (wake).
// The tick stops when nothing is watched.
func (p *pluginContext) OnTick() {
	watched := p.watched
	p.watched = p.watchedSpare[:0]
	for _, b := range watched {
		p.wake(b, true)
	}
	p.watchedSpare = watched[:0]
	if len(p.watched) == 0 && p.ticking {
		if proxywasm.SetTickPeriodMilliSeconds(0) == nil {
			p.ticking = false
		}
	}
	_ = proxywasm.SetEffectiveContext(p.rootID)
}

// wake decides again the requests waiting for bucket b's refill, each in
// its own context (the caller restores its own after). Watching another
// VM's refill, the first that finds it still in flight watches on and the
// rest wait with it, with no look at the slot of their own. Otherwise, as
// after this VM's own refill, each takes from the lease the refill brought,
// answers from its denial, or calls out itself: a waiter never queues
// behind another waiter's callout, so a failing service costs the waiters
// one timeout, not one each in turn.
func (p *pluginContext) wake(b leasecache.Owner, watching bool) {
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
		again = w.decideWaited(watching) && watching
	}
}

// release ends this request's lead: each waiter takes a token of the
// lease the answer brought, answers from a cached denial, or calls out
// itself; each in its own context.
func (h *httpContext) release() {
	if !h.leads {
		return
	}
	p := h.p
	h.leads = false
	// An answer that put a decision in the slot cleared the mark already.
	p.cache.EndRefill(h.bucket)
	p.wake(h.bucket, false)
	_ = proxywasm.SetEffectiveContext(h.contextID)
}

// decideWaited decides a request that waited for its bucket's refill: it
// takes a token of the lease the refill brought, answers from its denial,
// or calls out itself; with mayWait, while the slot says another VM's
// refill is in flight, it waits for that one (true).
func (h *httpContext) decideWaited(mayWait bool) (waits bool) {
	now := h.now()
	back, act, settled, refilling := h.spendLease(now)
	if settled {
		if act == types.ActionContinue {
			h.resume()
		}
		return false
	}
	if mayWait && h.wait(back, refilling) {
		return true
	}
	h.callOut(back, now)
	return false
}
