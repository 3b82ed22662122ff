package policy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

func base() Spec {
	return Spec{
		PathCase: PathCaseSensitive, DefaultTier: "free", DefaultAlgorithm: rules.TokenBucket,
		Tiers: []Tier{{ID: 1, Name: "free", Limit: 10, WindowSeconds: 60}},
		Rules: []rules.Rule{{ID: "login", Path: "/login", Scope: rules.ScopeIP, Algorithm: rules.GCRA, Limit: 3, WindowSeconds: 60}},
	}
}

// A bad entry is named as its source names it: a file entry by its path in
// the file, a runtime entry by the admin API's field names.
func TestErrorsNameFieldsAsTheSourceDoes(t *testing.T) {
	for _, tt := range []struct {
		name      string
		tiers     []Tier
		rules     []rules.Rule
		edit      func(*Spec) // a change to the file's entries
		wantFile  string      // the error of Validate on the edited file
		wantField string      // the error of Compose's skip
	}{
		{name: "runtime rule path", rules: []rules.Rule{{ID: "7", Path: "api", Scope: rules.ScopeUser, Algorithm: rules.GCRA, Limit: 1, WindowSeconds: 1}}, wantField: "endpoint_pattern"},
		{name: "runtime rule id clash", rules: []rules.Rule{{ID: "login", Path: "/r", Scope: rules.ScopeUser, Algorithm: rules.GCRA, Limit: 1, WindowSeconds: 1}}, wantField: "rule_id"},
		{name: "runtime rule unknown tier", rules: []rules.Rule{{ID: "7", Path: "/r", Tiers: []string{"gold"}, Scope: rules.ScopeUser, Algorithm: rules.GCRA, Limit: 1, WindowSeconds: 1}}, wantField: "tier_id"},
		{name: "runtime rule empty path", rules: []rules.Rule{{ID: "7", Scope: rules.ScopeUser, Algorithm: rules.GCRA, Limit: 1, WindowSeconds: 1}}, wantField: "endpoint_pattern"},
		{name: "runtime rule limit", rules: []rules.Rule{{ID: "7", Scope: rules.ScopeUser, Algorithm: rules.GCRA, Limit: 0, WindowSeconds: 1}}, wantField: "limit"},
		{name: "runtime tier name twice", tiers: []Tier{{ID: 2, Name: "free", Limit: 1, WindowSeconds: 1}}, wantField: "name"},
		{name: "runtime tier id twice", tiers: []Tier{{ID: 1, Name: "gold", Limit: 1, WindowSeconds: 1}}, wantField: "tier_id"},
		{name: "runtime tier endpoint", tiers: []Tier{{ID: 2, Name: "gold", Limit: 1, WindowSeconds: 1, Endpoints: map[string]int64{"/x": 5}}}, wantField: `endpoints["/x"]`},
		{name: "file rule path", edit: func(s *Spec) { s.Rules[0].Path = "login" }, wantFile: "rules[0].path"},
		{name: "file rule numeric id", edit: func(s *Spec) { s.Rules[0].ID = "12" }, wantFile: "rules[0].id"},
		{name: "file tier endpoint", edit: func(s *Spec) { s.Tiers[0].Endpoints = map[string]int64{"/x": 50} }, wantFile: `tiers[0].endpoints["/x"]`},
		{name: "file default tier", edit: func(s *Spec) { s.DefaultTier = "gold" }, wantFile: "default_tier"},
		{name: "file upper case with insensitive paths", edit: func(s *Spec) { s.PathCase, s.Rules[0].Path = PathCaseInsensitive, "/Login" }, wantFile: "rules[0].path"},
		{name: "file suffix with folded aliases", edit: func(s *Spec) { s.PathAliases, s.Rules[0].Path = PathAliasesFold, "/login.json" }, wantFile: "rules[0].path"},
		{name: "file exemption", edit: func(s *Spec) { s.Exemptions.IPs = []string{"10.0.0.0/33"} }, wantFile: "exemptions.ips[0]"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			file := base()
			if tt.edit != nil {
				tt.edit(&file)
				fe, ok := fielderr.As(file.Validate())
				if !ok || fe.Field != tt.wantFile {
					t.Fatalf("file error %v, want one naming %s", file.Validate(), tt.wantFile)
				}
				return
			}
			if err := file.Validate(); err != nil {
				t.Fatal(err)
			}
			got, skips := Compose(&file, tt.tiers, tt.rules)
			if len(skips) != 1 {
				t.Fatalf("skips %v, want the one runtime entry", skips)
			}
			if fe, ok := fielderr.As(skips[0].Err); !ok || fe.Field != tt.wantField {
				t.Fatalf("skip error %v, want one naming %s", skips[0].Err, tt.wantField)
			}
			if len(got.Tiers) != 1 || len(got.Rules) != 1 || got.Validate() != nil {
				t.Fatalf("the composed model keeps the file's entries only and is valid: %+v", got)
			}
		})
	}
}

