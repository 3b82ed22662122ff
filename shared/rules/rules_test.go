package rules

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
)

func TestMatchGlob(t *testing.T) {
	tests := []struct {
		pattern, path string
		want          bool
	}{
		{"/api/v1/users", "/api/v1/users", true},
		{"/api/v1/users", "/api/v1/users/1", false},
		{"/api/*/users", "/api/v1/users", true},
		{"/api/*/users", "/api/v1/x/users", false},
		{"/api/**", "/api", true},
		{"/api/**", "/api/v1/users/1", true},
		{"/api/**", "/apix", false},
		{"/**", "/", true},
		{"/**", "/anything/at/all", true},
		{"/api/**/edit", "/api/edit", true},
		{"/api/**/edit", "/api/a/b/edit", true},
		{"/api/**/edit", "/api/a/b/edit/x", false},
		{"/files/*.png", "/files/cat.png", true},
		{"/files/*.png", "/files/cat.jpg", false},
		{"/v?/x", "/v1/x", true},
		{"/v?/x", "/v/x", false},
		{"/a*b*c", "/aXXbYYc", true},
		{"/a*b*c", "/aXXbYY", false},
		{"/a/**/b/**/c", "/a/1/b/2/3/c", true},
	}
	for _, tt := range tests {
		if got := MatchGlob(tt.pattern, tt.path); got != tt.want {
			t.Errorf("MatchGlob(%q, %q) = %v, want %v", tt.pattern, tt.path, got, tt.want)
		}
	}
}

func TestValidate(t *testing.T) {
	good := Rule{ID: "r1", Scope: ScopeUser, Algorithm: TokenBucket, Limit: 10, WindowSeconds: 60}
	tests := []struct {
		field  string
		mutate func(*Rule)
	}{
		{"", func(r *Rule) {}},
		{"id", func(r *Rule) { r.ID = "Bad Id" }},
		{"id", func(r *Rule) { r.ID = IDExempt }},
		{"id", func(r *Rule) { r.ID = IDOverride }},
		{"scope", func(r *Rule) { r.Scope = "planet" }},
		{"algorithm", func(r *Rule) { r.Algorithm = "leaky" }},
		{"limit", func(r *Rule) { r.Limit = 0 }},
		{"limit", func(r *Rule) { r.Limit = MaxQuantity + 1 }}, // a double would round it
		{"", func(r *Rule) { r.Limit = MaxQuantity }},
		{"burst", func(r *Rule) { r.Burst = 1 << 62 }},
		{"priority", func(r *Rule) { r.Priority = MaxPriority + 1 }},
		{"priority", func(r *Rule) { r.Priority = -MaxPriority - 1 }},
		{"", func(r *Rule) { r.Priority = -MaxPriority }},
		{"window_seconds", func(r *Rule) { r.WindowSeconds = 3601 }},
		{"window_seconds", func(r *Rule) { r.WindowSeconds = 0 }},
		{"burst", func(r *Rule) { r.Burst = -1 }},
		{"cost", func(r *Rule) { r.Cost = 11 }},
		{"action", func(r *Rule) { r.Action = "maybe" }},
		{"path", func(r *Rule) { r.Path = "api" }},
		{"path", func(r *Rule) { r.Path = "/a**" }},
		{"tiers[1]", func(r *Rule) { r.Tiers = []string{"free", "Pro Tier"} }},
		{"methods[0]", func(r *Rule) { r.Methods = []string{"get"} }},
		{"methods[2]", func(r *Rule) { r.Methods = []string{"GET", "POST", "GET"} }},
		{"tiers[1]", func(r *Rule) { r.Tiers = []string{"free", "free"} }},
		{"methods", func(r *Rule) { r.Methods = make([]string, 33) }},
		{"tiers", func(r *Rule) { r.Tiers = make([]string, 33) }},
	}
	for _, tt := range tests {
		r := good
		tt.mutate(&r)
		err := r.Validate()
		var fe *fielderr.Error
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("valid rule refused: %v", err)
		case tt.field != "" && (!errors.As(err, &fe) || fe.Field != tt.field):
			t.Errorf("want an error naming %q, got %v", tt.field, err)
		}
	}
}

