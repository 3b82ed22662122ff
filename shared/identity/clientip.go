package identity

import (
	"fmt"
	"net/netip"
	"strings"
)

// MaxForwardedFor bounds how much of an X-Forwarded-For value is read. A 10 kB
// header of commas must not cost more than a short one.
const MaxForwardedFor = 4096

// ClientIPSource says where the client address came from.
type ClientIPSource string

const (
	SourceForwardedFor ClientIPSource = "x-forwarded-for"
	SourceRealIP       ClientIPSource = "x-real-ip"
	SourceConnection   ClientIPSource = "source.address"
)

// ClientIPInput is what a proxy knows about a request's origin.
type ClientIPInput struct {
	// ForwardedFor is the X-Forwarded-For value; several headers joined by ",".
	ForwardedFor string
	// TrustedProxyDepth is how many rightmost X-Forwarded-For entries our own
	// proxies appended. 0 means X-Forwarded-For is not trusted at all.
	TrustedProxyDepth int
	// RealIP is the X-Real-IP value, used only when TrustRealIP is set.
	RealIP      string
	TrustRealIP bool
	// SourceAddress is the peer address of the connection ("ip:port" or "ip").
	SourceAddress string
}

// ClientIP resolves the client address: the X-Forwarded-For entry just left of
// the TrustedProxyDepth rightmost ones (the entries our proxies appended; with
// fewer entries than that, the leftmost), then a trusted X-Real-IP, then the
// connection's source address. An unparsable candidate falls through to the
// next source instead of becoming an identity.
func ClientIP(in ClientIPInput) (netip.Addr, ClientIPSource, error) {
	if in.TrustedProxyDepth > 0 && in.ForwardedFor != "" {
		if a, ok := pickForwarded(in.ForwardedFor, in.TrustedProxyDepth); ok {
			return a, SourceForwardedFor, nil
		}
	}
	if in.TrustRealIP && in.RealIP != "" {
		if a, err := ParseAddr(in.RealIP); err == nil {
			return a, SourceRealIP, nil
		}
	}
	a, err := ParseAddr(in.SourceAddress)
	if err != nil {
		return netip.Addr{}, "", fmt.Errorf("client ip: no usable source: %w", err)
	}
	return a, SourceConnection, nil
}

// pickForwarded walks the list from the right without splitting it into a
// slice, so a hostile header costs no allocation per entry.
func pickForwarded(xff string, depth int) (netip.Addr, bool) {
	if len(xff) > MaxForwardedFor {
		// Our proxies append on the right; keep the right end, which is the
		// part we can trust, and drop the client-written head.
		xff = xff[len(xff)-MaxForwardedFor:]
		if i := strings.IndexByte(xff, ','); i >= 0 {
			xff = xff[i+1:]
		}
	}
	n := strings.Count(xff, ",") + 1
	idx := n - depth - 1 // 0-based from the left
	if idx < 0 {
		idx = 0
	}
	for i := 0; i < idx; i++ {
		_, xff, _ = strings.Cut(xff, ",")
	}
	entry, _, _ := strings.Cut(xff, ",")
	a, err := ParseAddr(entry)
	if err != nil {
		return netip.Addr{}, false
	}
	return a, true
}
