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

// All addresses together get badTokenTotal failed checks a second.
func TestBadTokensTotal(t *testing.T) {
	var b badTokens
	const now = 1_000_000
	for i := range badTokenTotal {
		a := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		if !b.allow(uint64(i)*2654435761, a, now) {
			t.Fatalf("address %d refused after %d failures in all", i, i)
		}
		b.failed(uint64(i)*2654435761, a, now)
	}
	if b.allow(99, netip.MustParseAddr("192.0.2.1"), now) {
		t.Fatal("a new address is checked past the total")
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