func TestNewSetNamesBadRule(t *testing.T) {
	_, err := NewSet("v1", []Rule{
		{ID: "a", Scope: ScopeUser, Algorithm: GCRA, Limit: 1, WindowSeconds: 1},
		{ID: "b", Scope: ScopeUser, Algorithm: GCRA, Limit: -1, WindowSeconds: 1},
	})
	if err == nil || err.Error() != "[1].limit: -1 must be in 1..9007199254740991" {
		t.Fatalf("got %v", err)
	}
	_, err = NewSet("v1", []Rule{
		{ID: "a", Scope: ScopeUser, Algorithm: GCRA, Limit: 1, WindowSeconds: 1},
		{ID: "a", Scope: ScopeIP, Algorithm: GCRA, Limit: 1, WindowSeconds: 1},
	})
	if err == nil || !strings.Contains(err.Error(), "[1].id") {
		t.Fatalf("duplicate id: got %v", err)
	}
}

// A set holds at most MaxResponseCostRules enabled rules whose cost the
// response reports: an answer names every one a request matched, so no
// request can match one it cannot charge. Disabled ones do not count.
func TestNewSetBoundsResponseCostRules(t *testing.T) {
	var rs []Rule
	for i := range MaxResponseCostRules {
		rs = append(rs, Rule{ID: fmt.Sprintf("r%d", i), Scope: ScopeUser, Algorithm: FixedWindow, Limit: 100, WindowSeconds: 60, CostFrom: "response_header:x-cost"})
	}
	off := false
	rs = append(rs, Rule{ID: "off", Scope: ScopeUser, Algorithm: FixedWindow, Limit: 100, WindowSeconds: 60, CostFrom: "response_header:x-cost", Enabled: &off})
	if _, err := NewSet("v1", rs); err != nil {
		t.Fatalf("%d such rules and a disabled one: %v", MaxResponseCostRules, err)
	}
	rs = append(rs, Rule{ID: "one_more", Scope: ScopeIP, Algorithm: FixedWindow, Limit: 100, WindowSeconds: 60, CostFrom: "response_json:usage.total_tokens"})
	if _, err := NewSet("v1", rs); err == nil || !strings.HasPrefix(err.Error(), fmt.Sprintf("[%d].cost_from: at most %d", len(rs)-1, MaxResponseCostRules)) {
		t.Fatalf("one more: %v", err)
	}
}

