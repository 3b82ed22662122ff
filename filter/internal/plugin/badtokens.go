package plugin

import "net/netip"

// A token's signature is checked in the VM (RS256 and ES256 cost up to
// milliseconds inside Wasm), before the rate limiter looks at the request:
// a client sending a new junk token on every request, refused or not,
// would have the VM check each one (an outsider's attack: 460 junk ES256
// tokens a second, all answered 429, cut another client's throughput 60
// times). So each client address gets at most badTokenBudget failed checks
// a second per VM; past them its tokens are not checked (a token verified
// before still is: the verifier's cache) and count as invalid, which
// leaves the request to its address's limit, or refuses it with
// jwt.reject_invalid.
const (
	badTokenBudget = 16
	badTokenSlots  = 256
)

// badTokens counts failed token checks per client address, in one-second
// windows, in a small table: an address another one displaces starts
// afresh, which costs at most a budget more of checks.
type badTokens struct {
	slots [badTokenSlots]badTokenSlot
}

type badTokenSlot struct {
	addr  netip.Addr
	start int64 // the window's second
	n     int
}

func (b *badTokens) slot(a netip.Addr) *badTokenSlot {
	h := uint64(0)
	for _, c := range a.As16() {
		h = h*31 + uint64(c)
	}
	return &b.slots[h%badTokenSlots]
}

// allow reports whether a's next token may be checked at nowMs.
func (b *badTokens) allow(a netip.Addr, nowMs int64) bool {
	s := b.slot(a)
	return s.addr != a || s.start != nowMs/1000 || s.n < badTokenBudget
}

// failed counts a failed check of a's token at nowMs.
func (b *badTokens) failed(a netip.Addr, nowMs int64) {
	s := b.slot(a)
	if s.addr != a || s.start != nowMs/1000 {
		*s = badTokenSlot{addr: a, start: nowMs / 1000}
	}
	s.n++
}