// Compose keeps the runtime entries that fit beside a bad one, and rules
// may name runtime tiers.
func TestComposeLeavesOutOnlyTheBadEntry(t *testing.T) {
	file := base()
	tiers := []Tier{{ID: 2, Name: "gold", Limit: 100, WindowSeconds: 60}, {ID: 3, Name: "free", Limit: 1, WindowSeconds: 1}}
	rs := []rules.Rule{
		{ID: "5", Tiers: []string{"gold"}, Path: "/a", Scope: rules.ScopeUser, Algorithm: rules.GCRA, Limit: 1, WindowSeconds: 1},
		{ID: "6", Path: "/c", Tiers: []string{"silver"}, Scope: rules.ScopeUser, Algorithm: rules.GCRA, Limit: 1, WindowSeconds: 1},
		{ID: "7", Path: "/b", Scope: rules.ScopeUser, Algorithm: rules.GCRA, Limit: 1, WindowSeconds: 1},
	}
	got, skips := Compose(&file, tiers, rs)
	if len(skips) != 2 || skips[0].Entry != "tier 3" || !skips[0].IsTier || skips[0].Index != 1 || skips[1].Entry != "rule 6" || skips[1].Index != 1 {
		t.Fatalf("skips %+v", skips)
	}
	if len(got.Tiers) != 2 || len(got.Rules) != 3 {
		t.Fatalf("composed %d tiers, %d rules; want 2 and 3", len(got.Tiers), len(got.Rules))
	}
}

