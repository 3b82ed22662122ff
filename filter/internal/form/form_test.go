package form

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	gomime "mime"
	mime "mime/multipart"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tollgate-rl/tollgate/shared/paths"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// scan feeds body to a scanner of contentType in chunks of n bytes (all
// at once when n is 0).
func scan(t *testing.T, contentType, body string, n int) Overrides {
	t.Helper()
	s := New(contentType)
	if s == nil {
		t.Fatalf("no scanner for %q", contentType)
	}
	for n > 0 && len(body) > n {
		s.Feed([]byte(body[:n]))
		body = body[n:]
	}
	s.Feed([]byte(body))
	return s.End()
}

// Every split of the body reads the same: the scanner keeps what it
// needs between chunks.
func TestURLEncoded(t *testing.T) {
	for _, c := range []struct {
		body string
		want Overrides
	}{
		{"", Overrides{}},
		{"a=1&b=2", Overrides{}},
		{"_method=DELETE", Overrides{First: "DELETE", Count: 1}},
		{"authenticity_token=x%2B%3D&_method=patch&user%5Bname%5D=a", Overrides{First: "patch", Count: 1}},
		{"a=1;%5Fmethod=put", Overrides{First: "put", Count: 1}},
		{"%5f%6D%65%74%68%6f%64=PATCH", Overrides{First: "PATCH", Count: 1}},
		{".method=DELETE", Overrides{First: "DELETE", Count: 1}},
		{"+method=DELETE", Overrides{}},
		{"+++++++++++++++_method=DELETE", Overrides{First: "DELETE", Count: 1}},
		{"_method%00x=DELETE", Overrides{First: "DELETE", Count: 1}},
		{"_METHOD=DEL%45TE", Overrides{First: "DELETE", Count: 1}},
		{"_method=GET&_method=get", Overrides{First: "GET", Count: 2}},
		{"_method=GET&_method=DELETE", Overrides{First: "GET", Count: 2, Conflict: true}},
		{"_method", Overrides{First: "", Count: 1}},
		{"_method=%", Overrides{First: "%", Count: 1}},
		{"_method=%4", Overrides{First: "%4", Count: 1}},
		{"_method=" + strings.Repeat("A", 40), Overrides{First: strings.Repeat("A", maxValue+1), Count: 1}},
		{"x_method=DELETE&_methods=DELETE&method=DELETE&a=_method=DELETE", Overrides{}},
		{"[_method]=DELETE", Overrides{First: "DELETE", Count: 1}}, // Rack 2 strips the brackets
		{"]]_method=DELETE&_method]=DELETE", Overrides{First: "DELETE", Count: 2}},
		{"[method=PUT", Overrides{First: "PUT", Count: 1}}, // PHP reads a first '[' as '_'
		{"_method[x]=PUT", Overrides{First: "PUT", Count: 1}},
		// qs with allowDots (Koa's co-body) reads these as _method (arrays).
		{"_method.0=DELETE", Overrides{First: "DELETE", Count: 1}},
		{"._method=DELETE&%2E_method%5B%5D=DELETE", Overrides{First: "DELETE", Count: 2}},
		{"_method%2E0=DELETE&a.b=1", Overrides{First: "DELETE", Count: 1}},
		{"_me.thod=DELETE&_methodx.0=DELETE", Overrides{}},
	} {
		for n := 0; n <= len(c.body); n++ {
			if got := scan(t, "application/x-www-form-urlencoded; charset=UTF-8", c.body, n); got != c.want {
				t.Fatalf("%q in chunks of %d: %+v, want %+v", c.body, n, got, c.want)
			}
		}
	}
}

const rails = "--XyZ\r\n" +
	"Content-Disposition: form-data; name=\"authenticity_token\"\r\n\r\n" +
	"tok--XyZ\r\n" +
	"--XyZ\r\n" +
	"Content-Disposition: form-data; name=\"_method\"\r\n\r\n" +
	"patch\r\n" +
	"--XyZ\r\n" +
	"Content-Disposition: form-data; name=\"user[avatar]\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n" +
	"\x89PNG\r\n\r\n--XyZ-\r\n--Xy\r\n" +
	"--XyZ--\r\n" +
	"Content-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n"

