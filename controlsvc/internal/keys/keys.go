// Package keys builds every Redis key Tollgate writes. Keys start with "rl:" and
// put the counter's owner in a hash tag:
//
//	rl:{<scope>:<subject>}:<rule id>[:<endpoint>]:<algorithm>[:<window s>]
//
// The subject (a user id, an address, a tenant...) and the endpoint are escaped,
// so no two subjects share a key and no subject can end the hash tag early and
// choose its own cluster slot. An endpoint longer than MaxEndpointPart is
// named by its digest, so a key's size is bounded whatever the path.
package keys

import (
	"crypto/sha256"
	"encoding/base64"
	"net/url"
	"strconv"
	"strings"
)

// Prefix starts every key.
const Prefix = "rl:"

// Owner is the hash-tag content of a counter: every key of one owner lands in
// one cluster slot, so a script may touch several of them.
type Owner string

// NewOwner builds the owner of a counter: scope is one of the rule scopes
// (a fixed lower-case word), subject is what the scope counts (escaped here).
func NewOwner(scope, subject string) Owner {
	return Owner(scope + ":" + escape(subject, false))
}

// Counter is the key of one rule's counter for one owner. endpoint is "" when
// the rule counts across endpoints; windowSeconds is 0 for a counter named
// without its window.
func Counter(o Owner, ruleID, endpoint, algorithm string, windowSeconds int64) string {
	var b strings.Builder
	b.Grow(len(Prefix) + len(o) + len(ruleID) + len(endpoint) + len(algorithm) + 16)
	b.WriteString(Prefix)
	b.WriteByte('{')
	b.WriteString(string(o))
	b.WriteString("}:")
	b.WriteString(escape(ruleID, true))
	if endpoint != "" {
		b.WriteByte(':')
		b.WriteString(endpointPart(endpoint))
	}
	b.WriteByte(':')
	b.WriteString(algorithm)
	if windowSeconds > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.FormatInt(windowSeconds, 10))
	}
	return b.String()
}

// MaxEndpointPart bounds the endpoint part of a counter's key: a path up to
// it is kept as it is (an operator reads keys), a longer one is named by its
// digest. Paths may be 8 KiB long, and a caller walking long paths would
// otherwise make Redis hold each one in a key (8 KB a request).
const MaxEndpointPart = 64

// endpointPart is the escaped endpoint, or "%h" and a digest of it when
// that is longer than MaxEndpointPart. escape never writes "%h" ('h' is no
// hex digit), so no kept path reads as a digest.
func endpointPart(endpoint string) string {
	e := escape(endpoint, true)
	if len(e) <= MaxEndpointPart {
		return e
	}
	sum := sha256.Sum256([]byte(endpoint))
	return "%h" + base64.RawURLEncoding.EncodeToString(sum[:18])
}

// Penalty is the ZSET of an owner's recent violations.
func Penalty(o Owner) string { return Prefix + "{" + string(o) + "}:penalty" }

// Block holds the time an owner's progressive penalty ends.
func Block(o Owner) string { return Prefix + "{" + string(o) + "}:block" }

// Overrides is the hash of per-identity, per-endpoint overrides set through
// PUT /v1/rate-limit/config.
const Overrides = Prefix + "overrides"

// OverrideField is the field of one override inside Overrides.
func OverrideField(identity, endpoint string) string {
	return escape(identity, true) + " " + escape(endpoint, true)
}

// The rules and tiers operators manage at runtime share one hash tag, so a
// change and its version bump are one transaction on a cluster too.
const (
	// AdminRules is the hash of runtime rules: rule id -> JSON.
	AdminRules = Prefix + "{admin}:rules"
	// AdminTiers is the hash of runtime tiers: tier id -> JSON.
	AdminTiers = Prefix + "{admin}:tiers"
	// AdminRuleSeq issues rule ids.
	AdminRuleSeq = Prefix + "{admin}:rule_seq"
	// AdminVersion counts every change to rules, tiers and overrides:
	// replicas compare it to notice a change whose notification they missed.
	AdminVersion = Prefix + "{admin}:version"
	// AdminChanges is the pub/sub channel a change is announced on.
	AdminChanges = Prefix + "{admin}:changes"
)

// ParseOverrideField is OverrideField backwards.
func ParseOverrideField(field string) (identity, endpoint string, ok bool) {
	a, b, ok := strings.Cut(field, " ")
	if !ok {
		return "", "", false
	}
	identity, err1 := url.PathUnescape(a)
	endpoint, err2 := url.PathUnescape(b)
	return identity, endpoint, err1 == nil && err2 == nil
}

// APIKey is the record of an API key, found by the hex SHA-256 of the raw key.
func APIKey(hashHex string) string { return Prefix + "apikey:" + hashHex }

// APIKeyID maps a key id to its hash, for admin look-ups and revocation.
func APIKeyID(keyID string) string { return Prefix + "apikeyid:" + escape(keyID, true) }

// APIKeyIndex lists every key id by creation time (a sorted set).
const APIKeyIndex = Prefix + "apikeys"

// APIKeyUser lists one user's key ids by creation time.
func APIKeyUser(userID string) string { return Prefix + "apikeys:user:" + escape(userID, true) }

// Audit is the capped stream of admin changes.
const Audit = Prefix + "audit"

// AuditViolations is the capped stream of violations. It is apart from
// Audit because clients make violations: in one stream, a flood of denials
// would trim the admin changes out of the trail.
const AuditViolations = Prefix + "audit:violations"

// UsageHour and UsageMinute count an identity's requests in one hour or one
// minute (Unix hour / minute number). One identity's counters share a hash
// tag, so reading a day of them is one round trip on a cluster too.
func UsageHour(identity string, hour int64) string {
	return Prefix + "usage:{" + escape(identity, false) + "}:h:" + strconv.FormatInt(hour, 10)
}

// UsageMinute: see UsageHour.
func UsageMinute(identity string, minute int64) string {
	return Prefix + "usage:{" + escape(identity, false) + "}:m:" + strconv.FormatInt(minute, 10)
}

// SummaryMinute and SummaryRefused hold one minute of the deployment's
// decisions (the operator's summary): a hash of counts and a sorted set of
// the most refused callers. All of them share one hash tag: a summary reads
// up to a day of minutes in one round trip, on a cluster too, and only
// operators read them.
func SummaryMinute(minute int64) string {
	return Prefix + "summary:{all}:m:" + strconv.FormatInt(minute, 10)
}

// SummaryRefused: see SummaryMinute.
func SummaryRefused(minute int64) string {
	return Prefix + "summary:{all}:r:" + strconv.FormatInt(minute, 10)
}

// Idempotency stores a batch answer under the hex SHA-256 of its key.
func Idempotency(hashHex string) string { return Prefix + "idem:{" + hashHex + "}" }

const hexDigits = "0123456789ABCDEF"

// escape percent-encodes the bytes that carry structure in a key: '%' itself,
// the hash-tag braces, controls, space and (for segments outside the tag) ':'.
// Percent-encoding is injective, so distinct inputs stay distinct keys.
func escape(s string, colon bool) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if needsEscape(s[i], colon) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEscape(c, colon) {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
			continue
		}
		b = append(b, c)
	}
	return string(b)
}

func needsEscape(c byte, colon bool) bool {
	switch {
	case c == '%', c == '{', c == '}', c <= ' ', c == 0x7f:
		return true
	case c == ':':
		return colon
	}
	return false
}
