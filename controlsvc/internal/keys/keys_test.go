package keys

import (
	"fmt"
	"strings"
	"testing"
)

func TestCounterGolden(t *testing.T) {
	tests := []struct {
		scope, subject, rule, endpoint, algo string
		window                               int64
		want                                 string
	}{
		{"user", "alice", "tier_free", "", "token_bucket", 60, "rl:{user:alice}:tier_free:token_bucket:60"},
		{"ip", "2001:db8::1", "anon", "/api/v1/search", "sliding_window", 60, "rl:{ip:2001:db8::1}:anon:/api/v1/search:sliding_window:60"},
		{"global", "*", "all", "", "gcra", 1, "rl:{global:*}:all:gcra:1"},
		{"user", "evil}x{y", "r", "", "fixed_window", 10, "rl:{user:evil%7Dx%7By}:r:fixed_window:10"},
		{"user", "50%", "r", "/a:b c", "fixed_window", 10, "rl:{user:50%25}:r:/a%3Ab%20c:fixed_window:10"},
		{"user", "a\r\nb", "r", "", "gcra", 5, "rl:{user:a%0D%0Ab}:r:gcra:5"},
		{"user", "a", "r", "/" + strings.Repeat("x", 63), "gcra", 5, "rl:{user:a}:r:/" + strings.Repeat("x", 63) + ":gcra:5"},
		{"user", "a", "r", "/" + strings.Repeat("x", 64), "gcra", 5, "rl:{user:a}:r:%hnnYghF-guA5RQqsd9r4UPH-4:gcra:5"},
	}
	for _, tt := range tests {
		got := Counter(NewOwner(tt.scope, tt.subject), tt.rule, tt.endpoint, tt.algo, tt.window)
		if got != tt.want {
			t.Errorf("Counter(%q, %q) = %q, want %q", tt.subject, tt.endpoint, got, tt.want)
		}
	}
	o := NewOwner("user", "alice")
	if got, want := Penalty(o), "rl:{user:alice}:penalty"; got != want {
		t.Errorf("Penalty = %q, want %q", got, want)
	}
	if Slot(Penalty(o)) != Slot(Counter(o, "r", "/x", "gcra", 1)) || Slot(Block(o)) != Slot(Penalty(o)) {
		t.Error("an owner's counter, penalty and block keys must share a slot")
	}
}

func TestSlotKnownValues(t *testing.T) {
	// Values from Redis' CLUSTER KEYSLOT.
	for key, want := range map[string]uint16{"foo": 12182, "bar": 5061, "{user1000}.following": 3443, "{user1000}.followers": 3443, "foo{}{bar}": 8363} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
}

func ExampleCounter() {
	owner := NewOwner("user", "alice")
	fmt.Println(Counter(owner, "tier_free", "/api/v1/search", "sliding_window", 60))
	fmt.Println(Counter(NewOwner("user", "}{evil"), "tier_free", "", "token_bucket", 60))
	// Output:
	// rl:{user:alice}:tier_free:/api/v1/search:sliding_window:60
	// rl:{user:%7D%7Bevil}:tier_free:token_bucket:60
}

func FuzzCounter(f *testing.F) {
	f.Add("alice", "bob", "/a", "/b")
	f.Add("a}b", "a%7Db", "/x:y", "/x%3Ay")
	f.Add("{x}", "x", "", "/")
	f.Fuzz(func(t *testing.T, s1, s2, e1, e2 string) {
		k1 := Counter(NewOwner("user", s1), "r", e1, "token_bucket", 60)
		k2 := Counter(NewOwner("user", s2), "r", e2, "token_bucket", 60)
		if (s1 != s2 || e1 != e2) && k1 == k2 {
			t.Fatalf("(%q,%q) and (%q,%q) share key %q", s1, e1, s2, e2, k1)
		}
		// The hash tag is always exactly the owner: no subject can pick a slot.
		if Slot(k1) != crc16("user:"+escape(s1, false))%16384 {
			t.Fatalf("subject %q moved key %q out of its owner's slot", s1, k1)
		}
		if strings.ContainsAny(k1, "\r\n ") {
			t.Fatalf("key %q carries raw whitespace", k1)
		}
		if len(k1) > len(Counter(NewOwner("user", s1), "r", "", "token_bucket", 60))+1+MaxEndpointPart {
			t.Fatalf("key %q is longer than its endpoint bound", k1)
		}
	})
}

func TestOverrideFieldRoundTrip(t *testing.T) {
	for _, tt := range [][2]string{{"user:alice", "/api/v1/items"}, {"user:a b%7D{c}", "/x:y/%zz"}, {"ip:2001:db8::1", "/"}, {"key:k_1\r\n", "/a+b"}} {
		id, ep, ok := ParseOverrideField(OverrideField(tt[0], tt[1]))
		if !ok || id != tt[0] || ep != tt[1] {
			t.Errorf("%q %q came back as %q %q %v", tt[0], tt[1], id, ep, ok)
		}
	}
}

// FuzzOverrideField: whatever the identity and endpoint, the field reads
// back as them.
func FuzzOverrideField(f *testing.F) {
	f.Add("user:a b", "/x y%z")
	f.Fuzz(func(t *testing.T, id, ep string) {
		gotID, gotEP, ok := ParseOverrideField(OverrideField(id, ep))
		if !ok || gotID != id || gotEP != ep {
			t.Fatalf("%q %q came back as %q %q %v", id, ep, gotID, gotEP, ok)
		}
	})
}