func TestMultipart(t *testing.T) {
	for _, c := range []struct {
		contentType, body string
		want              Overrides
	}{
		{"multipart/form-data; boundary=XyZ", rails, Overrides{First: "patch", Count: 1}},
		{`multipart/form-data; charset=utf-8; boundary="XyZ"`, rails, Overrides{First: "patch", Count: 1}},
		{"multipart/form-data; boundary=b", "preamble\r\n--b\r\ncontent-disposition: form-data;name=\".METHOD\"\r\n\r\nput\r\n--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nPUT\r\n--b--", Overrides{First: "put", Count: 2}},
		{"multipart/form-data; boundary=b", "--b\nContent-Disposition: form-data; name=\"_method\"\n\nDELETE\n--b--\n", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"_me\\thod\"\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=_method\r\n\r\nDELETE\r\n--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nPUT\r\n--b--", Overrides{First: "DELETE", Count: 2, Conflict: true}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE", Overrides{First: "DELETE", Count: 1}}, // cut off
		{"multipart/form-data; boundary=b", "--b\r\nX: " + strings.Repeat("y", maxPartHeaders) + "\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nv\r\n--b--", Overrides{First: "(headers too long", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"x_method\"\r\n\r\nDELETE\r\n--b--", Overrides{}},
		{`multipart/form-data; boundary="a;b"`, "--a;b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--a;b--", Overrides{First: "DELETE", Count: 2}}, // read with "a;b" and with "a"
		// Readings of other frameworks (an outsider's attack had each go
		// through as a POST): a comma ending the media type, a boundary
		// past 70 characters, cut at ',', found in "xboundary=", a part
		// named by Content-ID, a second name=, a folded header, a
		// delimiter after spaces, Rack 2's brackets.
		{"multipart/form-data, boundary=b", "--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=" + strings.Repeat("b", 80), "--" + strings.Repeat("b", 80) + "\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--" + strings.Repeat("b", 80) + "--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=XyZ,q", "--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; xboundary=XyZ", "--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-ID: <_method>\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"x\"; name=\"_method\"\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data;\r\n\tname=\"_method\"\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "  --b  \r\nContent-Disposition: form-data; name=\"[_method]\"\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		// Rack reads a part's headers on to "\r\n\r\n" past a "\n\n".
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data\n\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\nContent-Disposition: form-data; name=\"_method\"\n\nput\n--b--", Overrides{First: "put", Count: 1}},
		{"multipart/mixed; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nput\r\n--b--", Overrides{First: "put", Count: 1}},
		// Django's readings (an outsider's DELETEs ran 20 of 20 with each):
		// a base64 value, RFC 2231's name*, a name's trailing space, a
		// name= inside another's quoted value with an escaped quote.
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"_method\"\r\nContent-Transfer-Encoding: base64\r\n\r\nREVMRVRF\r\n--b--", Overrides{First: transferEncoded[:maxValue+1], Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"_method\"\r\nContent-Transfer-Encoding: 8bit\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name*=UTF-8''%5Fmethod\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"_method \"\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"x\\\"; name=_method; y=\"\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"_method\"\r\n\r\nDELETE\r\n--b--", Overrides{}},
		// A fifth round's (Django, Rack, PHP): a line going on without a
		// leading space, a name or Content-ID inside another header's
		// value (Rack's unanchored patterns), a name*= in a charset the
		// filter does not decode, Unicode white space around a name, PHP's
		// single quotes.
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data\r\n; name=\"_method\"\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nX-Y: aContent-Disposition:;name=_method\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nX-Y: aContent-ID: _method\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name*=utf-16le''%5F%00m%00\r\n\r\nDELETE\r\n--b--", Overrides{First: transferEncoded[:maxValue+1], Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name*=\"x y''_method\"\r\n\r\nDELETE\r\n--b--", Overrides{First: transferEncoded[:maxValue+1], Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"\xc2\xa0_method\xe3\x80\x80\"\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name='_method'\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		// A sixth round's (Rack, PHP): a token name Rack cuts at a special
		// character, a Content-ID on the next line, PHP joining a line
		// without a colon to the one before.
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=_method/\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=_method?x\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-ID:\r\n_method\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; na\r\nme=\"_me\r\nthod\"\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"a\"\n\n" + strings.Repeat("x", 9000) + "\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--b--", Overrides{First: "(headers too long", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"_met\x00X\r\nhod\"\r\n\r\nDELETE\r\n--b--", Overrides{First: transferEncoded[:maxValue+1], Count: 1}},
		// An eighth round's: a quoted name padded past 1 KiB (PHP strips
		// the spaces, Rack the brackets).
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"" + strings.Repeat(" ", 1100) + "_method\"\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name='" + strings.Repeat("[", 1100) + "_method'\r\n\r\nDELETE\r\n--b--", Overrides{First: "DELETE", Count: 1}},
		// name=name=... (8 KB of part headers) was read quadratically (14 s
		// of a VM a MiB): past maxSearchKeys keys the part is refused.
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; " + strings.Repeat("name=", 1600) + "\r\n\r\nv\r\n--b--", Overrides{First: transferEncoded[:maxValue+1], Count: 1}},
	} {
		for n := 0; n <= len(c.body) && n < 200; n++ {
			if got := scan(t, c.contentType, c.body, n); got != c.want {
				t.Fatalf("%q in chunks of %d: %+v, want %+v", c.body, n, got, c.want)
			}
		}
	}
}

// A body is read once per distinct reading of its Content-Type headers,
// and one with more boundaries than any framework reads is refused
// unread: an outsider's four headers of four boundaries each made sixteen
// scanners, each reading every byte.
func TestNewReadings(t *testing.T) {
	if _, ok := New("multipart/form-data; boundary=b", "multipart/form-data; boundary=b", "multipart/mixed; boundary=b").(*multipart); !ok {
		t.Error("one boundary in three headers is not read once")
	}
	if _, ok := New("application/x-www-form-urlencoded", "application/x-www-form-urlencoded").(*urlencoded); !ok {
		t.Error("one form type in two headers is not read once")
	}
	if m, ok := New("multipart/form-data; boundary=a; xboundary=b", "multipart/form-data; boundary=c; yboundary=d").(multi); !ok || len(m) != 4 {
		t.Errorf("four boundaries: %T %v, want four scanners", m, m)
	}
	for _, cts := range [][]string{
		{"multipart/form-data; boundary=b; aboundary=-b; cboundary=--b; dboundary=---b; eboundary=----b"},
		{"multipart/form-data; boundary=a; xboundary=b", "multipart/form-data; boundary=c; yboundary=d", "multipart/form-data; boundary=e"},
	} {
		s := New(cts...)
		s.Feed([]byte("--a\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--a--"))
		if o := s.End(); o.Count != 1 || rules.ValidMethod(strings.ToUpper(o.First)) {
			t.Errorf("%q: %+v, want an override that names no method (refused)", cts, o)
		}
	}
}

// A body whose parts name themselves over and over is refused once they
// have done so maxBodyKeys times, and read no further (an outsider's 1 MiB
// of such part headers took 16 s of a VM); a form of many fields, each
// named once, is read whole.
func TestMultipartKeysBudget(t *testing.T) {
	var b strings.Builder
	for i := range 400 {
		fmt.Fprintf(&b, "--b\r\nContent-Disposition: form-data; name=\"f%d\"\r\n\r\nv\r\n", i)
	}
	b.WriteString("--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nPUT\r\n--b--")
	if o := scan(t, "multipart/form-data; boundary=b", b.String(), 0); o != (Overrides{First: "PUT", Count: 1}) {
		t.Errorf("401 fields: %+v, want the last one's PUT", o)
	}
	// Files whose Content-Type names them too, as some clients send them,
	// and whose file names hold "name=".
	b.Reset()
	for i := range 300 {
		fmt.Fprintf(&b, "--b\r\nContent-Disposition: form-data; name=\"f%d\"; filename=\"name=1 name=2.txt\"\r\nContent-Type: text/plain; name=\"name=1 name=2.txt\"\r\n\r\nv\r\n", i)
	}
	b.WriteString("--b--")
	if o := scan(t, "multipart/form-data; boundary=b", b.String(), 0); o.Count != 0 {
		t.Errorf("300 files named twice, with name= in their file names: %+v, want no override", o)
	}
	b.Reset()
	for range 200 {
		b.WriteString("--b\r\nContent-Disposition: form-data; " + strings.Repeat("name=a; ", 12) + "\r\n\r\nv\r\n")
	}
	b.WriteString("--b--")
	if o := scan(t, "multipart/form-data; boundary=b", b.String(), 0); o.Count == 0 || rules.ValidMethod(strings.ToUpper(o.First)) {
		t.Errorf("200 parts of twelve names each: %+v, want an override that names no method (refused)", o)
	}
}

// Reading part headers makes no garbage: the filter's collector runs
// between callbacks, and one request's body is many parts.
func TestMultipartPartHeadersAllocateNothing(t *testing.T) {
	part := "--b\r\nContent-Disposition: form-data; name=\"field\"\r\nContent-Type: text/plain\r\n" + strings.Repeat("a\n", 2000) + "\r\n\r\nvalue\r\n"
	chunk := []byte(strings.Repeat(part, 8))
	s := New("multipart/form-data; boundary=b")
	s.Feed(chunk) // buffers grow to their size once
	if n := testing.AllocsPerRun(20, func() { s.Feed(chunk) }); n != 0 {
		t.Errorf("%v allocations per %d bytes of parts", n, len(chunk))
	}
	if o := s.End(); o.Count != 0 {
		t.Errorf("%+v", o)
	}
}

// A JSON reading is added beside any other the header gives (an outsider's
// "multipart/form-data; boundary=a+json" carried a JSON _method past the
// multipart reading alone).
func TestNewJSONBesideOthers(t *testing.T) {
	for _, ct := range []string{"text/plain; x=/json", "multipart/form-data; boundary=a+json", "application/x-www-form-urlencoded; p=/json"} {
		s := New(ct)
		s.Feed([]byte(`{"_method":"DELETE"}`))
		if o := s.End(); o.Count == 0 || !strings.EqualFold(o.First, "DELETE") {
			t.Errorf("%q: %+v, want the JSON body's DELETE", ct, o)
		}
	}
}

func TestNew(t *testing.T) {
	for ct, want := range map[string]bool{"application/x-www-form-urlencoded": true, "Application/X-WWW-Form-Urlencoded ;charset=x": true,
		"multipart/form-data; boundary=a": true, "multipart/form-data": false, "multipart/form-data; boundary=" + strings.Repeat("a", 71): true,
		"application/json": true, "text/plain": false, "": true, // Rack reads a POST without one as a form
		"multipart/mixed; boundary=b": true, "multipart/related; boundary=\"a;b\"": true, "multipart/alternative; boundary=b": true, "application/x-www-form-urlencoded,x": true,
		// Laravel's isJson looks for "/json" or "+json" in the whole header.
		"text/plain; x=/json": true, "text/plain;/json": true, "text/html; charset=a+json": true,
		// koa-bodyparser reads it as JSON by default.
		"application/csp-report": true} {
		if got := New(ct) != nil; got != want {
			t.Errorf("New(%q): %v, want %v", ct, got, want)
		}
	}
	// More boundary= than paramSearch reads (each read to the header's end
	// made it quadratic: 0.44 s a request for 58 KB): refused unread.
	if _, ok := New("multipart/form-data; " + strings.Repeat("boundary=", 6000)).(unreadable); !ok {
		t.Error("a Content-Type of 6,000 boundary= is read")
	}
	if !OtherCharset("application/json; " + strings.Repeat("charset=utf-8;", 17)) {
		t.Error("17 charset= are taken for UTF-8")
	}
}

// An urlencoded body reads as paths.EachMethodParam reads a query, in any
// chunks.
func FuzzURLEncoded(f *testing.F) {
	f.Add("a=1;%5Fmethod=put&_method=%4", uint8(3))
	f.Add("+++_method%00=X&&_method=y", uint8(1))
	f.Fuzz(func(t *testing.T, body string, n uint8) {
		var want Overrides
		paths.EachMethodParam("?"+body, func(v string) bool { want.add(v[:min(len(v), maxValue+1)]); return true })
		// Every override PHP's reading finds is found (Rack 2's brackets
		// may find more): counted, or a conflict.
		got := scan(t, "application/x-www-form-urlencoded", body, int(n))
		if want.Count > 0 && (got.Count < want.Count || want.Conflict && !got.Conflict || !got.Conflict && !strings.EqualFold(got.First, want.First)) {
			t.Fatalf("%q in chunks of %d: %+v, want %+v", body, n, got, want)
		}
	})
}

// Whatever Go's multipart reader finds in a body, the scanner finds too:
// every _method field (it may find more: counting more is safe), in any
// chunks.
func FuzzMultipart(f *testing.F) {
	f.Add([]byte(rails), uint8(7))
	f.Add([]byte("--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--\r\n"), uint8(1))
	f.Fuzz(func(t *testing.T, body []byte, n uint8) {
		got := scan(t, "multipart/form-data; boundary=XyZ", string(body), int(n))
		r := mime.NewReader(bytes.NewReader(body), "XyZ")
		for {
			p, err := r.NextRawPart()
			if err != nil {
				return
			}
			var nm nameMatch
			nm.reset()
			name := p.FormName()
			for i := 0; i < len(name); i++ {
				nm.add(name[i])
			}
			v, err := io.ReadAll(io.LimitReader(p, maxValue+1))
			if err != nil {
				return
			}
			if !nm.matches() {
				continue
			}
			// A value that is a method is read as Go reads it; any other
			// is refused whatever the scanner kept of it.
			method := rules.ValidMethod(strings.ToUpper(string(v)))
			if got.Count == 0 || method && !got.Conflict && !strings.EqualFold(got.First, string(v)) {
				t.Fatalf("%q in chunks of %d: Go reads _method=%q, the scanner %+v", body, n, v, got)
			}
		}
	})
}

// BenchmarkScan is what reading a form body costs per byte: a 1 MiB
// multipart upload (a file part) and a 64 KiB urlencoded form, in 16 KiB
// chunks as Envoy hands them over.
func BenchmarkScan(b *testing.B) {
	file := bytes.Repeat([]byte("0123456789abcdef\r\n-"), (1<<20)/19)
	upload := "--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nPATCH\r\n--XyZ\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a\"\r\n\r\n" + string(file) + "\r\n--XyZ--\r\n"
	form := strings.Repeat("field=value+with%20escapes&", (64<<10)/27) + "_method=DELETE"
	doc := `{"items":[` + strings.Repeat(`{"id":12345,"name":"a \"quoted\" name","tags":["x","y"]},`, (64<<10)/56) + `{}],"_method":"PATCH"}`
	benchScan(b, []scanCase{
		{"multipart-1MiB", "multipart/form-data; boundary=XyZ", upload},
		{"urlencoded-64KiB", "application/x-www-form-urlencoded", form},
		{"json-64KiB", "application/json", doc},
	})
}

type scanCase struct{ name, contentType, body string }

// benchScan feeds each case's body in 16 KiB chunks, as Envoy hands them
// over; each holds one override.
func benchScan(b *testing.B, cases []scanCase) {
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				s := New(c.contentType)
				for body := c.body; body != ""; {
					n := min(len(body), 16<<10)
					s.Feed([]byte(body[:n]))
					body = body[n:]
				}
				if o := s.End(); o.Count != 1 {
					b.Fatalf("%+v", o)
				}
			}
		})
	}
}

