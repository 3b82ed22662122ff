package paths

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestNormalize(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/", "/"},
		{"/api/v1/items", "/api/v1/items"},
		{"/api/v1/items?x=1&y=/../z", "/api/v1/items"},
		{"/api/v1/items#frag", "/api/v1/items"},
		{"/api/v1/%69tems", "/api/v1/items"},
		{"/api/v1/%69%74%65%6D%73", "/api/v1/items"},
		{"/api/v1/%69%74%65%6d%73", "/api/v1/items"},
		{"/api/v1/items/", "/api/v1/items"},
		{"/api/v1/items//", "/api/v1/items"},
		{"//api///v1//items", "/api/v1/items"},
		{"/api/v1/items;a", "/api/v1/items"},
		{"/api/v1/items;jsessionid=1;x", "/api/v1/items"},
		{"/api/v1/./items", "/api/v1/items"},
		{"/api/v1/x/../items", "/api/v1/items"},
		{"/api/v1/x/..;", "/api/v1"},
		{"/api/v1/x/%2e%2e/items", "/api/v1/items"},
		{"/api/v1/x/.%2E/items", "/api/v1/items"},
		{"/../../api/v1/items", "/api/v1/items"},
		{"/api/v1/..", "/api"},
		{"/..", "/"},
		{"/.", "/"},
		{"//", "/"},
		{"/api%2Fv1%2fitems", "/api/v1/items"},
		{"/api%5Cv1\\items", "/api/v1/items"},
		{"/api/v1/auth/%6cogin", "/api/v1/auth/login"},
		{"/a%21b", "/a!b"},
		{"/a%3Bb", "/a%3Bb"},
		{"/a%3bb", "/a%3Bb"},
		{"/a%25b", "/a%25b"},
		{"/a%252Fb", "/a%252Fb"}, // decoded once, not twice
		{"/a%3fb", "/a%3Fb"},
		{"/caf\u00e9", "/caf%C3%A9"},
		{"/caf%c3%a9", "/caf%C3%A9"},
		{"/a\"b", "/a%22b"},
		{"/a{b}", "/a%7Bb%7D"},
		{"/Items", "/Items"}, // case is significant
		{"/...", "/..."},     // three dots are a name
		{"/.well-known/x", "/.well-known/x"},
	} {
		got, err := Normalize(tc.in)
		if err != nil {
			t.Errorf("Normalize(%q): %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("Normalize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestNormalizeRefuses(t *testing.T) {
	for _, in := range []string{
		"", "api/v1", "*", "http://host/api", "?x=1",
		"/a%", "/a%2", "/a%zz", "/a%%41",
		"/a b", "/a\tb", "/a\r\nX-Evil: 1", "/a\x00b", "/a\x7fb",
		"/a%00", "/a%0a/b", "/a%0D%0AX-Evil:%201", "/a%7F", "/a%1f",
		// A ';' that more path follows, or that opens a segment: Fastify
		// ends the path there, servlets keep it in its segment, Express
		// and Django read it as a byte of the name.
		"/api/login;/x", "/api/items/1;/x", "/api;v=2/v1/items", "/api/v1/x/..;/items", "/a;b%2Fc", "/a;b\\c",
		"/items;x/", "/api/items/;x", "/;x", "/a/;/b",
		"/" + strings.Repeat("a", MaxLen),
		"/" + strings.Repeat("\xf3", MaxLen/3+1), // too long once escaped
	} {
		if got, err := Normalize(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("Normalize(%q) = %q, %v; want ErrInvalid", clip(in), got, err)
		}
	}
}

func TestNormalizeCanonicalDoesNotAllocate(t *testing.T) {
	in := "/api/v1/items/123?page=2"
	if n := testing.AllocsPerRun(100, func() { _, _ = Normalize(in) }); n != 0 {
		t.Fatalf("%v allocations for a canonical path", n)
	}
}

// FuzzNormalize checks the properties every output must have: it is
// canonical (a fixed point), starts with "/", and holds no empty, "." or ".."
// segment, no ";", no raw byte that needs escaping, and no trailing slash.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"/", "/api/v1/items", "/a/../b", "/a;b/c", "/%2e%2E/x", "//x//", "/caf\u00e9", "/a%2Fb", "/x?y#z", "/a%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := Normalize(in)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		again, err := Normalize(out)
		if err != nil || again != out {
			t.Fatalf("Normalize(%q) = %q, then %q, %v: not a fixed point", clip(in), clip(out), clip(again), err)
		}
		if out[0] != '/' || (len(out) > 1 && strings.HasSuffix(out, "/")) {
			t.Fatalf("Normalize(%q) = %q: bad slashes", clip(in), clip(out))
		}
		for _, seg := range strings.Split(out[1:], "/") {
			if len(out) > 1 && (seg == "" || seg == "." || seg == "..") {
				t.Fatalf("Normalize(%q) = %q: segment %q", clip(in), clip(out), clip(seg))
			}
		}
		for i := 0; i < len(out); i++ {
			if c := out[i]; c != '/' && c != '%' && !plain(c) {
				t.Fatalf("Normalize(%q) = %q: raw byte %q", clip(in), clip(out), c)
			}
		}
		// Folded, it is still canonical, a fixed point of FoldCase, no
		// upper-case letter outside escapes, and only case changed.
		folded := FoldCase(out)
		if again, err := Normalize(folded); err != nil || again != folded || FoldCase(folded) != folded || !strings.EqualFold(folded, out) || len(folded) != len(out) {
			t.Fatalf("FoldCase(%q) = %q: Normalize %q %v", clip(out), clip(folded), clip(again), err)
		}
		for i := 0; i < len(folded); i++ {
			if c := folded[i]; c == '%' {
				i += 2
			} else if 'A' <= c && c <= 'Z' {
				t.Fatalf("FoldCase(%q) = %q: upper-case %q left", clip(out), clip(folded), c)
			}
		}
	})
}

