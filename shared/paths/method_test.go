package paths

import (
	"strings"
	"testing"
)

// EachMethodParam yields the decoded value of every parameter, split at
// '&' and ';', whose name a framework reads as _method, in order.
func FuzzEachMethodParam(f *testing.F) {
	for _, s := range []string{"/x?_method=DELETE", "/x?a=1;%5Fmethod=put&_method", "/x?+++.method=X&&;", "/x", "?_method=%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		var got []string
		EachMethodParam(p, func(v string) bool { got = append(got, v); return true })
		var want []string
		if _, q, ok := strings.Cut(p, "?"); ok {
			for _, param := range strings.FieldsFunc(q, func(r rune) bool { return r == '&' || r == ';' }) {
				if name, value, _ := strings.Cut(param, "="); IsMethodParam(name) {
					want = append(want, FormUnescape(value))
				}
			}
		}
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") || len(got) != len(want) {
			t.Fatalf("%q: %q, want %q", p, got, want)
		}
	})
}

func TestIsMethodParam(t *testing.T) {
	for name, want := range map[string]bool{"_method": true, "%5Fmethod": true, ".METHOD": true, "[method": true, "   _method": true,
		"_method%00x": true, "method": false, "_methods": false, "x_method": false, "": false} {
		if IsMethodParam(name) != want {
			t.Errorf("IsMethodParam(%q) = %v", name, !want)
		}
	}
}
