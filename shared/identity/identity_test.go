package identity

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr bool
	}{
		{"alice", "user:alice", false},
		{"user:alice", "user:alice", false},
		{"user:bob@example.com", "user:bob@example.com", false},
		{"key:k_123", "key:k_123", false},
		{"ip:192.0.2.1", "ip:192.0.2.1", false},
		{"ip:2001:DB8:0:0::1", "ip:2001:db8::1", false},
		{"ip:::ffff:192.0.2.7", "ip:192.0.2.7", false},
		{"ip:[2001:db8::1]:443", "ip:2001:db8::1", false},
		{"ip:fe80::1%eth0", "ip:fe80::1", false},
		{"user:{tag}", "user:{tag}", false},  // braces are escaped by keys, not refused
		{"tenant:x", "user:tenant:x", false}, // unknown prefix: a bare user id
		{"", "", true},
		{"user:", "", true},
		{"ip:not-an-ip", "", true},
		{"ip:unknown", "ip:unknown", false},
		{"ip:0.0.0.0", "ip:0.0.0.0", false}, // a real (if odd) address, not the unknown bucket
		{"user:a\r\nX-Evil: 1", "", true},
		{"user:a\x00b", "", true},
		{"user:\xff\xfe", "", true},
		{"user:admin\u202egnp.exe", "", true}, // right-to-left override: shown as another name
		{"user:ad\u200bmin", "", true},        // zero-width space: "admin" to the eye
		{"user:a\u2066b\u2069", "", true},     // isolates
		{"user:\ufeffadmin", "", true},        // byte-order mark
		// Drawn as nothing after a name (attack 53: users all shown
		// "alice" in the console's key list).
		{"user:alice\u034f", "", true},     // combining grapheme joiner
		{"user:alice\u3164", "", true},     // Hangul filler
		{"user:alice\uffa0", "", true},     // halfwidth Hangul filler
		{"user:alice\u115f", "", true},     // Hangul choseong filler
		{"user:alice\u2028", "", true},     // line separator
		{"user:alice\u2029", "", true},     // paragraph separator
		{"user:alice\u17b4", "", true},     // Khmer inherent vowel
		{"user:alice\U0001bca0", "", true}, // shorthand format control
		{"user:alice\u206f", "", true},     // nominal digit shapes
		{"user:alice\U000e0001", "", true}, // the language tag
		{"user:alice\U000e0200", "", true}, // unassigned, default ignorable
		// Emoji are spelled with variation selectors and tags: a token's
		// subject with one kept its name (attack 55).
		{"user:h\u2764\ufe0f", "user:h\u2764\ufe0f", false}, // a heart drawn as an emoji
		{"user:\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f", "user:\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f", false}, // Scotland's flag
		{"user:\u845b\U000e0100", "user:\u845b\U000e0100", false}, // an ideograph's variant
		{"user:a\u180b", "user:a\u180b", false},                   // a Mongolian variation selector
		{"user:\u00e9l\u00e8ve", "user:\u00e9l\u00e8ve", false},   // accents stay
		{"user:café", "user:café", false},                         // letters outside ASCII are fine
		{"user:" + strings.Repeat("a", 10_000), "", true},
		{strings.Repeat("a", MaxIDLen), "user:" + strings.Repeat("a", MaxIDLen), false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%.40q", tt.in), func(t *testing.T) {
			got, err := Parse(tt.in)
			if tt.wantErr {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("Parse(%q) = %v, %v; want ErrInvalid", tt.in, got, err)
				}
				return
			}
			if err != nil || got.String() != tt.want {
				t.Fatalf("Parse(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestClientIP(t *testing.T) {
	tests := []struct {
		name string
		in   ClientIPInput
		want string
		src  ClientIPSource
	}{
		{"source address by default", ClientIPInput{SourceAddress: "198.51.100.9:5000"}, "198.51.100.9", SourceConnection},
		{"xff ignored without trusted hops", ClientIPInput{ForwardedFor: "1.1.1.1, 198.51.100.9", SourceAddress: "198.51.100.9:5000"}, "198.51.100.9", SourceConnection},
		{"one hop: entry left of the peer's", ClientIPInput{ForwardedFor: "203.0.113.5, 10.0.0.1", XFFTrustedHops: 1, SourceAddress: "10.0.0.1:1"}, "203.0.113.5", SourceForwardedFor},
		{"one hop: client-written head ignored", ClientIPInput{ForwardedFor: "1.1.1.1, 203.0.113.5, 10.0.0.1", XFFTrustedHops: 1}, "203.0.113.5", SourceForwardedFor},
		{"two hops", ClientIPInput{ForwardedFor: "6.6.6.6, 203.0.113.5, 10.0.0.1, 10.0.0.2", XFFTrustedHops: 2}, "203.0.113.5", SourceForwardedFor},
		{"fewer entries than hops: source", ClientIPInput{ForwardedFor: "203.0.113.5", XFFTrustedHops: 1, SourceAddress: "198.51.100.9"}, "198.51.100.9", SourceConnection},
		{"garbage entry falls through", ClientIPInput{ForwardedFor: "evil, 10.0.0.1", XFFTrustedHops: 1, SourceAddress: "198.51.100.9:1"}, "198.51.100.9", SourceConnection},
		{"empty entry falls through", ClientIPInput{ForwardedFor: ", 10.0.0.1", XFFTrustedHops: 1, SourceAddress: "198.51.100.9:1"}, "198.51.100.9", SourceConnection},
		{"ipv6 canonical", ClientIPInput{ForwardedFor: "2001:DB8::0:1, 10.0.0.1", XFFTrustedHops: 1}, "2001:db8::1", SourceForwardedFor},
		{"mapped ipv4 unmapped", ClientIPInput{SourceAddress: "[::ffff:192.0.2.1]:80"}, "192.0.2.1", SourceConnection},
		{"trusted real ip", ClientIPInput{RealIP: "203.0.113.8", TrustRealIP: true, SourceAddress: "10.0.0.2"}, "203.0.113.8", SourceRealIP},
		{"untrusted real ip ignored", ClientIPInput{RealIP: "203.0.113.8", SourceAddress: "10.0.0.2"}, "10.0.0.2", SourceConnection},
		{"10 kB of commas keeps the right end", ClientIPInput{ForwardedFor: strings.Repeat(",", 10_000) + "203.0.113.5, 10.0.0.1", XFFTrustedHops: 1}, "203.0.113.5", SourceForwardedFor},
		{"an entry cut by the length bound is not read", ClientIPInput{ForwardedFor: "203.0.113.5" + strings.Repeat(" ", MaxForwardedFor-len(", 10.0.0.1")-3) + ", 10.0.0.1", XFFTrustedHops: 1, SourceAddress: "198.51.100.9"}, "198.51.100.9", SourceConnection},
		{"hops beyond the bound never read xff", ClientIPInput{ForwardedFor: "203.0.113.5" + strings.Repeat(", 10.0.0.1", 20), XFFTrustedHops: MaxTrustedHops + 1, SourceAddress: "198.51.100.9"}, "198.51.100.9", SourceConnection},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, src, err := ClientIP(tt.in)
			if err != nil || got.String() != tt.want || src != tt.src {
				t.Fatalf("ClientIP = %v, %q, %v; want %s from %s", got, src, err, tt.want, tt.src)
			}
		})
	}
	if _, _, err := ClientIP(ClientIPInput{SourceAddress: "nonsense"}); err == nil {
		t.Fatal("ClientIP with no usable source: want an error")
	}
}

