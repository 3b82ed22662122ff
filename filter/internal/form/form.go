// Package form finds method overrides in a request body as it streams: a
// _method field of an application/x-www-form-urlencoded or a
// multipart/form-data body, which Rails (Rack::MethodOverride), Laravel
// and Symfony read to route a POST as the method it names, or a top-level
// "_method" of a JSON body, which Laravel reads as a form field. The filter
// lets each chunk go but the last, so it reads the body in pieces: the
// scanner keeps what it needs between them, in bounded memory, whatever
// the body's size.
package form

import (
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

// maxValue bounds what is kept of an override's value: longer than any
// method, so a longer value reads as no method (maxValue+1 bytes kept).
const maxValue = 16

// Overrides is what a body said of its method.
type Overrides struct {
	// First is the first override's value (decoded, as sent; at most
	// maxValue+1 bytes), Count how many there were, and Conflict whether
	// two named different methods (compared without case).
	First    string
	Count    int
	Conflict bool
}

func (o *Overrides) add(v string) {
	switch {
	case o.Count == 0:
		o.First = v
	case !strings.EqualFold(v, o.First):
		o.Conflict = true
	}
	o.Count++
}

// Scanner reads one body.
type Scanner interface {
	// Feed reads the next chunk.
	Feed(chunk []byte)
	// End reads the end of the body and says what it held.
	End() Overrides
}

// New returns the scanner of a POST body with the Content-Type headers
// contentTypes (none: the request has none), or nil when no framework reads
// a method override from such a body. The readings of the frameworks that
// read one are all taken, a body read for every type and boundary any of
// them would see (counting an override one of them ignores is counting
// more, never less): Rack reads a POST without a content type as a form,
// parses every multipart type, cuts a media type at ';' or ',' (PHP at a
// space too), and both find a boundary wherever "boundary=" appears,
// cutting it at '"', ';' or ','; Laravel reads a JSON body's fields.
func New(contentTypes ...string) Scanner {
	if len(contentTypes) == 0 {
		return &urlencoded{}
	}
	// One scanner per reading: the same type or boundary in two headers
	// is read once, and a body with more boundaries than any framework
	// reads (maxBoundaries) is not read at all, but refused: every
	// scanner reads every byte.
	var all multi
	var form, json bool
	var seen []string
	for _, ct := range contentTypes {
		media := mediaType(ct)
		switch {
		case media == "" || media == "application/x-www-form-urlencoded":
			if !form {
				form = true
				all = append(all, &urlencoded{})
			}
		case strings.HasPrefix(media, "multipart/"):
			for _, b := range boundaries(ct) {
				if slices.Contains(seen, b) {
					continue
				}
				if seen = append(seen, b); len(seen) > maxBoundaries {
					return unreadable{}
				}
				all = append(all, newMultipart(b))
			}
		}
		// Laravel reads a JSON body wherever "/json" or "+json" appears in
		// the header, parameters included ("text/plain; x=/json",
		// "multipart/form-data; boundary=a+json"): beside any other reading.
		if !json && isJSON(ct) {
			json = true
			all = append(all, &jsonBody{})
		}
	}
	switch len(all) {
	case 0:
		return nil
	case 1:
		return all[0]
	}
	return all
}

// unreadable is the scanner of a body read too many ways: it reads
// nothing and reports an override that names no method (the filter
// refuses the request, as it does a part whose headers are too long).
type unreadable struct{}

func (unreadable) Feed([]byte) {}

func (unreadable) End() Overrides {
	return Overrides{First: "(too many boundaries)"[:maxValue+1], Count: 1}
}

// mediaType is a content type's media type, lower-cased: up to the first
// ';', ',' or white space.
func mediaType(ct string) string {
	ct = strings.TrimLeft(ct, " \t")
	if i := strings.IndexAny(ct, ";, \t"); i >= 0 {
		ct = ct[:i]
	}
	return strings.ToLower(ct)
}

// maxBoundary bounds a boundary (RFC 2046 says 70; no parser enforces it)
// and maxBoundaries the readings of a request's content types (the
// boundary parameter, Rack's and PHP's searches: three tell apart).
const (
	maxBoundary   = 1024
	maxBoundaries = 4
)

// boundaries are a multipart content type's boundaries as the frameworks
// read them: its boundary parameter, and at every "boundary" in it (as
// Rack's and PHP's searches find one, "xboundary=" too) the value after
// '=', cut at '"', ';', ',' or white space.
func boundaries(ct string) []string {
	var out []string
	add := func(b string) {
		for _, o := range out {
			if o == b {
				return
			}
		}
		if len(b) >= 1 && len(b) <= maxBoundary && len(out) <= maxBoundaries {
			out = append(out, b) // one past the most read: New refuses such a body
		}
	}
	ps := paramSearch{v: ct, key: "boundary"}
	for {
		v, quoted, _, ok := ps.next()
		if !ok {
			break
		}
		add(v)
		if quoted.set {
			add(quoted.String())
		}
	}
	if ps.tooMany {
		for i := len(out); i <= maxBoundaries; i++ {
			out = append(out, "\x00"+strconv.Itoa(i)) // past the most read: New refuses the body
		}
	}
	return out
}

// multi reads a body with several scanners, one per reading of it.
type multi []Scanner

func (m multi) Feed(chunk []byte) {
	for _, s := range m {
		s.Feed(chunk)
	}
}

func (m multi) End() Overrides {
	var o Overrides
	for _, s := range m {
		if r := s.End(); r.Count > 0 {
			o.add(r.First)
			o.Count += r.Count - 1
			o.Conflict = o.Conflict || r.Conflict
		}
	}
	return o
}

// OtherCharset reports whether a Content-Type header among contentTypes
// names a charset whose bytes a decoder may read other than as ASCII:
// anything but UTF-8, US-ASCII, ISO-8859-1 and Windows-1252. Express's
// body-parser decodes a body from any "utf-" charset before it parses it
// (a _method in UTF-16 or UTF-7), other parsers from any charset iconv
// knows, and the scanners here read bytes as they come.
// The filter refuses such a body rather than count it as its own method.
//
// Every "charset=" in a header is read, as boundaries are (a parser that
// takes a repeated parameter's last value, or finds one by searching, reads
// one a parameter-wise reading passes over): one that is no such set,
// escapes and empty values included, is refused.
func OtherCharset(contentTypes ...string) bool {
	for _, ct := range contentTypes {
		ps := paramSearch{v: ct, key: "charset"}
		for {
			v, quoted, _, ok := ps.next()
			if !ok {
				break
			}
			if !asciiCharset(strings.ToLower(v)) || quoted.set && !asciiCharset(strings.ToLower(quoted.String())) {
				return true
			}
		}
		if ps.tooMany {
			return true
		}
	}
	return false
}

// paramSearch finds every key= in v (key compared without case; with
// word, only where no letter or digit comes before it), as a parser that
// searches for a parameter finds it: past white space and '=', an opening
// quote dropped, cut at a quote, ';', ',' or white space; ext says a '*'
// followed the key (RFC 2231's extended value). Past maxSearchKeys keys
// in one value it stops and sets tooMany: each key's value is read on to
// its end, and "name=name=..." made that quadratic (an outsider's 1 MiB
// body of such part headers took 14 s of a VM).
type paramSearch struct {
	v, key  string
	word    bool
	n       int
	tooMany bool
}

// maxSearchKeys bounds the keys paramSearch reads in one value: more than
// any parser's reading needs (maxBoundaries is 4).
const maxSearchKeys = 16

// next is the next value found, and when it was quoted the whole quoted
// string too (a parser of parameters reads a quoted ';' or ',' as part of
// it; PHP takes single quotes too, unescaped); ok is false past the last.
func (ps *paramSearch) next() (val string, quoted unquoted, ext, ok bool) {
	for i := 0; i+len(ps.key) <= len(ps.v); i++ {
		if !wire.EqualFoldASCII(ps.v[i:i+len(ps.key)], ps.key) {
			continue
		}
		c := byte(' ')
		if i > 0 {
			c = ps.v[i-1] | 0x20
		}
		rest := ps.v[i+len(ps.key):]
		if ps.word && ('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			continue // filename= for name=
		}
		ext = strings.HasPrefix(rest, "*")
		val, found := strings.CutPrefix(strings.TrimLeft(strings.TrimPrefix(rest, "*"), space), "=")
		if !found {
			continue
		}
		if ps.n++; ps.n > maxSearchKeys {
			ps.tooMany = true
			return "", unquoted{}, false, false
		}
		ps.v = rest
		// An unquoted value is read to 1 KiB at most (a boundary is 1,024
		// bytes at most, a name that matches far less); a quoted one to
		// its closing quote or its line's end, however far (PHP strips
		// the spaces and Rack the brackets a name is padded with: an
		// outsider's 1,100 of them hid _method past a 1 KiB cut).
		val = strings.TrimLeft(val, space)
		if len(val) > 0 && (val[0] == '"' || val[0] == '\'') {
			// To the closing quote; in double quotes a backslash escapes
			// the byte after it.
			q, j := val[1:], 0
			for ; j < len(q) && q[j] != val[0] && q[j] != '\n'; j++ {
				if q[j] == '\\' && val[0] == '"' {
					j++
				}
			}
			quoted = unquoted{raw: q[:min(j, len(q))], quoted: val[0] == '"', set: true}
		}
		val = val[:min(len(val), maxBoundary+2)]
		val = strings.TrimLeft(val, `"`)
		if k := strings.IndexAny(val, space+`";,`); k >= 0 {
			val = val[:k]
		}
		return val, quoted, ext, true
	}
	return "", unquoted{}, false, false
}

// space is every byte a header parser may take for white space.
const space = " \t\r\n\f\v"

// asciiCharset reports whether a lower-case charset name is one whose
// ASCII bytes every decoder reads as ASCII, and one a client may name: the
// others (ISO-8859-2 and the like) are refused too, which costs no client
// that sends UTF-8.
func asciiCharset(cs string) bool {
	switch cs {
	case "utf-8", "utf8", "us-ascii", "ascii", "iso-8859-1", "latin1", "windows-1252":
		return true
	}
	return false
}

// isJSON reports whether a Content-Type header is JSON as Laravel's isJson
// reads it: one containing "/json" or "+json" anywhere (compared without
// case: counting more, never less), or as koa-bodyparser reads it by
// default, application/csp-report too.
func isJSON(ct string) bool {
	m := strings.ToLower(ct)
	return strings.Contains(m, "/json") || strings.Contains(m, "+json") || strings.Contains(m, "csp-report")
}

// A name is matched as the frameworks read it, one decoded byte at a time:
// PHP drops its leading spaces, cuts it at a NUL and reads a first ' ', '.'
// or '[' as '_'; Rack 2 strips the brackets around it ("[_method]",
// "]]_method"); qs with allowDots (Koa's co-body) reads "_method.0" as an
// array of _method and "._method" as _method; the core left (a leading
// '.' set aside), compared without case, is "_method", ".method" or,
// after a dropped '[' or '.', "method".
type nameMatch struct {
	buf     [8]byte
	n       int
	lead    bool // still in the leading spaces and brackets
	bracket bool // a '[' was among them
	dot     bool // the core began with a '.', kept out of buf
	cut     bool // a NUL, or a bracket after the core, ended it
	long    bool // more than seven characters in its core
}

func (m *nameMatch) reset() { *m = nameMatch{lead: true} }

func (m *nameMatch) add(c byte) {
	switch {
	case m.cut || m.long:
	case m.lead && (c <= ' ' || c >= 0x80 || c == '[' || c == ']'):
		// White space, controls and bytes past ASCII (Django strips
		// U+00A0 and U+3000 too) before the name.
		m.bracket = m.bracket || c == '['
	case c == '.' && m.n == 0 && !m.dot:
		// ".method" is _method to PHP, "._method" to qs with allowDots.
		m.lead, m.dot = false, true
	case c == 0 || c == '[' || c == ']' || (c == '.' || c <= ' ' || c >= 0x80) && m.n > 0:
		// A trailing space (or control, or byte past ASCII) ends it too:
		// Django strips a multipart name.
		m.cut = true
	case m.n == len(m.buf)-1:
		m.long = true
	default:
		m.lead = false
		m.buf[m.n] = c
		m.n++
	}
}

// matches reports whether the decoded name is one of _method's spellings.
func (m *nameMatch) matches() bool {
	core := string(m.buf[:m.n])
	switch {
	case m.long:
		return false
	case len(core) == 7 && (core[0] == '_' || core[0] == '.'):
		return strings.EqualFold(core[1:], "method")
	case len(core) == 6 && (m.bracket || m.dot):
		return strings.EqualFold(core, "method")
	}
	return false
}