// A JSON body's top-level "_method" string is an override (Laravel reads
// JSON fields as its form); nothing deeper, nothing else.
func TestJSON(t *testing.T) {
	for _, c := range []struct {
		body string
		want Overrides
	}{
		{`{"_method":"DELETE"}`, Overrides{First: "DELETE", Count: 1}},
		{` { "a" : {"_method":"PUT", "b":["_method", "}"]}, "\u005fmethod" : "del\u0065te" } `, Overrides{First: "delete", Count: 1}},
		{`{"x":"\"_method\":\"PUT\"","_method":"PATCH","y":1}`, Overrides{First: "PATCH", Count: 1}},
		{`{"_method":1,"_method":null,"_method":true}`, Overrides{}},
		// An array or an object is no method to count, but method-override
		// (Express) takes an array's first element: refused (no method).
		{`{"_method":["DELETE"]}`, Overrides{First: containerValue, Count: 1}},
		{`{"_method" : {"a":"DELETE"}, "b":1}`, Overrides{First: containerValue, Count: 1}},
		{`{"_method":"PUT","_method":["PUT"]}`, Overrides{First: "PUT", Count: 2, Conflict: true}},
		{`{"a":["_method"],"b":{"_method":["DELETE"]},"_method":"PATCH"}`, Overrides{First: "PATCH", Count: 1}},
		// body-parser strips a UTF-8 byte order mark before JSON.parse.
		{"\xEF\xBB\xBF{\"_method\":\"DELETE\"}", Overrides{First: "DELETE", Count: 1}},
		{"\xEF\xBB\xBF [{\"_method\":\"DELETE\"}]", Overrides{}},
		{`{"_method":"PUT","_method":"DELETE"}`, Overrides{First: "PUT", Count: 2, Conflict: true}},
		{`[{"_method":"DELETE"}]`, Overrides{}},
		{`{"_METHOD":"DELETE","_methods":"DELETE"," _method":"DELETE"}`, Overrides{}},
		{`{"_method":"` + strings.Repeat("A", 40) + `"}`, Overrides{First: strings.Repeat("A", maxValue+1), Count: 1}},
	} {
		for n := 0; n <= len(c.body); n++ {
			if got := scan(t, "application/vnd.api+json", c.body, n); got != c.want {
				t.Fatalf("%s in chunks of %d: %+v, want %+v", c.body, n, got, c.want)
			}
		}
	}
}

