package ruleset

import (
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// What an upgrade makes of entries stored before the bounds passes the
// validation a new entry gets.
func TestUpgradedEntriesAreValid(t *testing.T) {
	r := rules.Rule{ID: "1", Scope: rules.ScopeUser, Algorithm: rules.TokenBucket, Limit: 1 << 60, Burst: 1 << 62,
		WindowSeconds: 60, Priority: -1 << 40, Methods: []string{"GET", "POST", "GET"}, Tiers: []string{"a", "a"}}
	if changed := upgradeRule(&r); len(changed) != 6 || r.Path != "/**" {
		t.Fatalf("changes %v", changed)
	}
	if err := r.Validate(); err != nil {
		t.Fatalf("upgraded rule: %v", err)
	}
	if strings.Join(r.Methods, ",") != "GET,POST" || r.Priority != -rules.MaxPriority {
		t.Fatalf("upgraded rule %+v", r)
	}
	ok := rules.Rule{ID: "2", Path: "/x", Scope: rules.ScopeUser, Algorithm: rules.GCRA, Limit: 5, WindowSeconds: 60, Methods: []string{"GET"}}
	if changed := upgradeRule(&ok); changed != nil {
		t.Fatalf("a valid rule was changed: %v", changed)
	}
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"a\r\nb\x00c\x7f", "a  b c "},
		{strings.Repeat("é", 200), strings.Repeat("é", 128)}, // 2 bytes each: cut on a character
		{"bad \xff byte", "bad   byte"},
	} {
		tier := policy.Tier{Name: "t", Limit: 1 << 60, WindowSeconds: 60, Description: tc.in}
		upgradeTier(&tier)
		if tier.Description != tc.want || tier.Limit != rules.MaxQuantity {
			t.Errorf("%q: description %q limit %d; want %q", tc.in, tier.Description, tier.Limit, tc.want)
		}
	}
}