func TestMatch(t *testing.T) {
	off := false
	set, err := NewSet("v1", []Rule{
		{ID: "login", Path: "/api/v1/auth/login", Methods: []string{"POST"}, Scope: ScopeIP, Algorithm: FixedWindow, Limit: 5, WindowSeconds: 60, Priority: 100},
		{ID: "export", Path: "/api/v1/export", Methods: []string{"GET"}, Scope: ScopeIP, Algorithm: FixedWindow, Limit: 5, WindowSeconds: 60, Priority: 100},
		{ID: "api-ip", Path: "/api/**", Scope: ScopeIP, Algorithm: SlidingWindow, Limit: 100, WindowSeconds: 60, Priority: 10},
		{ID: "api-ip-specific", Path: "/api/v1/**", Scope: ScopeIP, Algorithm: SlidingWindow, Limit: 50, WindowSeconds: 60, Priority: 10},
		{ID: "free-users", Tiers: []string{"free"}, Scope: ScopeUser, Algorithm: TokenBucket, Limit: 10, WindowSeconds: 60},
		{ID: "keys", Scope: ScopeAPIKey, Algorithm: GCRA, Limit: 10, WindowSeconds: 60},
		{ID: "tenants", Scope: ScopeTenant, Algorithm: GCRA, Limit: 1000, WindowSeconds: 60},
		{ID: "everyone", Scope: ScopeGlobal, Algorithm: GCRA, Limit: 100000, WindowSeconds: 60},
		{ID: "disabled", Scope: ScopeGlobal, Algorithm: GCRA, Limit: 1, WindowSeconds: 60, Priority: 1000, Enabled: &off},
		{ID: "login-trial", Path: "/api/v1/auth/login", Methods: []string{"POST"}, Scope: ScopeIP, Algorithm: FixedWindow, Limit: 2, WindowSeconds: 60, Priority: 200, Action: ActionLogOnly},
		{ID: "login-trial-2", Path: "/api/v1/auth/**", Scope: ScopeIP, Algorithm: FixedWindow, Limit: 1, WindowSeconds: 60, Priority: 150, Action: ActionLogOnly},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  Request
		want string
	}{
		{"login by ip, its trial beside it, not instead", Request{Method: "POST", Path: "/api/v1/auth/login", IdentityKind: "ip"}, "everyone,login-trial,login"},
		{"login GET falls to specific glob, and the other trial", Request{Method: "GET", Path: "/api/v1/auth/login", IdentityKind: "ip"}, "everyone,login-trial-2,api-ip-specific"},
		{"export by GET", Request{Method: "GET", Path: "/api/v1/export", IdentityKind: "ip"}, "everyone,export"},
		{"HEAD counts for a GET rule", Request{Method: "HEAD", Path: "/api/v1/export", IdentityKind: "ip"}, "everyone,export"},
		{"POST is not GET", Request{Method: "POST", Path: "/api/v1/export", IdentityKind: "ip"}, "everyone,api-ip-specific"},
		{"HEAD is not POST", Request{Method: "HEAD", Path: "/api/v1/auth/login", IdentityKind: "ip"}, "everyone,login-trial-2,api-ip-specific"},
		{"GET overridden to POST counts as a login", Request{Method: "GET", MethodOverride: "POST", Path: "/api/v1/auth/login", IdentityKind: "ip"}, "everyone,login-trial,login"},
		{"POST overridden to GET still counts as POST", Request{Method: "POST", MethodOverride: "GET", Path: "/api/v1/auth/login", IdentityKind: "ip"}, "everyone,login-trial,login"},
		{"POST overridden to GET counts for a GET rule", Request{Method: "POST", MethodOverride: "GET", Path: "/api/v1/export", IdentityKind: "ip"}, "everyone,export"},
		{"api v2 by ip", Request{Method: "GET", Path: "/api/v2/x", IdentityKind: "ip"}, "everyone,api-ip"},
		{"free user", Request{Tier: "free", Path: "/x", IdentityKind: "user"}, "everyone,free-users"},
		{"premium user", Request{Tier: "premium", Path: "/x", IdentityKind: "user"}, "everyone"},
		{"key with tenant", Request{Path: "/x", IdentityKind: "key", Tenant: "acme"}, "everyone,tenants,keys"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := matched(set, tt.req); got != tt.want {
				t.Fatalf("Match = %s, want %s", got, tt.want)
			}
		})
	}
}

