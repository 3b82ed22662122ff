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
// none calls out itself. Other VMs are not coordinated (shared data has no
// notification): at most one refill per bucket per VM.

// maxWaiters bounds the requests waiting on one callout.
const maxWaiters = 64

// lead marks this request's callout as its bucket's refill.
func (h *httpContext) lead() {
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
	}
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
	h.waiting, h.paused = true, true
	return true
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
	waiters := p.inflight[h.bucket]
	delete(p.inflight, h.bucket)
	for _, w := range waiters {
		w.waiting = false
		if w.done {
			continue
		}
		if err := proxywasm.SetEffectiveContext(w.contextID); err != nil {
			continue // gone meanwhile
		}
		w.decideWaited()
	}
	_ = proxywasm.SetEffectiveContext(h.contextID)
}

// decideWaited decides a request that waited for its bucket's refill.
func (h *httpContext) decideWaited() {
	now := h.now()
	back, act, settled := h.spendLease(now)
	if settled {
		if act == types.ActionContinue {
			h.resume()
		}
		return
	}
	h.callOut(back, now)
}