// A charset a decoder may read as other than ASCII, in any spelling of
// the parameter, is told apart from UTF-8 and the one-byte sets.
func TestOtherCharset(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json":                                 false,
		"application/json; charset=utf-8":                  false,
		"application/json;charset=UTF8":                    false,
		"application/json; charset=iso-8859-1":             false,
		"application/json; charset=\"Windows-1252\"":       false,
		"application/json; charset=US-ASCII":               false,
		"application/json; charset=utf-16":                 true,
		"application/json;CHARSET=\"UTF-16LE\"":            true,
		"application/json; x=1; charset=utf-32":            true,
		"application/x-www-form-urlencoded; charset=utf-7": true,
		"text/plain; x=/json; charset = utf-16be":          true,
		"application/json; charset=ucs2":                   true,
		"application/json; charset=unicode-1-1-utf-7":      true,
		"application/json; charset=iso-8859-":              true,
		"application/json; charset=iso-8859-1x":            true,
		"application/json; charset=":                       true,
		"application/json; charset=cp037":                  true, // EBCDIC
		"application/json; charset=utf-8; charset=utf-16":  true, // Node's content-type takes the last
		"application/json; a=b charset=utf-16":             true,
		"application/json; a=\"charset=utf-16\"":           true, // counting more
		"application/json; charset=\"utf\\-16\"":           true,
		"application/json; charset\f=utf-16":               true,
		"application/json; charset=utf-8, text/plain":      false,
	} {
		if got := OtherCharset("text/plain", ct); got != want {
			t.Errorf("%q: %v, want %v", ct, got, want)
		}
	}
}