// A runtime rule (the admin API's) counts beside the config file's winner
// of its scope, never instead of it: the file's limits are the operator's
// own, which the API may not change (attack 53: a runtime rule identical
// to a file's login limit but for its limit, or of a higher priority, or
// on a more specific path, took an address's 3 logins a minute to a
// million). Among themselves runtime rules have one winner per scope.
func TestMatchRuntimeRulesCountBesideTheFiles(t *testing.T) {
	set, err := NewSet("v1", []Rule{
		{ID: "login", Path: "/login", Scope: ScopeIP, Algorithm: FixedWindow, Limit: 3, WindowSeconds: 60, Priority: 100},
		{ID: "cap", Path: "/reports/**", Scope: ScopeGlobal, Algorithm: FixedWindow, Limit: 5, WindowSeconds: 60},
		{ID: "1", Path: "/login", Scope: ScopeIP, Algorithm: FixedWindow, Limit: 1_000_000, WindowSeconds: 60, Priority: 100, Runtime: true},
		{ID: "2", Path: "/**", Scope: ScopeGlobal, Algorithm: FixedWindow, Limit: 1_000_000, WindowSeconds: 60, Priority: 1, Runtime: true},
		{ID: "3", Path: "/reports/x", Scope: ScopeGlobal, Algorithm: FixedWindow, Limit: 1_000_000, WindowSeconds: 60, Priority: 9, Runtime: true},
		{ID: "4", Path: "/api/**", Scope: ScopeIP, Algorithm: FixedWindow, Limit: 10, WindowSeconds: 60, Runtime: true},
		{ID: "trial", Path: "/trial", Scope: ScopeIP, Algorithm: FixedWindow, Limit: 3, WindowSeconds: 60, Action: ActionLogOnly},
		{ID: "5", Path: "/trial", Scope: ScopeIP, Algorithm: FixedWindow, Limit: 1, WindowSeconds: 60, Priority: 9, Action: ActionLogOnly, Runtime: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  Request
		want string
	}{
		{"the same rule with a lower id", Request{Path: "/login", IdentityKind: "ip"}, "2,1,login"},
		{"a higher priority on a more specific path", Request{Path: "/reports/x", IdentityKind: "ip"}, "3,cap"},
		{"a file rule of the scope, runtime ones their own winner", Request{Path: "/reports/y", IdentityKind: "ip"}, "2,cap"},
		{"no file rule in the scope", Request{Path: "/api/v1", IdentityKind: "ip"}, "2,4"},
		{"a runtime trial beside the file's", Request{Path: "/trial", IdentityKind: "ip"}, "2,5,trial"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := matched(set, tc.req); got != tc.want {
				t.Fatalf("Match = %s, want %s", got, tc.want)
			}
		})
	}
}

// matched is the ids of the rules set matches for req, in order, joined
// by commas.
func matched(set *Set, req Request) string {
	var ids []string
	for _, r := range set.Match(nil, req) {
		ids = append(ids, r.ID)
	}
	return strings.Join(ids, ",")
}

func ExampleSet_Match() {
	set, _ := NewSet("v1", []Rule{
		{ID: "search", Path: "/api/search", Scope: ScopeUser, Algorithm: SlidingWindow, Limit: 10, WindowSeconds: 60, Priority: 10},
		{ID: "api", Path: "/api/**", Scope: ScopeUser, Algorithm: TokenBucket, Limit: 100, WindowSeconds: 60},
	})
	for _, r := range set.Match(nil, Request{Path: "/api/search", IdentityKind: "user"}) {
		fmt.Println(r.ID, r.Limit)
	}
	// Output: search 10
}

func FuzzMatchGlob(f *testing.F) {
	f.Add("/api/**/x", "/api/a/b/x")
	f.Add("/a*b?c", "/aXbYc")
	f.Add("/**/a/**/b", "/x/a/y/a/b")
	f.Add("/a/**", "/a")
	f.Add("/**", "/")
	f.Add("/**/*.php", "/x/y/index.php")
	f.Fuzz(func(t *testing.T, pattern, path string) {
		if ValidateGlob(pattern) != nil {
			return
		}
		// Must terminate quickly and agree with the trivial cases, and
		// with the plain backtracking matcher.
		got := MatchGlob(pattern, path)
		if !strings.ContainsAny(pattern, "*?") && got != (pattern == path) {
			t.Fatalf("literal %q vs %q: %v", pattern, path, got)
		}
		if want := backtrackGlob(pattern, path); got != want {
			t.Fatalf("MatchGlob(%q, %q) = %v, backtracking says %v", pattern, path, got, want)
		}
	})
}

// backtrackGlob is MatchGlob without its last-"**" shortcut: every split
// of the path tried.
func backtrackGlob(pattern, path string) bool {
	pi, si := 0, 0
	starP, starS := -1, -1
	for si <= len(path) {
		if pi <= len(pattern) {
			pseg, pnext := segment(pattern, pi)
			if pseg == "**" {
				starP, starS = pnext, si
				pi = pnext
				continue
			}
			sseg, snext := segment(path, si)
			if matchSegment(pseg, sseg) {
				pi, si = pnext, snext
				continue
			}
		}
		if starP < 0 {
			return false
		}
		_, starS = segment(path, starS)
		pi, si = starP, starS
	}
	for pi <= len(pattern) {
		pseg, pnext := segment(pattern, pi)
		if pseg != "**" {
			return false
		}
		pi = pnext
	}
	return true
}

// A path segment may hold a '*' (a plain character in a path): the
// pattern's '*' matches it as it matches anything. The matcher before took
// it for a literal first and then failed: a client adding a '*' to a
// segment walked around "/api/*".
func TestStarMatchesAStar(t *testing.T) {
	for _, c := range [][2]string{{"/api/*", "/api/*x"}, {"/*", "/*0"}, {"/a*", "/a*b"}, {"/**/*.php", "/x/*.php"}} {
		if !MatchGlob(c[0], c[1]) {
			t.Errorf("%q does not match %q", c[0], c[1])
		}
	}
}

// matchSegment agrees with the greedy one-star backtracking matcher it
// replaced, on any segment.
func FuzzMatchSegment(f *testing.F) {
	for _, c := range [][2]string{{"*.php", "index.php"}, {"a*b?c", "aXbYc"}, {"*a*a*b", "aaaaab"}, {"?*?", "ab"}, {"*", ""}, {"a**b", "ab"}, {"*ab*ab*", "xabyab"},
		{"*a?c*", "xxabcx"}, {"*??*", "a"}, {"*a?b?c*d", "zaxbycd"}, {"x*?a*", "xya"}} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, p, s string) {
		// A '*' in the segment the old matcher took for itself before it
		// took it for the pattern's star: "/api/*" did not match
		// "/api/*x" (TestStarMatchesAStar).
		if strings.Contains(p, "/") || strings.ContainsAny(s, "/*") {
			return
		}
		if got, want := matchSegment(p, s), backtrackSegment(p, s); got != want {
			t.Fatalf("matchSegment(%q, %q) = %v, backtracking says %v", p, s, got, want)
		}
	})
}

