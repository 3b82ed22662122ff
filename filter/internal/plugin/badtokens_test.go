package plugin

import (
	"net/netip"
	"testing"
)

// Two addresses in one slot keep their own counts: neither resets the
// other's (an outsider's pair, 127.0.0.2 and 127.0.1.227, shared the single
// slot of an unkeyed table and so were never refused), a third in both of
// their slots is not checked, and the next second starts afresh.
func TestBadTokensCollidingAddresses(t *testing.T) {
	var b badTokens
	a, c, d := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.1.227"), netip.MustParseAddr("10.9.9.9")
	const h, now = 12345, 1_000_000
	for i := range badTokenBudget {
		if !b.allow(h, a, now) {
			t.Fatalf("a refused after %d failures", i)
		}
		b.failed(h, a, now)
		if !b.allow(h, c, now) {
			t.Fatalf("c refused after a's %d failures", i+1)
		}
		b.failed(h, c, now)
	}
	if b.allow(h, a, now) || b.allow(h, c, now) {
		t.Fatal("an address past its budget is still checked: the other reset it")
	}
	if b.allow(h, d, now) {
		t.Fatal("a third address in two slots counting others is checked")
	}
	if !b.allow(h, a, now+1000) || !b.allow(h, d, now+1000) {
		t.Fatal("the next second does not check again")
	}
}

// Addresses failing again within a second share badTokenTotal failed
// checks, and an address with no failure in the second is still checked
// past that total (an outsider's five addresses filled one shared total at
// each second's start, and every other client's new token went
// unchecked), up to badTokenFresh such addresses a second.
func TestBadTokensTotals(t *testing.T) {
	var b badTokens
	const now = 1_000_000
	// i*odd is a bijection mod 256: distinct i below 256 take distinct
	// first slots.
	addr := func(i int) (uint64, netip.Addr) {
		return uint64(i) * 2654435761, netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})
	}
	failures := 0
	for i := 200; i < 205; i++ {
		h, a := addr(i)
		for b.allow(h, a, now) {
			b.failed(h, a, now)
			failures++
		}
	}
	if failures != 5+badTokenTotal {
		t.Fatalf("five failing addresses got %d checks, want %d first and %d more", failures, 5, badTokenTotal)
	}
	if h, a := addr(210); !b.allow(h, a, now) {
		t.Fatal("an address with no failure is not checked once the others spent their total")
	}
	for i := 0; i < badTokenFresh-5; i++ {
		h, a := addr(i)
		if !b.allow(h, a, now) {
			t.Fatalf("new address %d refused after %d first failures", i, 5+i)
		}
		b.failed(h, a, now)
	}
	if h, a := addr(220); b.allow(h, a, now) {
		t.Fatal("a new address is checked past the first failures' total")
	}
	if h, a := addr(220); !b.allow(h, a, now+1000) {
		t.Fatal("the next second does not check again")
	}
}

// An IPv6 client counts by its /64; an IPv4-mapped one as IPv4.
func TestTokenAddr(t *testing.T) {
	for in, want := range map[string]string{
		"2001:db8:1:2:aaaa::1": "2001:db8:1:2::", "2001:db8:1:2:ffff:1:2:3": "2001:db8:1:2::",
		"::ffff:192.0.2.7": "192.0.2.7", "192.0.2.7": "192.0.2.7",
	} {
		if got := tokenAddr(netip.MustParseAddr(in)); got != netip.MustParseAddr(want) {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}