func TestCompiledPolicy(t *testing.T) {
	s := base()
	s.Tiers = append(s.Tiers, Tier{ID: 2, Name: "premium", Limit: 100, WindowSeconds: 60, RequireAPIKey: true})
	s.APIKeyRequiredPaths = []string{"/partner/**"}
	s.Exemptions = Exemptions{IPs: []string{"10.0.0.0/8", "192.0.2.1"}, Users: []string{"ops"}, Keys: []string{"k_9"}}
	s.PathCase = PathCaseInsensitive
	p, err := Compile(&s, "v1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name      string
		got, want any
	}{
		{"key tier by id", p.KeyTier(2, "renamed"), "premium"},
		{"key tier of a deleted tier", p.KeyTier(9, "gone"), "free"},
		{"key tier by name (old keys)", p.KeyTier(0, "premium"), "premium"},
		{"key without a tier", p.KeyTier(0, ""), ""},
		{"unknown tier", p.Tier("gold"), "free"},
		{"tier needs a key", p.KeyRequired("premium", "/x", ""), true},
		{"path needs a key", p.KeyRequired("free", "/partner/a/b", ""), true},
		{"no key needed", p.KeyRequired("free", "/x", ""), false},
		{"exempt prefix", p.Exempt(ipID("10.1.2.3"), "ip:10.1.2.3"), true},
		{"exempt address", p.Exempt(ipID("192.0.2.1"), "ip:192.0.2.1"), true},
		{"not exempt", p.Exempt(ipID("192.0.2.2"), "ip:192.0.2.2"), false},
		{"exempt user", p.Exempt(userID("ops"), "user:ops"), true},
		{"version", p.Version(), "v1"},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	if ep, _, err := p.Endpoint("/API//V1/./Items%41"); err != nil || ep != "/api/v1/itemsa" {
		t.Errorf("endpoint with insensitive paths: %q %v", ep, err)
	}
	s.PathAliases = PathAliasesFold
	if p, err = Compile(&s, "v2"); err != nil {
		t.Fatal(err)
	}
	for _, ep := range []string{"/Login.JSON", "/login.", "/login%20", "/LOGIN.x.json.%20"} {
		if got, _, err := p.Endpoint(ep); err != nil || got != "/login" {
			t.Errorf("endpoint %q with folded aliases: %q %v", ep, got, err)
		}
	}
	if _, _, err := p.Endpoint(""); err == nil {
		t.Error("an empty endpoint was taken")
	}
	// A PHP front controller's path info is the route, whatever the
	// settings (an outsider's /index.php/api/v1/auth/login escaped the
	// login rule behind a PHP upstream).
	for ep, want := range map[string]string{"/index.php/api/v1/auth/login": "/api/v1/auth/login", "/App/Index.PHP/Items": "/app/items"} {
		if got, _, err := p.Endpoint(ep); err != nil || got != want {
			t.Errorf("endpoint %q: %q %v, want %q", ep, got, err, want)
		}
	}
}

func ipID(a string) identity.ID   { return identity.ID{Kind: identity.KindIP, Value: a} }
func userID(u string) identity.ID { return identity.ID{Kind: identity.KindUser, Value: u} }

// A tier's burst never lifts its total: the total's bucket is the total,
// a total below the burst is refused, and the default covers the burst.
func TestTotalIsNotLiftedByBurst(t *testing.T) {
	s := base()
	s.Tiers[0].Burst, s.Tiers[0].TotalLimit = 1000, 100
	if fe, ok := fielderr.As(s.Validate()); !ok || fe.Field != "tiers[0].total_limit" {
		t.Fatalf("total below the burst: %v", s.Validate())
	}
	s.Tiers[0].TotalLimit = 1000
	p, err := Compile(&s, "v")
	if err != nil {
		t.Fatal(err)
	}
	total := p.tiers["free"].total
	if total.Capacity() != 1000 || total.Limit != 1000 {
		t.Fatalf("total rule %+v", total)
	}
	s.Tiers[0].TotalLimit, s.Tiers[0].Burst = 0, 500 // limit 10: default 100, below the burst
	if got := s.Tiers[0].Total(); got != 500 {
		t.Fatalf("default total %d, want the burst's 500", got)
	}
}

// An exemption's address or prefix is read as identities read addresses:
// a caller the operator names is a caller it matches, and what it reads
// is canonical (masked, and written back it reads the same).
func FuzzParseIPOrPrefix(f *testing.F) {
	for _, s := range []string{"192.0.2.1", " 10.0.0.0/8 ", "10.1.2.3/8", "2001:db8::/32", "::ffff:10.0.0.0/104", "::ffff:192.0.2.7",
		"[2001:db8::1]", "192.0.2.1:80", "[::1]:443", "fe80::1%eth0", "::ffff:0:0/95", "1.2.3.4/33", "/", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseIPOrPrefix(s)
		if err != nil {
			return
		}
		if p != p.Masked() || p.Addr().Zone() != "" {
			t.Fatalf("%q: %v is not canonical", s, p)
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			t.Fatalf("%q: %v maps IPv4 addresses no identity holds (they are unmapped)", s, p)
		}
		if again, err := ParseIPOrPrefix(p.String()); err != nil || again != p {
			t.Fatalf("%q: %v read back as %v (%v)", s, p, again, err)
		}
		if a, err := identity.ParseAddr(s); err == nil && !p.Contains(a) {
			t.Fatalf("%q: %v does not hold the caller %v it names", s, p, a)
		}
	})
}

func TestMappedPrefixesExemptTheirIPv4Callers(t *testing.T) {
	for s, want := range map[string]string{"::ffff:10.0.0.0/104": "10.0.0.0/8", "::ffff:192.0.2.7/128": "192.0.2.7/32",
		"::ffff:192.0.2.7": "192.0.2.7/32", "::ffff:0:0/95": "::fffe:0:0/95", "2001:db8::1/32": "2001:db8::/32"} {
		p, err := ParseIPOrPrefix(s)
		if err != nil || p.String() != want {
			t.Errorf("%q: %v %v, want %s", s, p, err, want)
		}
	}
}

