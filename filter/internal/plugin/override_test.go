package plugin

import (
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/paths"
)

func TestQueryOverrides(t *testing.T) {
	for _, c := range []struct {
		path     string
		n        int
		override string
		conflict bool
	}{
		{"/items", 0, "", false},
		{"/items?a=1&b=2", 0, "", false},
		{"/items?_method=DELETE", 1, "DELETE", false},
		{"/items?a=1;_method=put", 1, "put", false},
		{"/items?%5Fmethod=DELETE", 1, "DELETE", false},
		{"/items?%5f%6D%65%74%68%6f%64=PATCH", 1, "PATCH", false},
		{"/items?.method=DELETE", 1, "DELETE", false},                    // PHP reads '.' as '_'
		{"/items?+method=DELETE", 0, "", false},                          // a leading space is dropped: PHP reads "method"
		{"/items?%20_method=DELETE", 1, "DELETE", false},                 // a leading space is dropped
		{"/items?+++++++++++++++_method=DELETE", 1, "DELETE", false},     // however many (an outsider's attack)
		{"/items?+%20+%5F%6D%65%74%68%6F%64=DELETE", 1, "DELETE", false}, // spaces and escapes together
		{"/items?_method%00=DELETE", 1, "DELETE", false},                 // PHP cuts a name at a NUL
		{"/items?_method%00x=DELETE", 1, "DELETE", false},
		{"/items?_METHOD=DELETE", 1, "DELETE", false},
		{"/items?_method=DEL%45TE", 1, "DELETE", false},
		{"/items?_method=GET&_method=get", 2, "get", false},
		{"/items?_method=GET&_method=DELETE", 2, "DELETE", true},
		{"/items?_method", 1, "", false}, // no value: refused later as no method
		{"/items?x_method=DELETE&_methods=DELETE&method=DELETE", 0, "", false},
		{"/items?a=_method=DELETE", 0, "", false},
		// The read stops at a conflict, and at sixteen repeats (an
		// outsider's query of thousands cost a millisecond and more).
		{"/items?_method=PUT&_method=DELETE&_method=PUT&_method=GET", 2, "DELETE", true},
		{"/items?" + strings.Repeat("_method=GET&", 15), 15, "GET", false},
		{"/items?" + strings.Repeat("_method=GET&", 4000), maxQueryOverrides, "GET", true},
	} {
		rq := request{rawPath: c.path}
		rq.queryOverrides()
		if rq.queryOverride != c.n || rq.override != c.override || rq.overrideConflict != c.conflict {
			t.Errorf("%s: %d parameters, override %q, conflict %v; want %d, %q, %v", c.path, rq.queryOverride, rq.override, rq.overrideConflict, c.n, c.override, c.conflict)
		}
	}
	// A parameter that disagrees with a header is a conflict too.
	rq := request{rawPath: "/x?_method=DELETE", overrides: 1, override: "PUT"}
	if rq.queryOverrides(); !rq.overrideConflict {
		t.Error("a _method parameter that disagrees with the header was not a conflict")
	}
}

func TestWithoutMethodParams(t *testing.T) {
	for in, want := range map[string]string{
		"/items":                           "/items",
		"/items?":                          "/items?",
		"/items?a=1":                       "/items?a=1",
		"/items?_method=DELETE":            "/items",
		"/items?_method=DELETE&a=1":        "/items?a=1",
		"/items?a=1&_method=DELETE":        "/items?a=1",
		"/items?a=1;_method=DELETE&b=%202": "/items?a=1;_method=DELETE&b=%202", // one parameter "a" to PHP and qs
		"/items?a=1&%5Fmethod=X;b=2":       "/items?a=1",                       // "_method" = "X;b=2" to them
		"/items?++++_method%00=X&b=2":      "/items?b=2",
		"/items?_method=A&_method=B":       "/items",
		"/items?a&&b":                      "/items?a&&b",
	} {
		if got := withoutMethodParams(in); got != want {
			t.Errorf("withoutMethodParams(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzWithoutMethodParams: what is left has no _method parameter (split
// at '&', as the frameworks that read one from the query split), and every
// other parameter, in order and as sent.
func FuzzWithoutMethodParams(f *testing.F) {
	f.Add("/items?a=1;_method=DELETE&b=%202")
	f.Add("/x?%5Fmethod=1&&_method")
	f.Fuzz(func(t *testing.T, path string) {
		got := withoutMethodParams(path)
		params := func(p string) (kept []string, overrides int) {
			_, q, ok := strings.Cut(p, "?")
			if !ok {
				return nil, 0
			}
			for _, s := range strings.Split(q, "&") {
				if name, _, _ := strings.Cut(s, "="); paths.IsMethodParam(name) {
					overrides++
				} else if s != "" {
					kept = append(kept, s)
				}
			}
			return kept, overrides
		}
		if _, n := params(got); n != 0 {
			t.Fatalf("%q -> %q still has a _method parameter", path, got)
		}
		a, _ := params(path)
		if b, _ := params(got); strings.Join(a, "\x00") != strings.Join(b, "\x00") {
			t.Fatalf("%q -> %q: parameters %q, want %q", path, got, b, a)
		}
		if before, _, _ := strings.Cut(path, "?"); !strings.HasPrefix(got, before) {
			t.Fatalf("%q -> %q changed the path", path, got)
		}
	})
}
