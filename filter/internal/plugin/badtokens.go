package plugin

import (
	"encoding/binary"
	"net/netip"
)

// A token's signature is checked in the VM (RS256 and ES256 cost up to
// milliseconds inside Wasm), before the rate limiter looks at the request:
// a client sending a new junk token on every request, refused or not,
// would have the VM check each one (an outsider's attack: 460 junk ES256
// tokens a second, all answered 429, cut another client's throughput 60
// times). So each client address (an IPv6 one by its /64) gets at most
// badTokenBudget failed checks a second per VM; addresses failing again
// within the second share badTokenTotal, and first failures of the
// second badTokenFresh. Past them tokens are not checked (a token
// verified before still is: the verifier's cache) and count as invalid,
// which leaves the request to its address's limit, or refuses it with
// jwt.reject_invalid. Only a signature check counts (jwt.VerifyIf asks
// after every cheap check): an expired token costs no budget.
//
// The first failures have their own total so that a few addresses cannot
// spend everyone's checks: with one total for all, an outsider's five
// addresses filled it at the start of each second, and every other
// client's new valid token went unchecked (401 under reject_invalid). To
// do that now takes badTokenFresh new addresses a second per VM, and the
// VM checks at most badTokenFresh + badTokenTotal bad signatures a second
// (ES256, the dearest: about 0.13 CPU-seconds a second).
const (
	badTokenBudget = 16
	badTokenTotal  = 64
	badTokenFresh  = 128
	badTokenSlots  = 256
)

// badTokens counts failed token checks per client address, in one-second
// windows, in a two-way table indexed by a keyed hash of the address (the
// lease cache's, secret per process). An address's count lives in either
// of its two slots and nothing resets it within its second: an outsider's
// two addresses that shared the single slot of an unkeyed table reset
// each other's count on every request, and the budget never bound. An
// address whose two slots both count other addresses in the second is
// not checked (the table is full of failing clients).
type badTokens struct {
	slots [badTokenSlots]badTokenSlot
	// again counts the failures this second of addresses that had failed
	// before in it, first their first ones.
	again, first badTokenSlot
}

type badTokenSlot struct {
	addr  netip.Addr
	start int64 // the window's second
	n     int
}

// find returns a's slot counting in second sec (live), else the first of
// its two slots free in sec (nil when neither is).
func (b *badTokens) find(h uint64, a netip.Addr, sec int64) (s *badTokenSlot, live bool) {
	i, j := h%badTokenSlots, (h>>32)%badTokenSlots
	if i == j {
		j = (i + 1) % badTokenSlots
	}
	var free *badTokenSlot
	for _, k := range [2]uint64{i, j} {
		s := &b.slots[k]
		switch {
		case s.start == sec && s.addr == a:
			return s, true
		case s.start != sec && free == nil:
			free = s
		}
	}
	return free, false
}

// allow reports whether a's next token may be checked at nowMs (h is a's
// keyed hash, tokenAddrHash).
func (b *badTokens) allow(h uint64, a netip.Addr, nowMs int64) bool {
	sec := nowMs / 1000
	s, live := b.find(h, a, sec)
	switch {
	case s == nil:
		return false
	case live:
		return s.n < badTokenBudget && b.again.spent(sec) < badTokenTotal
	}
	return b.first.spent(sec) < badTokenFresh
}

// spent is what a total counts in second sec.
func (t *badTokenSlot) spent(sec int64) int {
	if t.start != sec {
		return 0
	}
	return t.n
}

// failed counts a failed check of a's token at nowMs.
func (b *badTokens) failed(h uint64, a netip.Addr, nowMs int64) {
	sec := nowMs / 1000
	s, live := b.find(h, a, sec)
	if s == nil {
		return // both slots taken: allow said no, nothing was checked
	}
	total := &b.again
	if !live {
		total = &b.first
		*s = badTokenSlot{addr: a, start: sec}
	}
	if total.start != sec {
		*total = badTokenSlot{start: sec}
	}
	total.n++
	s.n++
}

// tokenAddr is the address a's failed checks count under: an IPv6 client
// by its /64 (one host's addresses), an IPv4-mapped one as IPv4.
func tokenAddr(a netip.Addr) netip.Addr {
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.Addr()
	}
	return a
}

// tokenAddrHash is a's keyed hash: which slots an address takes cannot be
// worked out from outside.
func (p *pluginContext) tokenAddrHash(a netip.Addr) uint64 {
	b := p.cache.NewBucket()
	a16 := a.As16()
	b.AddBytes(a16[:])
	o := b.Owner()
	return binary.LittleEndian.Uint64(o[8:])
}
