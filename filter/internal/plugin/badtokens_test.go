package plugin

import (
	"net/netip"
	"testing"
)

// tc is a client with the given hashes (tests choose the slots).
func tc(h, hNet uint64, addr string) tokenClient {
	a := netip.MustParseAddr(addr)
	return tokenClient{addr: tokenAddr(a), h: h, hNet: hNet}
}

// Two addresses in one slot keep their own counts: neither resets the
// other's (an outsider's pair, 127.0.0.2 and 127.0.1.227, shared the single
// slot of an unkeyed table and so were never refused); a third in both of
// their slots is checked all the same (an outsider's addresses filling a
// victim's two slots locked it out), within its network's share of first
// failures; the next second starts afresh.
func TestBadTokensCollidingAddresses(t *testing.T) {
	var b badTokens
	const h, now = 12345, 1_000_000
	a, c, d := tc(h, 1, "127.0.0.2"), tc(h, 2, "127.0.1.227"), tc(h, 3, "10.9.9.9")
	for i := range badTokenBudget {
		if !b.allow(a, now) {
			t.Fatalf("a refused after %d failures", i)
		}
		b.failed(a, now, 1)
		if !b.allow(c, now) {
			t.Fatalf("c refused after a's %d failures", i+1)
		}
		b.failed(c, now, 1)
	}
	if b.allow(a, now) || b.allow(c, now) {
		t.Fatal("an address past its budget is still checked: the other reset it")
	}
	for i := range badTokenFreshPerNet {
		if !b.allow(d, now) {
			t.Fatalf("a third address in two slots counting others refused after %d failures", i)
		}
		b.failed(d, now, 1)
	}
	if b.allow(d, now) {
		t.Fatal("an address with no slot is checked past its network's share")
	}
	if !b.allow(a, now+1000) || !b.allow(d, now+1000) {
		t.Fatal("the next second does not check again")
	}
}

// Clients without a slot of their own in the second (both of their slots
// count others) are checked once, as any first failure, and their later
// failures share badTokenOverflow: an outsider's 64 to 96 addresses, those
// without a slot failing as "first" again and again, spent the first
// failures' total alone and refused everyone's new tokens (a 503 loop);
// with the overflow alone, 64 addresses taking victims' slots and one
// slotless address spending the overflow refused a tenth of all clients,
// who had never failed.
func TestBadTokensWithoutASlot(t *testing.T) {
	var b badTokens
	const h, now = 777, 5_000_000
	for i, addr := range []string{"192.0.2.1", "192.0.2.2"} { // both slots of h, live
		c := tc(h, uint64(100+i), addr)
		if !b.allow(c, now) {
			t.Fatal("a first failure refused")
		}
		b.failed(c, now, 1)
	}
	slotless := func(k int) tokenClient {
		c := tc(h, uint64(200+k), netip.AddrFrom4([4]byte{198, 51, 100, byte(k)}).String())
		// The same two slots (h's bits 0-7 and 32-39), the rest of the
		// hash another client's.
		c.h = h | (uint64(k+1)*0x9E3779B97F4A7C15)&^(0xFF|0xFF<<32)
		return c
	}
	checked := 0
	for k := range 50 {
		for range 10 {
			if x := slotless(k); b.allow(x, now) {
				checked++
				b.failed(x, now, 1)
			}
		}
	}
	if want := 50 + badTokenOverflow; checked != want {
		t.Fatalf("50 addresses without a slot got %d checks; want one each and %d between them", checked, badTokenOverflow)
	}
	if victim := slotless(77); !b.allow(victim, now) {
		t.Fatal("a client without a slot that never failed refused: the overflow is spent by others")
	}
	if other := tc(999, 999, "203.0.113.9"); !b.allow(other, now) {
		t.Fatal("an address with a slot of its own refused: the slotless spent the first failures' total")
	}
	if x := slotless(3); !b.allow(x, now+1000) {
		t.Fatal("the next second does not check a slotless address again")
	}
}

// A network's first failures are capped whatever other networks do: the
// sketch has no slots to take (with a two-way table, three /56s held
// another's two slots, each of its new /64s escaped the cap, and they
// spent the first failures' total).
func TestBadTokensNetworkCapHasNoSlots(t *testing.T) {
	var b badTokens
	const now = 9_000_000
	mix := func(i uint64) uint64 { return (i + 1) * 0x9E3779B97F4A7C15 }
	for i := range uint64(100) { // 100 other networks fail first
		c := tokenClient{addr: netip.AddrFrom4([4]byte{10, 0, byte(i), 1}), h: mix(i), hNet: mix(i + 1000)}
		if !b.allow(c, now) {
			t.Fatalf("network %d refused", i)
		}
		b.failed(c, now, 1)
	}
	checked := 0
	for i := range uint64(40) { // one /56's /64s, each an address of its own
		c := tokenClient{addr: netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 7, 0, byte(i)}), h: mix(i + 5000), hNet: 0xabcdef}
		if b.allow(c, now) {
			checked++
			b.failed(c, now, 1)
		}
	}
	if checked != badTokenFreshPerNet {
		t.Fatalf("one network's new addresses got %d first checks; want %d", checked, badTokenFreshPerNet)
	}
	if other := (tokenClient{addr: netip.MustParseAddr("203.0.113.7"), h: mix(9999), hNet: mix(8888)}); !b.allow(other, now) {
		t.Fatal("another network refused")
	}
}