func ExampleParse() {
	id, _ := Parse("ip:::ffff:192.0.2.1")
	fmt.Println(id)
	id, _ = Parse("alice")
	fmt.Println(id)
	_, err := Parse("user:a\r\nb")
	fmt.Println(err)
	// Output:
	// ip:192.0.2.1
	// user:alice
	// invalid identity: id contains control or invisible format character U+000D
}

func ExampleClientIP() {
	addr, src, _ := ClientIP(ClientIPInput{
		ForwardedFor:   "6.6.6.6, 203.0.113.5, 10.0.0.1",
		XFFTrustedHops: 1,
		SourceAddress:  "10.0.0.1:4711",
	})
	fmt.Println(addr, src)
	// Output: 203.0.113.5 x-forwarded-for
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"alice", "ip:::1", "ip:1.2.3.4", "key:k", "user:{x}", "user:a\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Parse(s)
		if err != nil {
			return
		}
		// A canonical identity parses to itself, and never carries controls.
		again, err := Parse(id.String())
		if err != nil || again != id {
			t.Fatalf("Parse(%q) = %q, but re-parsing gives %q, %v", s, id, again, err)
		}
		if strings.ContainsAny(id.Value, "\r\n\x00") || len(id.Value) > MaxIDLen {
			t.Fatalf("Parse(%q) kept a hostile value %q", s, id.Value)
		}
	})
}

func FuzzClientIP(f *testing.F) {
	f.Add("1.1.1.1, 203.0.113.5, 10.0.0.1", 1, "10.0.0.2:1")
	f.Add(",,,", 2, "::1")
	f.Fuzz(func(t *testing.T, xff string, depth int, src string) {
		if depth < 0 || depth > MaxTrustedHops+1 {
			return
		}
		a, _, err := ClientIP(ClientIPInput{ForwardedFor: xff, XFFTrustedHops: depth, SourceAddress: src})
		if err != nil {
			return
		}
		if a.Is4In6() || a.Zone() != "" {
			t.Fatalf("ClientIP gave a non-canonical address %v", a)
		}
	})
}

func TestBucket(t *testing.T) {
	for _, tc := range []struct {
		in     string
		prefix int
		want   string
	}{
		{"192.0.2.1", 64, "192.0.2.1"},
		{"2001:db8:1:2:3:4:5:6", 64, "2001:db8:1:2::"},
		{"2001:db8:1:2:ffff::1", 64, "2001:db8:1:2::"},
		{"2001:db8:1:2:3:4:5:6", 56, "2001:db8:1::"},
		{"2001:db8:1:2:3:4:5:6", 128, "2001:db8:1:2:3:4:5:6"},
	} {
		a, _ := ParseAddr(tc.in)
		if got := Bucket(a, tc.prefix).String(); got != tc.want {
			t.Errorf("Bucket(%s, %d) = %s, want %s", tc.in, tc.prefix, got, tc.want)
		}
	}
}
