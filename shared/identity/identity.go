// Package identity turns what the filter knows about a caller into one canonical
// string: "user:<id>", "key:<key id>" or "ip:<addr>". The control service counts
// against that string, so two spellings of one caller must give the same result
// and no caller may smuggle protocol bytes through it.
package identity

import (
	"errors"
	"net/netip"
	"strings"
	"unicode/utf8"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
)

// Kind is the source of an identity, in priority order.
type Kind string

const (
	KindUser Kind = "user"
	KindKey  Kind = "key"
	KindIP   Kind = "ip"
)

// MaxIDLen bounds the id part of an identity: user ids are up to 255 bytes.
const MaxIDLen = 255

// ID is a parsed identity.
type ID struct {
	Kind  Kind
	Value string
}

// Prefix is the kind with its colon, "ip:".
func (k Kind) Prefix() string { return string(k) + ":" }

// String returns the canonical form, "<kind>:<value>".
func (i ID) String() string { return string(i.Kind) + ":" + i.Value }

// ErrInvalid is wrapped by every validation error of this package.
var ErrInvalid = errors.New("invalid identity")

// DigestPrefix begins the name the filter gives a verified token's subject
// that cannot be a name as it is (a control or invisible character, too
// long): DigestPrefix and 32 hex digits of its SHA-256. No other name may
// begin so (an API key's user taking one shared that subject's counters).
const DigestPrefix = "~sha256:"

// Digested is that name for a subject whose SHA-256 is sum (each side
// hashes with its own implementation: the filter's module links no
// crypto/sha256), so that the filter and the service spell it alike.
func Digested(sum [32]byte) string {
	const hexDigits = "0123456789abcdef"
	b := make([]byte, 0, len(DigestPrefix)+32)
	b = append(b, DigestPrefix...)
	for _, c := range sum[:16] {
		b = append(b, hexDigits[c>>4], hexDigits[c&15])
	}
	return string(b)
}

// User builds a user identity after validating the id.
func User(id string) (ID, error) {
	if err := validateID(id); err != nil {
		return ID{}, err
	}
	return ID{Kind: KindUser, Value: id}, nil
}

// Key builds an API-key identity from the key's id (never the raw key).
func Key(keyID string) (ID, error) {
	if err := validateID(keyID); err != nil {
		return ID{}, err
	}
	return ID{Kind: KindKey, Value: keyID}, nil
}

// IP builds an IP identity in canonical form: IPv4 dotted, IPv6 compressed
// lower case, IPv4-mapped IPv6 unmapped, zone dropped.
func IP(addr string) (ID, error) {
	a, err := ParseAddr(addr)
	if err != nil {
		return ID{}, err
	}
	return ID{Kind: KindIP, Value: a.String()}, nil
}

// UnknownIP is the caller with no usable address (a listener on a Unix
// socket, a missing attribute): a bucket of its own, never a real address's.
var UnknownIP = ID{Kind: KindIP, Value: "unknown"}

// Parse reads a canonical identity. A string without a known prefix is a bare
// user id (the seed API's user_id), so "alice" and "user:alice" are one caller.
func Parse(s string) (ID, error) {
	kind, rest, ok := strings.Cut(s, ":")
	if ok {
		switch Kind(kind) {
		case KindUser:
			return User(rest)
		case KindKey:
			return Key(rest)
		case KindIP:
			if rest == UnknownIP.Value {
				return UnknownIP, nil
			}
			return IP(rest)
		}
	}
	return User(s)
}

// validateID accepts printable UTF-8 up to MaxIDLen bytes. Control characters
// (CR, LF, NUL...) are refused rather than escaped: no legitimate id has them,
// and they are what header and log injection is made of.
func validateID(id string) error {
	if id == "" {
		return invalid("empty id")
	}
	if len(id) > MaxIDLen {
		return invalid("id is %d bytes, at most %d", len(id), MaxIDLen)
	}
	if !utf8.ValidString(id) {
		return invalid("id is not valid UTF-8")
	}
	if r, ok := firstControl(id); ok {
		return invalid("id contains control or invisible format character %U", r)
	}
	return nil
}

// Printable reports whether s is valid UTF-8 without control characters or
// characters drawn as nothing (invisible):
// text that can go into a header, a log line or a JSON answer as it is.
func Printable(s string) bool {
	_, bad := firstControl(s)
	return utf8.ValidString(s) && !bad
}

func firstControl(s string) (rune, bool) {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || invisible(r) {
			return r, true
		}
	}
	return 0, false
}

// invisible reports the characters that are drawn as nothing, or change
// how text around them is drawn without showing themselves, and have no
// place in a name: bidirectional embeddings, overrides, isolates and
// marks, zero-width spaces and joiners, the word joiner and the other
// invisible operators, the byte-order mark, the soft hyphen, the combining
// grapheme joiner, the Hangul fillers, the line and paragraph separators,
// and the default ignorable code points no script uses (unassigned, or
// formatting for shorthand and music). In an identity, a tier description
// or a name they let one string pass for another in a listing or the
// audit trail ("user:admin\u202e..." shown reversed; users drawn as one
// "alice" with a filler or the grapheme joiner after the name: attack
// 53), so they are refused like control characters. Variation selectors
// and tag characters are not: emoji are spelled with them ("\u2764\ufe0f",
// a flag's tags), and a verified token whose subject held one lost its
// subject, tier and tenant (attack 55); the console spells them out.
func invisible(r rune) bool {
	switch {
	case r < 0x00ad:
		return false
	case r == 0x00ad, r == 0x034f, r == 0x061c, r == 0x115f, r == 0x1160, r == 0x17b4, r == 0x17b5,
		r == 0x180e, r == 0x3164, r == 0xfeff, r == 0xffa0, r == 0xe0001:
		return true
	case 0x200b <= r && r <= 0x200f, 0x2028 <= r && r <= 0x202e, 0x2060 <= r && r <= 0x206f,
		0xfff0 <= r && r <= 0xfff8, 0x1bca0 <= r && r <= 0x1bca3, 0x1d173 <= r && r <= 0x1d17a,
		0xe0000 <= r && r <= 0xe0fff && !(0xe0020 <= r && r <= 0xe007f) && !(0xe0100 <= r && r <= 0xe01ef):
		return true
	}
	return false
}

// ParseAddr parses one IP address as it may appear in X-Forwarded-For or
// X-Real-IP: surrounding spaces, brackets and a port are tolerated.
func ParseAddr(s string) (netip.Addr, error) {
	s = strings.TrimSpace(s)
	if len(s) > 64 {
		return netip.Addr{}, invalid("address is %d bytes", len(s))
	}
	// Only "[v6]:port" and "v4:port" carry a port; trying ParseAddrPort on a
	// plain address would build an error on every request.
	if strings.HasPrefix(s, "[") && strings.Contains(s, "]:") || strings.Count(s, ":") == 1 {
		if ap, err := netip.ParseAddrPort(s); err == nil {
			return ap.Addr().Unmap().WithZone(""), nil
		}
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, invalid("%q is not an IP address", s)
	}
	return a.Unmap().WithZone(""), nil
}

// invalid is a field error of kind ErrInvalid; the caller names the field.
func invalid(format string, args ...any) error {
	e := fielderr.New("", format, args...)
	e.Kind = ErrInvalid
	return e
}