// backtrackSegment is the greedy one-star backtracking matcher.
func backtrackSegment(p, s string) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && (p[pi] == '?' || p[pi] == s[si]):
			pi++
			si++
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case star >= 0:
			mark++
			pi, si = star+1, mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// One segment's stars are matched chunk by chunk: an outsider's
// "/*aaa...ab" of 1 KB against an 8 KB segment took 4 ms a match.
func BenchmarkMatchGlobLongSegment(b *testing.B) {
	pattern := "/*" + strings.Repeat("a", 1021) + "b"
	path := "/" + strings.Repeat("a", 8191)
	for b.Loop() {
		MatchGlob(pattern, path)
	}
}

// A chunk with a '?' is found by its longest run without one: an
// outsider's "/*a?aaa...ab*" of 1 KB took 2.85 ms a check of an 8 KB path.
func BenchmarkMatchGlobQuestionChunk(b *testing.B) {
	pattern := "/*a?" + strings.Repeat("a", 1018) + "b*"
	path := "/" + strings.Repeat("a", 8191)
	for b.Loop() {
		MatchGlob(pattern, path)
	}
}

// index finds a chunk with '?' where trying every offset does, for chunks
// of one word of bits and of several (the shift-and's carry between them).
func TestIndexWithQuestionMarks(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(n int, alphabet string) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	naive := func(s, chunk string) int {
		for at := 0; at+len(chunk) <= len(s); at++ {
			if chunkAt(chunk, s, at) {
				return at
			}
		}
		return -1
	}
	for range 3000 {
		chunk := pick(1+rng.IntN(150), "ab??") + "?"
		s := pick(rng.IntN(400), "aab")
		if at := rng.IntN(len(s) + 1); rng.IntN(2) == 0 && at+len(chunk) <= len(s) {
			// A match planted, its '?' as 'b'.
			s = s[:at] + strings.ReplaceAll(chunk, "?", "b") + s[at+len(chunk):]
		}
		if got, want := index(s, chunk), naive(s, chunk); got != want {
			t.Fatalf("index(%q, %q) = %d, want %d", s, chunk, got, want)
		}
	}
}