// Addresses failing again within a second share badTokenTotal failed
// checks; an address with no failure in the second is still checked past
// that total (an outsider's five addresses filled one shared total at each
// second's start, and every other client's new token went unchecked), up
// to badTokenFresh first failures a second, badTokenFreshPerNet of them
// from one network (the 256 /64s of one IPv6 /56 filled the total alone).
func TestBadTokensTotals(t *testing.T) {
	var b badTokens
	const now = 1_000_000
	// i*odd is a bijection mod 256: distinct i below 256 take distinct
	// first slots; each i its own /24 unless said otherwise.
	addr := func(i int) tokenClient {
		return tokenClient{addr: netip.AddrFrom4([4]byte{10, byte(i), 0, 1}), h: uint64(i) * 2654435761, hNet: uint64(i) * 40503}
	}
	failures := 0
	for i := 200; i < 205; i++ {
		for c := addr(i); b.allow(c, now); failures++ {
			b.failed(c, now, 1)
		}
	}
	if failures != 5+badTokenTotal {
		t.Fatalf("five failing addresses got %d checks, want %d first and %d more", failures, 5, badTokenTotal)
	}
	if !b.allow(addr(210), now) {
		t.Fatal("an address with no failure is not checked once the others spent their total")
	}
	// One network's addresses: its share of first failures, then no more.
	net := func(i int) tokenClient {
		c := addr(i)
		c.hNet = 99 // one network
		return c
	}
	for i := 0; i < badTokenFreshPerNet; i++ {
		if !b.allow(net(i), now) {
			t.Fatalf("address %d of one network refused after %d", i, i)
		}
		b.failed(net(i), now, 1)
	}
	if b.allow(net(100), now) {
		t.Fatal("a network's new address is checked past its share of first failures")
	}
	if !b.allow(addr(211), now) {
		t.Fatal("another network's address is refused for one network's failures")
	}
	for i := 10; 5+badTokenFreshPerNet+i-10 < badTokenFresh; i++ {
		if !b.allow(addr(i), now) {
			t.Fatalf("new address %d refused before the total", i)
		}
		b.failed(addr(i), now, 1)
	}
	if b.allow(addr(220), now) {
		t.Fatal("a new address is checked past the first failures' total")
	}
	if !b.allow(addr(220), now+1000) {
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

// First failures count by network too: an IPv6 /56, an IPv4 address
// alone (a /24 is often unrelated clients: one of them locked the others
// out).
func TestTokenNet(t *testing.T) {
	for in, want := range map[string]string{
		"2001:db8:ab:cd00::1": "2001:db8:ab:cd00::", "2001:db8:ab:cdff:1::2": "2001:db8:ab:cd00::",
		"::ffff:192.0.2.7": "192.0.2.7", "192.0.2.250": "192.0.2.250",
	} {
		if got := tokenNet(netip.MustParseAddr(in)); got != netip.MustParseAddr(want) {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}

// fixedReadLengths holds the length of every name readRequest always
// reads: a name whose length it lacks would be passed over unread.
func TestReadLengthsOfFixedNames(t *testing.T) {
	names := append([]string{":path", ":method", "authorization", "x-forwarded-for", "x-real-ip",
		"content-length", "content-type", "content-encoding", "x-request-id"}, overrideHeaders[:]...)
	for _, name := range names {
		if fixedReadLengths&(1<<len(name)) == 0 {
			t.Errorf("%s (%d bytes) is not among the lengths read", name, len(name))
		}
	}
	if m := readLengths("x-api-key", []string{"x-units"}); m&(1<<len("x-api-key")) == 0 || m&(1<<len("x-units")) == 0 {
		t.Errorf("the configured names' lengths are not read: %b", m)
	}
}

// The bounds count checks, not tokens: 200 addresses sending junk worth
// eight checks each (no kid, four RSA keys over 2048 bits), all of them
// round after round within one second, have no more checks run than the
// totals allow, give or take a token's worth each (a token is checked
// while its address or total has room). Counted a token each, the first
// failures' total let 1,024 checks through (attack 46 A2).
func TestBadTokensCountChecks(t *testing.T) {
	for _, checks := range []int{1, 2, 8, 16} {
		var b badTokens
		const now = 5_000_000
		ran := 0
		for range 50 {
			for i := range 200 {
				c := tokenClient{addr: netip.AddrFrom4([4]byte{127, 45, byte(i / 250), byte(i%250 + 1)}),
					h: uint64(i+1) * 0x9e3779b97f4a7c15, hNet: uint64(i+1) * 0xc2b2ae3d27d4eb4f}
				if b.allow(c, now) {
					ran += checks
					b.failed(c, now, checks)
				}
			}
		}
		if most := badTokenFresh + badTokenTotal + badTokenOverflow + 3*(checks-1); ran > most {
			t.Errorf("tokens of %d checks: %d checks ran in a second, want at most %d", checks, ran, most)
		}
	}
}
