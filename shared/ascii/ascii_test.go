package ascii

import (
	"regexp"
	"strings"
	"testing"
)

// Each set agrees with the regular expression it replaces.
func TestAgreesWithRegexp(t *testing.T) {
	for _, tc := range []struct {
		spec     string
		min, max int
		re       string
	}{
		{"a-z0-9_", 1, 64, `^[a-z0-9_]{1,64}$`},
		{"A-Za-z0-9_.|:-", 1, 256, `^[A-Za-z0-9_.|:-]{1,256}$`},
		{"a-z0-9-", 1, 64, `^[a-z0-9-]{1,64}$`},
		{"A-Za-z0-9_:./-", 1, 64, `^[A-Za-z0-9_:./-]{1,64}$`},
		{"A-Z", 1, 16, `^[A-Z]{1,16}$`},
	} {
		set, re := NewSet(tc.spec), regexp.MustCompile(tc.re)
		for _, s := range []string{"", "a", "A", "free", "Free", "x-api-key", "x_api_key", "a.b", "a|b", "a:b", "a/b", "a b", "é",
			"a\n", "-", strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("A", 16), strings.Repeat("A", 17), "outbound|8081||svc.ns"} {
			if got, want := set.Match(s, tc.min, tc.max), re.MatchString(s); got != want {
				t.Errorf("%s on %q: %v, regexp says %v", tc.spec, s, got, want)
			}
		}
	}
}

func FuzzAgreesWithRegexp(f *testing.F) {
	set, re := NewSet("A-Za-z0-9_:./-"), regexp.MustCompile(`^[A-Za-z0-9_:./-]{1,64}$`)
	f.Add("sub")
	f.Fuzz(func(t *testing.T, s string) {
		if set.Match(s, 1, 64) != re.MatchString(s) {
			t.Fatalf("%q", s)
		}
	})
}
