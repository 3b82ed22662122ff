package ruleset

import (
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// Entries written before a bound existed are brought within it as they are
// read, never refused: one such entry would otherwise fail the whole stored
// set (replicas would decide without any runtime rule) and every later
// change (each is validated with the entries it does not touch). Each
// upgrade keeps what the entry meant as closely as the bound allows, and
// says what it changed so the caller can log it.

// upgradeRule brings r within the bounds rules.Rule.Validate holds: a
// method or tier listed twice is listed once, a limit, burst or cost beyond
// what the scripts count exactly is clamped, and so is a priority.
func upgradeRule(r *rules.Rule) (changed []string) {
	if r.Path == "" {
		// Stored before an empty pattern was refused: it matched every
		// path, as "/**" does.
		r.Path, changed = "/**", append(changed, `empty endpoint_pattern read as "/**"`)
	}
	if d := dedupe(r.Methods); len(d) != len(r.Methods) {
		r.Methods, changed = d, append(changed, "methods listed twice merged")
	}
	if d := dedupe(r.Tiers); len(d) != len(r.Tiers) {
		r.Tiers, changed = d, append(changed, "tiers listed twice merged")
	}
	for _, q := range []struct {
		name string
		v    *int64
	}{{"limit", &r.Limit}, {"burst", &r.Burst}, {"cost", &r.Cost}} {
		if *q.v > rules.MaxQuantity {
			*q.v, changed = rules.MaxQuantity, append(changed, q.name+" clamped to 2^53-1")
		}
	}
	if p := min(max(r.Priority, -rules.MaxPriority), rules.MaxPriority); p != r.Priority {
		r.Priority, changed = p, append(changed, "priority clamped")
	}
	return changed
}

// upgradeTier brings t within the bounds policy.Tier's validation holds: a
// limit or burst is clamped, and a description loses its control
// characters and what goes beyond policy.MaxDescriptionLen.
func upgradeTier(t *policy.Tier) (changed []string) {
	for _, q := range []struct {
		name string
		v    *int64
	}{{"limit", &t.Limit}, {"burst", &t.Burst}} {
		if *q.v > rules.MaxQuantity {
			*q.v, changed = rules.MaxQuantity, append(changed, q.name+" clamped to 2^53-1")
		}
	}
	if len(t.Description) > policy.MaxDescriptionLen || !identity.Printable(t.Description) {
		t.Description, changed = printablePrefix(t.Description, policy.MaxDescriptionLen), append(changed, "description made printable and at most 256 bytes")
	}
	return changed
}

// dedupe returns list without repeats, first occurrences in order; list
// itself when it has none.
func dedupe(list []string) []string {
	for i := range list {
		if slices.Contains(list[:i], list[i]) {
			out := make([]string, 0, len(list))
			for _, s := range list {
				if !slices.Contains(out, s) {
					out = append(out, s)
				}
			}
			return out
		}
	}
	return list
}

// printablePrefix is s with every character identity.Printable refuses (a
// control character, an invalid byte) replaced by a space, cut to at most n
// bytes on a character boundary.
func printablePrefix(s string, n int) string {
	var b strings.Builder
	for _, r := range s {
		if r == utf8.RuneError || !identity.Printable(string(r)) {
			r = ' '
		}
		if b.Len()+utf8.RuneLen(r) > n {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}
