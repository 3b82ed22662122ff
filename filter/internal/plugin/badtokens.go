package plugin

import (
	"encoding/binary"
	"math"
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
// second badTokenFresh, at most badTokenFreshPerNet of them from one
// network (an IPv6 /56; an IPv4 address alone). Past them tokens are not checked (a
// token verified before still is: the verifier's cache) and count as
// invalid, which leaves the request to its address's limit, or refuses it
// with jwt.reject_invalid. Only a signature check counts (jwt.VerifyIf
// asks after every cheap check): an expired token costs no budget.
//
// First failures have their own total so that a few addresses cannot
// spend everyone's checks (with one total for all, an outsider's five
// addresses filled it at the start of each second, and every other
// client's new valid token went unchecked), and a network its own share
// of it: with the total alone, the 256 /64s of one IPv6 /56 (a home's
// allocation) filled it every second. Filling it now takes 16 /56s, or
// 128 IPv4 addresses, a second per VM; a network locks out no one but
// itself.
// Networks are counted in a count-min sketch (4 rows of 1,024 counters
// over the network's keyed hash), which has no slots to take: with a
// two-way table, an outsider's networks held another /56's two slots and
// each of its new /64s escaped the cap (three /56s spent the first
// failures' total). An address whose two slots count others in the
// second is checked as any first failure is, once: a set of the addresses that
// failed in the second (a Bloom filter over their keyed hashes, which has
// no slots to take) tells its later failures apart, and those share an
// overflow of badTokenOverflow a second. So it is never refused for its
// slots alone (16 addresses filling a victim's two slots locked it out;
// with the overflow alone, 64 addresses locked out the tenth of everyone
// whose slots they held), and never uncounted either (an outsider's 64 to
// 96 addresses, some without a slot, failed again and again as first
// failures and spent the first failures' total alone).
// A VM checks at most badTokenFresh + badTokenTotal bad signatures a
// second (ES256, the dearest: about 0.13 CPU-seconds).
const (
	badTokenBudget      = 16
	badTokenTotal       = 64
	badTokenFresh       = 128
	badTokenFreshPerNet = 8
	badTokenOverflow    = 16
	badTokenSlots       = 256
	badTokenNetRows     = 4
	badTokenNetWidth    = 1024 // the networks' sketch: 8 KiB
	badTokenFailBits    = 8192 // the Bloom filter: 1 KiB, 3 bits an address
)

// badTokens counts failed token checks per client address and per network,
// in one-second windows: addresses in a two-way table, networks in the
// sketch, both indexed by a keyed hash (the lease cache's, secret per
// process). An address's count lives in either
// of its two slots and nothing resets it within its second: an outsider's
// two addresses that shared the single slot of an unkeyed table reset
// each other's count on every request, and the budget never bound.
type badTokens struct {
	slots [badTokenSlots]badTokenSlot
	// nets counts each network's first failures of second netSec.
	nets   [badTokenNetRows][badTokenNetWidth]uint16
	netSec int64
	// again counts the failures this second of addresses that had failed
	// before in it, first their first ones, overflow the later ones of
	// clients without a slot of their own.
	again, first, overflow badTokenSlot
	// failing holds the addresses that failed this second (failSec).
	failing [badTokenFailBits / 64]uint64
	failSec int64
}

// failedBefore reports whether c's address failed a check in second sec
// (a false yes now and then: an address with no slot then shares the
// overflow at once).
func (b *badTokens) failedBefore(c tokenClient, sec int64) bool {
	if b.failSec != sec {
		return false
	}
	for _, bit := range failBits(c.h) {
		if b.failing[bit/64]&(1<<(bit%64)) == 0 {
			return false
		}
	}
	return true
}

// markFailed adds c's address to the second's failing set.
func (b *badTokens) markFailed(c tokenClient, sec int64) {
	if b.failSec != sec {
		b.failing, b.failSec = [badTokenFailBits / 64]uint64{}, sec
	}
	for _, bit := range failBits(c.h) {
		b.failing[bit/64] |= 1 << (bit % 64)
	}
}

// failBits are the Bloom filter's bits for keyed hash h: three of its
// 13-bit pieces (the slots' indices use its low bits and bits 32 up).
func failBits(h uint64) [3]uint64 {
	const mask = badTokenFailBits - 1
	return [3]uint64{(h >> 13) & mask, (h >> 45) & mask, (h>>26 ^ h) & mask}
}

type badTokenSlot struct {
	addr  netip.Addr
	start int64 // the window's second
	n     int
}

// tokenClient is who a token's check counts for: its address with its
// keyed hash, and its network's keyed hash.
type tokenClient struct {
	addr    netip.Addr
	h, hNet uint64
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

// allow reports whether c's next token may be checked at nowMs.
func (b *badTokens) allow(c tokenClient, nowMs int64) bool {
	sec := nowMs / 1000
	s, live := b.find(c.h, c.addr, sec)
	if live {
		return s.n < badTokenBudget && b.again.spent(sec) < badTokenTotal
	}
	if b.first.spent(sec) >= badTokenFresh {
		return false
	}
	if s == nil && b.failedBefore(c, sec) && b.overflow.spent(sec) >= badTokenOverflow {
		return false
	}
	return b.netFailures(c.hNet, sec) < badTokenFreshPerNet
}

// netFailures is what the sketch counts for the network of keyed hash h
// in second sec: at least its first failures (more when every row it
// takes is shared with others).
func (b *badTokens) netFailures(h uint64, sec int64) int {
	if b.netSec != sec {
		return 0
	}
	n := uint16(math.MaxUint16)
	for row := range b.nets {
		n = min(n, b.nets[row][netColumn(h, row)])
	}
	return int(n)
}

// countNet adds n failed checks of the network of keyed hash h in second
// sec.
func (b *badTokens) countNet(h uint64, sec int64, n int) {
	if b.netSec != sec {
		b.nets, b.netSec = [badTokenNetRows][badTokenNetWidth]uint16{}, sec
	}
	for row := range b.nets {
		c := &b.nets[row][netColumn(h, row)]
		*c = uint16(min(int(*c)+n, math.MaxUint16))
	}
}

// netColumn is h's counter in a row: 10 of its bits, other ones each row.
func netColumn(h uint64, row int) uint64 { return (h >> (16 * row)) % badTokenNetWidth }

// spent is what a total counts in second sec.
func (t *badTokenSlot) spent(sec int64) int {
	if t.start != sec {
		return 0
	}
	return t.n
}

// add adds n to a slot (or total) for second sec, starting it afresh for
// a, when it counted another second.
func (t *badTokenSlot) add(a netip.Addr, sec int64, n int) {
	if t.start != sec {
		*t = badTokenSlot{addr: a, start: sec}
	}
	t.n += n
}

// failed counts a failed token of c at nowMs that cost checks checks (a
// token without kid is tried against every key of its alg, a long one is
// read before its checks: jwt.VerifyIf). Every bound counts checks, the
// first failures' total too: counted a token each, 200 addresses sending
// junk worth 8 checks had 1,024 checks a second run where the bound says
// 192 (attack 46 A2).
func (b *badTokens) failed(c tokenClient, nowMs int64, checks int) {
	sec := nowMs / 1000
	s, live := b.find(c.h, c.addr, sec)
	if live {
		b.again.add(netip.Addr{}, sec, checks)
		s.n += checks
		return
	}
	if s == nil && b.failedBefore(c, sec) {
		b.overflow.add(netip.Addr{}, sec, checks)
	} else {
		b.first.add(netip.Addr{}, sec, checks)
	}
	b.markFailed(c, sec)
	if s != nil {
		s.add(c.addr, sec, checks)
	}
	b.countNet(c.hNet, sec, checks)
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

// tokenNet is the network a's failed first checks count under: an IPv6
// /56, a home's allocation (its /64s are one subscriber's, free to
// rotate); an IPv4 address by itself (addresses are scarce, and a /24 is
// often many unrelated clients: an outsider's eight addresses in one /24,
// with the /24 counted as one network, refused its neighbours' new tokens
// for as long as they sent junk, and one /60 did the same to its /48).
func tokenNet(a netip.Addr) netip.Addr {
	a = a.Unmap()
	if a.Is4() {
		return a
	}
	p, _ := a.Prefix(56)
	return p.Addr()
}

// tokenClient is the client a check of a token from address a counts for.
func (p *pluginContext) tokenClient(a netip.Addr) tokenClient {
	c := tokenClient{addr: tokenAddr(a), hNet: p.tokenAddrHash(tokenNet(a))}
	c.h = p.tokenAddrHash(c.addr)
	return c
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