func TestFoldCase(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"/", "/"},
		{"/api/v1/items", "/api/v1/items"},
		{"/API/V1/Items", "/api/v1/items"},
		{"/caf%C3%A9/%C3%89T%C3%89", "/caf%C3%A9/%C3%89t%C3%89"}, // escapes kept as they are
		{"/a%22B", "/a%22b"},
		{"/X", "/x"},
	} {
		if got := FoldCase(tt.in); got != tt.want {
			t.Errorf("FoldCase(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = FoldCase("/api/v1/items%C3%A9") }); n != 0 {
		t.Fatalf("%v allocations for a lower-case path", n)
	}
}

func TestFoldSuffix(t *testing.T) {
	for in, want := range map[string]string{
		"/login":             "/login",
		"/login.json":        "/login",
		"/login.":            "/login",
		"/login...":          "/login",
		"/login%20":          "/login",
		"/login.%20.":        "/login",
		"/login.json.":       "/login",
		"/login.x.json":      "/login",
		"/api/v1/items.XML":  "/api/v1/items",
		"/a/.json":           "/a/.json",
		"/a/b.":              "/a/b",
		"/a/...":             "/a",
		"/...":               "/",
		"/":                  "/",
		"/file.tar-gz":       "/file.tar-gz",
		"/file.abcdefghijk":  "/file.abcdefghijk",
		"/v1.2/items":        "/v1.2/items",
		"/files/*.json":      "/files/*",
		"/a%2Fb.json":        "/a%2Fb",
		"/caf%C3%A9.json":    "/caf%C3%A9",
		"/report.csv%20%20.": "/report",
	} {
		if got := FoldSuffix(in); got != want {
			t.Errorf("FoldSuffix(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzFoldSuffix: folding a normalised path gives a normalised path, and
// folding again changes nothing.
func TestCanonical(t *testing.T) {
	for in, want := range map[string]string{
		"/api/v1/items": "/api/v1/items", "/": "/", "/x?/../y": "/x", "/a.b/c..d": "/a.b/c..d", "/@me:1,2": "/@me:1,2",
		// Each of these goes through the three checks.
		"/a/../b": "", "/a/./b": "", "/a/": "", "//x": "", "/a;b": "", "/a%2Fb": "", "/a%41": "", "/a\\b": "",
		"/a#/../b": "", "/caf\u00e9": "", "api": "", "": "", "?/x": "",
	} {
		if got, ok := Canonical(in); got != want || ok != (want != "") {
			t.Errorf("Canonical(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

// A path Canonical accepts is one the filter's three checks pass as it is.
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{"/", "/api/v1/items", "/a/../b", "/a/./b", "/a;b/c", "/%2e%2E/x", "//x//", "/a%2Fb", "/a\\b",
		"/x?y#z", "/a#/../b", "/x?/../y", "/a/", "/..", "/.", "/a.b/c..d", "api", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p, ok := Canonical(in)
		if !ok {
			if p != "" {
				t.Fatalf("Canonical(%q) = %q, false", clip(in), clip(p))
			}
			return
		}
		if n, err := Normalize(in); err != nil || n != p {
			t.Fatalf("Canonical(%q) = %q, Normalize %q, %v", clip(in), clip(p), clip(n), err)
		}
		if HasEscapedSlash(in) || HasDotSegment(in) {
			t.Fatalf("Canonical(%q) = %q, but HasEscapedSlash %v, HasDotSegment %v", clip(in), clip(p), HasEscapedSlash(in), HasDotSegment(in))
		}
	})
}

func FuzzFoldSuffix(f *testing.F) {
	for _, s := range []string{"/login.json", "/a/...", "/x%20.", "/", "/0./..0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		n, err := Normalize(raw)
		if err != nil {
			return
		}
		got := FoldSuffix(n)
		if again, err := Normalize(got); err != nil || again != got {
			t.Fatalf("FoldSuffix(%q) = %q, which normalises to %q (%v)", n, got, again, err)
		}
		if FoldSuffix(got) != got {
			t.Fatalf("FoldSuffix(%q) = %q, folded again %q", n, got, FoldSuffix(got))
		}
	})
}

// FuzzFormUnescape: FormUnescape decodes what url.QueryUnescape decodes,
// and keeps what it refuses instead of failing.
func FuzzFormUnescape(f *testing.F) {
	f.Add("a+b%20c%zz%4")
	f.Fuzz(func(t *testing.T, s string) {
		got := FormUnescape(s)
		if want, err := url.QueryUnescape(s); err == nil && got != want {
			t.Fatalf("FormUnescape(%q) = %q, want %q", s, got, want)
		}
	})
}

func TestHasEscapedSlash(t *testing.T) {
	for path, want := range map[string]bool{
		"/a%2Fb": true, "/a%2fb": true, "/a%5Cb": true, "/a%5cb": true, `/a\b`: true, "/%2F": true,
		"/a?x=%2F": false, `/a?x=\`: false, "/a%252F": false, "/a%2": false, "/a%": false, "/a": false, "/a%20b": false,
	} {
		if got := HasEscapedSlash(path); got != want {
			t.Errorf("%q: %v, want %v", path, got, want)
		}
	}
}

func TestFoldScript(t *testing.T) {
	for in, want := range map[string]string{
		"/index.php/api/v1/auth/login": "/api/v1/auth/login",
		"/INDEX.PHP/api":               "/api",
		"/app/index.php/api":           "/app/api",
		"/a.php/b.php/c":               "/c",
		"/index.php/":                  "/",
		"/index.php":                   "/index.php",
		"/report.php":                  "/report.php",
		"/api/.php/x":                  "/api/.php/x",
		"/api/v1/items":                "/api/v1/items",
		"/":                            "/",
		"/php/x":                       "/php/x",
		"/a.phpx/b":                    "/a.phpx/b",
		"/index.phtml/api/login":       "/api/login",
		"/s.pht/x":                     "/x",
		"/s.PHT/x":                     "/x",
		"/index.PHAR/api":              "/api",
		"/index.php5/api":              "/api",
		"/index.php8/api":              "/api",
		"/index.php9/api":              "/index.php9/api",
		"/index.php2/api":              "/index.php2/api",
		"/a.phtm/b":                    "/a.phtm/b",
		"/a.pharx/b":                   "/a.pharx/b",
		"/.phtml/b":                    "/.phtml/b",
	} {
		if got := FoldScript(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

// FoldScript keeps a path normalised and is idempotent.
func FuzzFoldScript(f *testing.F) {
	for _, s := range []string{"/index.php/api", "/a.php/b.php/c", "/x", "/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		p, err := Normalize(raw)
		if err != nil {
			return
		}
		once := FoldScript(p)
		if again := FoldScript(once); again != once {
			t.Fatalf("%q: %q then %q", p, once, again)
		}
		if n, err := Normalize(once); err != nil || n != once {
			t.Fatalf("%q folded to %q, which normalises to %q (%v)", p, once, n, err)
		}
		// A path FoldScript changes has a script, a prefix of it ending
		// in a script segment; one it keeps has none.
		script := ScriptPath(p)
		if (script == "") != (once == p) {
			t.Fatalf("%q: folded to %q, script %q", p, once, script)
		}
		if script != "" && (!strings.HasPrefix(p, script+"/") || !scriptName(script[strings.LastIndexByte(script, '/')+1:])) {
			t.Fatalf("%q: script %q", p, script)
		}
	})
}

// The script a path with path info runs: "/login.php/x" runs login.php
// with PATH_INFO "/x" (PHP's own server; nginx and Apache as usually
// configured), so a rule on "/login.php" must count it (an outsider ran a
// login script 50 times past a rule of 3 as "/login.php/{i}").
func TestScriptPath(t *testing.T) {
	for in, want := range map[string]string{
		"/login.php/x":          "/login.php",
		"/LOGIN.PHP/x":          "/LOGIN.PHP",
		"/app/index.php/api/v1": "/app/index.php",
		"/a.php/b.php/c":        "/a.php",
		"/login.php":            "",
		"/api/.php/x":           "",
		"/a.phpx/b":             "",
		"/login.phtml/x":        "/login.phtml",
		"/login.Php7/x/y":       "/login.Php7",
		"/app.phar/run":         "/app.phar",
		"/login.phtml":          "",
		"/api/v1/items":         "",
		"/":                     "",
	} {
		if got := ScriptPath(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

func TestHasDotSegment(t *testing.T) {
	for path, want := range map[string]bool{
		"/a/../b": true, "/a/./b": true, "/a/%2e%2E/b": true, "/a/%2e/b": true, "/a/..;x/b": true, "/a/..": true, "/..": true, "/a/.": true,
		// Between separators Normalize reads, not only '/'.
		"/files/report.pdf%2F..%2F..%2Fother": true, "/a%5C..%5Cb": true, `/a\..\b`: true, "/a/..%2fb": true, "/a%2f.": true,
		"/a/.../b": false, "/a/..b": false, "/a/.b": false, "/a/b.": false, "/a/b?x=/../": false, "/a/b": false, "/": false, "/a/%2e%2e%2e": false,
	} {
		if got := HasDotSegment(path); got != want {
			t.Errorf("%q: %v, want %v", path, got, want)
		}
	}
}

// HasDotSegment agrees with a plain reading: every separator Normalize
// reads made '/', the segments split, their ';' parameters dropped and
// "%2E" read as '.'.
func FuzzHasDotSegment(f *testing.F) {
	for _, s := range []string{"/a/../b", "/a%2F..%2Fb", `/a\.\b`, "/a/..;x/b", "/a/.%2e/b", "/a/...", "/?/../", "/%2e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		p, _, _ := strings.Cut(raw, "?")
		var b strings.Builder
		for i := 0; i < len(p); i++ {
			if p[i] == '\\' {
				b.WriteByte('/')
				continue
			}
			if p[i] == '%' && i+2 < len(p) && (strings.EqualFold(p[i:i+3], "%2f") || strings.EqualFold(p[i:i+3], "%5c")) {
				b.WriteByte('/')
				i += 2
				continue
			}
			b.WriteByte(p[i])
		}
		want := false
		for _, seg := range strings.Split(b.String(), "/") {
			seg, _, _ = strings.Cut(seg, ";")
			var d strings.Builder
			for i := 0; i < len(seg); i++ {
				if i+2 < len(seg) && strings.EqualFold(seg[i:i+3], "%2e") {
					d.WriteByte('.')
					i += 2
					continue
				}
				d.WriteByte(seg[i])
			}
			if d.String() == "." || d.String() == ".." {
				want = true
			}
		}
		if got := HasDotSegment(raw); got != want {
			t.Fatalf("%q: %v, want %v", raw, got, want)
		}
	})
}
