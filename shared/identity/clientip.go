package identity

import (
	"net/netip"
	"strings"
)

// MaxForwardedFor bounds how much of an X-Forwarded-For value is read. A 10 kB
// header of commas must not cost more than a short one.
const MaxForwardedFor = 4096

// MaxTrustedHops bounds XFFTrustedHops.
const MaxTrustedHops = 16

// ClientIPSource says where the client address came from.
type ClientIPSource string

const (
	SourceForwardedFor ClientIPSource = "x-forwarded-for"
	SourceRealIP       ClientIPSource = "x-real-ip"
	SourceConnection   ClientIPSource = "source.address"
)

// ClientIPInput is what a proxy knows about a request's origin.
type ClientIPInput struct {
	// SourceAddress is the client address the proxy itself resolved
	// ("ip:port" or "ip"). In Envoy it is the source.address attribute, which
	// the HTTP connection manager has already derived from the peer and, per
	// its use_remote_address / xff_num_trusted_hops, from X-Forwarded-For.
	// It is the default, and the fallback of every other source.
	SourceAddress string
	// ForwardedFor is the X-Forwarded-For value as the proxy forwards it
	// (several header lines joined by ","), ending with the entry the proxy
	// appended for its own peer (Envoy's use_remote_address: true).
	ForwardedFor string
	// XFFTrustedHops is how many trusted proxies stand between the client
	// and this proxy, each appending the address it saw: the client is then
	// the entry XFFTrustedHops+1 from the right. 0 (the default) never reads
	// X-Forwarded-For: every entry in it may have been written by the client.
	XFFTrustedHops int
	// RealIP is the X-Real-IP value, used only when TrustRealIP is set (a
	// proxy in front overwrites it on every request).
	RealIP      string
	TrustRealIP bool
}

// ClientIP resolves the client address: with XFFTrustedHops > 0 the
// X-Forwarded-For entry just left of the trusted ones, then a trusted
// X-Real-IP, then the source address. A candidate that is missing (fewer
// entries than the trusted hops append: the request did not come through
// them) or unparsable falls through to the next source; it never becomes an
// identity, and no entry a client wrote left of the trusted ones is read.
func ClientIP(in ClientIPInput) (netip.Addr, ClientIPSource, error) {
	if in.XFFTrustedHops > 0 && in.ForwardedFor != "" {
		if a, ok := pickForwarded(in.ForwardedFor, in.XFFTrustedHops); ok {
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
		return netip.Addr{}, "", &noSource{err}
	}
	return a, SourceConnection, nil
}

// noSource is ClientIP's error when no address can be read: it wraps the
// source address's (errors.Is finds ErrInvalid through it).
type noSource struct{ err error }

func (e *noSource) Error() string { return "client ip: no usable source: " + e.err.Error() }
func (e *noSource) Unwrap() error { return e.err }

// pickForwarded returns the entry hops+1 from the right, walking from the
// right end without splitting the list, so a hostile header costs no
// allocation per entry and only its trusted tail is read.
func pickForwarded(xff string, hops int) (netip.Addr, bool) {
	if hops > MaxTrustedHops {
		return netip.Addr{}, false
	}
	truncated := len(xff) > MaxForwardedFor
	if truncated {
		// Proxies append on the right; the client-written head is what a
		// long header is made of.
		xff = xff[len(xff)-MaxForwardedFor:]
	}
	end := len(xff)
	for i := 0; i < hops; i++ {
		j := strings.LastIndexByte(xff[:end], ',')
		if j < 0 {
			return netip.Addr{}, false // fewer entries than trusted hops
		}
		end = j
	}
	start := strings.LastIndexByte(xff[:end], ',') + 1
	if start == 0 && truncated {
		return netip.Addr{}, false // the cut may have gone through this entry
	}
	a, err := ParseAddr(xff[start:end])
	if err != nil {
		return netip.Addr{}, false
	}
	return a, true
}

// DefaultIPv6Prefix is the IPv6 prefix length one client is counted by. A
// single subscriber is routinely given a whole /64: counting each of its 2^64
// addresses apart would give it that many quotas.
const DefaultIPv6Prefix = 64

// Bucket returns the address a client is counted as: an IPv4 address as it
// is, an IPv6 address masked to its first v6Prefix bits (128: as it is).
func Bucket(a netip.Addr, v6Prefix int) netip.Addr {
	if !a.Is6() || v6Prefix >= 128 || v6Prefix < 0 {
		return a
	}
	return netip.PrefixFrom(a, v6Prefix).Masked().Addr()
}