// A tier's endpoint limits keep their ids, and so their counters, when
// another endpoint limit comes or goes: named by their place among the
// tier's paths, one added on a path that sorted first moved every other
// onto fresh counters (an outsider's API key got 15 logins an hour past a
// limit of 5 over two unrelated tier edits). A configured rule may not
// take a tier's id.
func TestEndpointLimitIDsAreStable(t *testing.T) {
	ids := func(endpoints map[string]int64) map[string]string {
		s := base()
		s.Tiers[0].Endpoints = endpoints
		p, err := Compile(&s, "v")
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, r := range p.tiers[s.Tiers[0].Name].set.Rules() {
			if r.Path != "" {
				out[r.Path] = r.ID
			}
		}
		return out
	}
	before := ids(map[string]int64{"/login": 5})
	after := ids(map[string]int64{"/login": 5, "/aaa": 3})
	if before["/login"] == "" || before["/login"] != after["/login"] || after["/aaa"] == after["/login"] {
		t.Fatalf("ids before %v, after an endpoint was added %v", before, after)
	}
	s := base()
	s.Rules = append(s.Rules, rules.Rule{ID: "tier_free", Scope: rules.ScopeUser, Algorithm: rules.FixedWindow, Limit: 1, WindowSeconds: 60})
	if fe, ok := fielderr.As(s.Validate()); !ok || !strings.Contains(fe.Error(), "tier_") {
		t.Fatalf("a configured rule named tier_free: %v", s.Validate())
	}
}

// The rules' patterns holding a '?' are bounded together: each is tried on
// every check at a cost of its length over 64 a path byte, and 998 of 1 KB
// cost 150 ms a check of an 8 KB path (attack 53). The file's rule past the
// bound is named by its path in the file, a runtime one by the API's field.
func TestQuestionPatternsAreBoundedTogether(t *testing.T) {
	pattern := func(i int) string { return fmt.Sprintf("/%03d", i) + strings.Repeat("a?", 498) + "b" } // 1,001 bytes
	file := base()
	for i := range MaxQuestionPatternBytes / len(pattern(0)) {
		file.Rules = append(file.Rules, rules.Rule{ID: fmt.Sprintf("q%d", i), Path: pattern(i), Scope: rules.ScopeIP, Algorithm: rules.GCRA, Limit: 3, WindowSeconds: 60})
	}
	if err := file.Validate(); err != nil {
		t.Fatalf("%d patterns of %d bytes: %v", len(file.Rules)-1, len(pattern(0)), err)
	}
	over := rules.Rule{ID: "q-over", Path: pattern(99), Scope: rules.ScopeIP, Algorithm: rules.GCRA, Limit: 3, WindowSeconds: 60}
	bad := file
	bad.Rules = append(slices.Clone(file.Rules), over)
	if fe, ok := fielderr.As(bad.Validate()); !ok || fe.Field != fmt.Sprintf("rules[%d].path", len(bad.Rules)-1) {
		t.Fatalf("a file past the bound: %v", bad.Validate())
	}
	over.ID = "77"
	_, skips := Compose(&file, nil, []rules.Rule{over})
	if len(skips) != 1 {
		t.Fatalf("a runtime rule past the bound: skips %v", skips)
	}
	if fe, ok := fielderr.As(skips[0].Err); !ok || fe.Field != "endpoint_pattern" {
		t.Fatalf("a runtime rule past the bound: %v", skips[0].Err)
	}
	// A tier's endpoint patterns count with the rules': a check tries
	// both.
	tier := file
	tier.Tiers = slices.Clone(file.Tiers)
	tier.Tiers[0].Limit = 1000
	tier.Tiers[0].Endpoints = map[string]int64{pattern(98): 5}
	if fe, ok := fielderr.As(tier.Validate()); !ok || fe.Field != fmt.Sprintf("tiers[0].endpoints[%q]", pattern(98)) {
		t.Fatalf("a tier's endpoint past the bound: %v", tier.Validate())
	}
	// Patterns without a '?' are not counted.
	plain := file
	plain.Rules = append(slices.Clone(file.Rules), rules.Rule{ID: "star", Path: "/" + strings.Repeat("a*", 400), Scope: rules.ScopeIP, Algorithm: rules.GCRA, Limit: 3, WindowSeconds: 60})
	if err := plain.Validate(); err != nil {
		t.Fatalf("a pattern without '?': %v", err)
	}
}