// Every charset a standard parser of the header finds (Go's, as strict as
// Node's content-type) is one OtherCharset reads: none slips past it.
func FuzzOtherCharset(f *testing.F) {
	f.Add("application/json; charset=utf-16")
	f.Add(`application/json; a="x;charset=utf-8"; charset="UTF-7"`)
	f.Fuzz(func(t *testing.T, ct string) {
		_, params, err := gomime.ParseMediaType(ct)
		if err != nil {
			return
		}
		if cs, ok := params["charset"]; ok && !asciiCharset(strings.ToLower(strings.TrimSpace(cs))) && !OtherCharset(ct) {
			t.Fatalf("%q: a parser reads charset %q, OtherCharset does not refuse it", ct, cs)
		}
	})
}

// A JSON body's override is found wherever encoding/json (which, like
// PHP, takes a repeated key's last value) reads a top-level "_method"
// string, in any chunks.
func FuzzJSON(f *testing.F) {
	f.Add(`{"a":{"_method":"PUT"},"_method":"del\u0065te"}`, uint8(3))
	f.Add(`{"_method":"\ud83d\ude00","_method":"GET"}`, uint8(1))
	f.Fuzz(func(t *testing.T, body string, n uint8) {
		got := scan(t, "application/json", body, int(n))
		var doc map[string]json.RawMessage
		if json.Unmarshal([]byte(body), &doc) != nil {
			return
		}
		if raw := bytes.TrimSpace(doc["_method"]); len(raw) > 0 && (raw[0] == '[' || raw[0] == '{') {
			// An array or an object: refused, never counted as a method.
			if got.Count == 0 || !got.Conflict && rules.ValidMethod(strings.ToUpper(got.First)) {
				t.Fatalf("%q in chunks of %d: _method is %s, the scanner %+v", body, n, raw, got)
			}
			return
		}
		var v string
		if json.Unmarshal(doc["_method"], &v) != nil {
			return // absent, or no string
		}
		// A value with bytes beyond ASCII is no method either way, however
		// each decodes its invalid UTF-8.
		ascii := true
		for i := 0; i < len(v); i++ {
			ascii = ascii && v[i] < utf8.RuneSelf
		}
		if got.Count == 0 || !got.Conflict && ascii && !strings.EqualFold(got.First, v[:min(len(v), maxValue+1)]) {
			t.Fatalf("%q in chunks of %d: encoding/json reads _method=%q, the scanner %+v", body, n, v, got)
		}
	})
}

// BenchmarkScanCrafted is a body built against the skipping: a file part
// of dashes and line ends, and a form of separators.
func BenchmarkScanCrafted(b *testing.B) {
	dashes := strings.Repeat("-\n-\r\n--X", (1<<20)/8)
	upload := "--XyZ\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a\"\r\n\r\n" + dashes + "\r\n--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nPATCH\r\n--XyZ--\r\n"
	amps := strings.Repeat("&", 1<<20) + "_method=PATCH"
	// Parts that are all headers (an outsider's attack): each 8 KiB of
	// one-byte lines, read for its name.
	headers := strings.Repeat("--XyZ\n"+strings.Repeat("a\n", 4000)+"\n", (1<<20)/8008) + "--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nPATCH\r\n--XyZ--\r\n"
	benchScan(b, []scanCase{
		{"multipart-dashes-1MiB", "multipart/form-data; boundary=XyZ", upload},
		{"multipart-part-headers-1MiB", "multipart/form-data; boundary=XyZ", headers},
		{"urlencoded-ampersands-1MiB", "application/x-www-form-urlencoded", amps},
	})
}