// A chunk whose every other byte is '?' has no run long enough to find it
// by: an outsider's 100 rules of such patterns made a check of an 8 KB
// path cost 262 ms (2.6 ms a rule).
func BenchmarkMatchGlobQuestionEveryOther(b *testing.B) {
	pattern := "/*" + strings.Repeat("a?", 511) + "b*"
	path := "/" + strings.Repeat("a", 8191)
	for b.Loop() {
		MatchGlob(pattern, path)
	}
}

// A '?' chunk tried against every segment of a long path of short
// segments (after a "**") costs nothing per segment shorter than it: the
// shift-and's tables were built for each (216 ms a check).
func BenchmarkMatchGlobQuestionShortSegments(b *testing.B) {
	pattern := "/**/*a" + strings.Repeat("???b", 250) + "*/**"
	path := strings.Repeat("/a", 4000)
	for b.Loop() {
		MatchGlob(pattern, path)
	}
}

// A pattern's tail after its last "**" is matched against the path's last
// segments at once: an outsider's 1 KB pattern against an 8 KB path took
// 16 ms a match trying every split.
func BenchmarkMatchGlobLongTail(b *testing.B) {
	pattern := "/**" + strings.Repeat("/a", 30) + "/b"
	path := strings.Repeat("/a", 4000)
	for b.Loop() {
		MatchGlob(pattern, path)
	}
}

func BenchmarkMatchGlobHostile(b *testing.B) {
	pattern := "/**/a*a*a*a*a*a*a*b"
	path := "/" + strings.Repeat("a/", 200) + strings.Repeat("a", 2000)
	for b.Loop() {
		MatchGlob(pattern, path)
	}
}

// Patterns are spelled as requests are normalised, or they would never match.
func TestValidateGlobWantsCanonicalSpelling(t *testing.T) {
	for p, ok := range map[string]bool{
		"/api/v1/items": true, "/api/**": true, "/api/*/users": true, "/a?c": true, "/": true, "/.well-known/*": true,
		"/api/v1/items/": false, "/api//items": false, "/api/./items": false, "/api/../x": false,
		"/api;v=1/x": false, "/%69tems": false, "api": false,
		strings.Repeat("/a", 32): true, strings.Repeat("/a", 33): false, // at most 32 segments
	} {
		if err := ValidateGlob(p); (err == nil) != ok {
			t.Errorf("%q: %v", p, err)
		}
	}
}

// CostSourceOf reads what ParseCostFrom accepted the same way.
func TestCostSourceOf(t *testing.T) {
	for _, s := range []string{"", "request_body_bytes", "request_header:x-tokens", "response_header:x-usage", "response_json:usage.input_tokens+usage.output_tokens"} {
		src, name, err := ParseCostFrom(s)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if gsrc, gname := CostSourceOf(s); gsrc != src || gname != name {
			t.Errorf("%q: %v %q, ParseCostFrom says %v %q", s, gsrc, gname, src, name)
		}
	}
}

// A section between two "**" is found in one walk of the path: an
// outsider's "/**/a/.../a/b/**" (28 a's) against a path of 4,096 segments
// took 2.5 ms a check tried from every segment.
func BenchmarkMatchGlobMiddleSection(b *testing.B) {
	for name, pattern := range map[string]string{
		"literal":  "/**" + strings.Repeat("/a", 28) + "/b/**",
		"wildcard": "/**" + strings.Repeat("/*", 28) + "/b/**",
	} {
		b.Run(name, func(b *testing.B) {
			path := strings.Repeat("/a", 4096)
			for b.Loop() {
				if MatchGlob(pattern, path) {
					b.Fatal("matched")
				}
			}
		})
	}
}
