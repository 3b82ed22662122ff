package form

import (
	"bytes"
	"strings"
	"unsafe"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

// maxPartHeaders bounds a part's header block. A part whose headers are
// longer cannot be read for its name: it is taken for an override that
// names no method (the filter refuses the request), since a framework
// might read it as _method.
const maxPartHeaders = 8 << 10

// multipart reads a multipart body. A delimiter is "--boundary" wherever
// it is (Rack finds one after spaces, or in the middle of a line; the line
// end before it is dropped from a value), found with a KMP automaton
// across chunks; the bytes of a delimiter begun and not finished are passed
// on as content.
type multipart struct {
	delim []byte   // "--" + boundary
	fail  []uint16 // KMP failure function of delim (maxBoundary+2 bytes at most)
	match int      // delim[:match] seen last

	state   int
	line    int  // bytes of the delimiter's line seen (after the boundary)
	closing bool // the delimiter's line began "--": the last one
	dash    bool // it began with '-'
	headers []byte
	// seen counts the part's header bytes, last holds the last two (an
	// empty line ends them); overflow: more than maxPartHeaders.
	seen     int
	last     [2]byte
	overflow bool
	method   bool   // the part is a _method field
	value    []byte // its content, up to maxValue+3 bytes (the line end included)
	// Rack ends a part's headers only at "\r\n\r\n", where others end
	// them at a "\n\n" before it: from such a "\n\n" on, rack reads
	// the headers on as Rack does (rackHead), and rackMethod, rackBody and
	// rackValue follow its reading of the part.
	rack, rackBody, rackMethod bool
	// refused: an override that names no method was found (refuse); the
	// rest of the body is not read. keys counts the names and Content-IDs
	// its part headers held (maxBodyKeys).
	refused             bool
	keys                int
	rackHead, rackValue []byte
	// unfolded is methodField's buffer, reused from part to part: reading
	// a part's headers allocates nothing.
	unfolded []byte
	out      Overrides
}

const (
	preamble    = iota // before the first delimiter
	delimLine          // the rest of a delimiter's line
	partHeaders        // a part's headers, up to an empty line
	partContent        // a part's content, up to the next delimiter
	epilogue           // after the last delimiter
)

func newMultipart(boundary string) *multipart {
	m := &multipart{delim: []byte("--" + boundary)}
	m.fail = make([]uint16, len(m.delim)+1)
	for i, k := 1, 0; i < len(m.delim); i++ {
		for k > 0 && m.delim[i] != m.delim[k] {
			k = int(m.fail[k])
		}
		if m.delim[i] == m.delim[k] {
			k++
		}
		m.fail[i+1] = uint16(k)
	}
	return m
}

func (m *multipart) Feed(chunk []byte) {
	for len(chunk) > 0 && m.state != epilogue && !m.refused {
		if m.state == delimLine && m.line >= 2 {
			// Transport padding: only the line's end matters now.
			j := bytes.IndexByte(chunk, '\n')
			if j < 0 {
				return
			}
			chunk = chunk[j:]
		}
		if m.match == 0 && m.state != delimLine {
			// The bytes up to the next delimiter are no delimiter's: found
			// by a search and taken as one run, not a state a byte (part
			// headers or content a byte at a time cost the proxy seconds a
			// crafted megabyte). At the chunk's end, the longest part of a
			// delimiter it ends with is carried.
			i := bytes.Index(chunk, m.delim)
			if i < 0 {
				carry := 0
				for k := min(len(m.delim)-1, len(chunk)); k > 0; k-- {
					if bytes.HasSuffix(chunk, m.delim[:k]) {
						carry = k
						break
					}
				}
				m.content(chunk[:len(chunk)-carry])
				m.match = carry
				return
			}
			m.content(chunk[:i])
			chunk = chunk[i:]
		}
		m.byte(chunk[0])
		chunk = chunk[1:]
	}
}

func (m *multipart) byte(c byte) {
	if m.state == epilogue {
		return
	}
	if m.state == delimLine {
		m.delimLine(c)
		return
	}
	for m.match > 0 && c != m.delim[m.match] {
		// The delimiter begun is none: what of it no longer matches is
		// content.
		k := int(m.fail[m.match])
		m.content(m.delim[:m.match-k])
		m.match = k
	}
	if c == m.delim[m.match] {
		m.match++
		if m.match == len(m.delim) {
			m.match = 0
			if m.state == partHeaders {
				// Headers a delimiter cuts short may name the field all
				// the same: a lenient reader takes it with no value.
				m.header('\n')
				m.header('\n')
			}
			m.endPart()
			m.state, m.line, m.closing, m.dash = delimLine, 0, false, false
		}
		return
	}
	m.content([]byte{c})
}

// delimLine reads the rest of a delimiter's line: "--" for the last one,
// then anything (transport padding) up to the line's end.
func (m *multipart) delimLine(c byte) {
	m.line++
	switch {
	case c == '-' && (m.line == 1 || m.line == 2 && m.dash):
		// "--" right after the boundary: the last delimiter.
		m.dash, m.closing = true, m.line == 2
	case c == '\n':
		m.state, m.headers, m.method, m.value = partHeaders, m.headers[:0], false, m.value[:0]
		m.seen, m.last, m.overflow = 0, [2]byte{}, false
	}
	if m.line == 2 && m.closing {
		// The last delimiter. What follows is no part to a strict reader;
		// a delimiter after it still starts one here (one a lenient reader
		// took for the last may be none to another).
		m.state = preamble
	}
}

// content takes bytes that are no delimiter's.
func (m *multipart) content(b []byte) {
	for len(b) > 0 {
		switch m.state {
		case partHeaders:
			b = b[m.headerBytes(b):]
		case partContent:
			if m.method && len(m.value) <= maxValue+2 {
				m.value = append(m.value, b[:min(len(b), maxValue+3-len(m.value))]...)
			}
			if m.rack {
				m.rackContent(b)
			}
			return
		default:
			return
		}
	}
}

// rackContent reads a part's content as Rack reads it: headers on to
// "\r\n\r\n" (as many as maxPartHeaders), then the value of a _method
// field they name.
func (m *multipart) rackContent(b []byte) {
	for _, c := range b {
		switch {
		case m.rackBody && m.rackMethod:
			if len(m.rackValue) > maxValue+2 {
				return
			}
			m.rackValue = append(m.rackValue, c)
		case m.rackBody:
			m.rack = false // no _method field: nothing more to read
			return
		case len(m.rackHead) >= maxPartHeaders:
			// Headers Rack reads on past what any part has: taken for a
			// _method no method is (as keep takes the filter's own), never
			// left unread (an outsider's _method 9,000 bytes on).
			m.refuse("(headers too long)")
			return
		default:
			m.rackHead = append(m.rackHead, c)
			if bytes.HasSuffix(m.rackHead, []byte("\r\n\r\n")) {
				m.rackBody = true
				encoded := false
				if m.rackMethod, encoded = methodField(m.rackHead, &m.unfolded, &m.keys); m.rackMethod && encoded {
					m.refuse(transferEncoded)
					return
				}
			}
		}
	}
}

// headerBytes reads part headers up to the empty line that ends them; it
// returns how many bytes of b it read (all of them, unless the headers
// end inside b).
func (m *multipart) headerBytes(b []byte) int {
	// The first bytes one at a time: whether a line end ends the headers
	// depends on the two bytes before it, the last chunk's or none yet.
	i := 0
	for ; i < len(b) && (i < 2 || m.seen < 2); i++ {
		if m.header(b[i]) {
			return i + 1
		}
	}
	if i == len(b) {
		return i
	}
	// From here the empty line is a "\n\n" or a "\n\r\n" inside b: found
	// by a search, the bytes before it kept as one run.
	end := len(b)
	if j := bytes.Index(b[i-2:], []byte("\n\n")); j >= 0 {
		end = i - 2 + j + 1
	}
	if j := bytes.Index(b[i-2:], []byte("\n\r\n")); j >= 0 && i-2+j+2 < end {
		end = i - 2 + j + 2
	}
	if end == len(b) {
		m.keep(b[i:])
		return len(b)
	}
	m.keep(b[i:end])
	m.header(b[end])
	return end + 1
}

// header reads one byte of the headers; true when it was the line end of
// the empty line that ends them.
func (m *multipart) header(c byte) bool {
	blank := c == '\n' && (m.seen == 0 || m.last[1] == '\n' || m.last[1] == '\r' && (m.last[0] == '\n' || m.seen == 1))
	m.keep([]byte{c})
	if blank {
		m.state = partContent
		method, encoded := methodField(m.headers, &m.unfolded, &m.keys)
		switch m.method = method; {
		case m.overflow:
			m.refuse("(headers too long)")
			return blank
		case method && encoded:
			// Decoded by Django, not here: no method to count.
			m.refuse(transferEncoded)
			return blank
		}
		m.rack = !m.overflow && !bytes.HasSuffix(m.headers, []byte("\r\n\r\n"))
		m.rackBody, m.rackMethod = false, false
		m.rackHead, m.rackValue = append(m.rackHead[:0], m.headers...), m.rackValue[:0]
	}
	return blank
}

// refuse records an override that names no method (the filter refuses
// the request whatever else the body holds) and stops reading: a body of
// hostile part headers costs one part's reading, not one per part (an
// outsider's 1 MiB of them took 16 s of a VM).
func (m *multipart) refuse(why string) {
	m.out.add(why[:min(len(why), maxValue+1)])
	m.refused, m.method, m.rack = true, false, false
}

// keep counts header bytes, remembers the last two and keeps them up to
// maxPartHeaders (past that, the part's headers are unreadable).
func (m *multipart) keep(b []byte) {
	switch n := len(b); {
	case n == 0:
		return
	case n == 1:
		m.last[0], m.last[1] = m.last[1], b[0]
	default:
		m.last[0], m.last[1] = b[n-2], b[n-1]
	}
	m.seen += len(b)
	switch {
	case m.overflow:
	case len(m.headers)+len(b) > maxPartHeaders:
		// Unreadable: taken for an override that names no method.
		m.overflow, m.headers = true, m.headers[:0]
	default:
		m.headers = append(m.headers, b...)
	}
}

// endPart ends the part in progress at a delimiter.
func (m *multipart) endPart() {
	if m.state == partContent && m.method {
		m.out.add(fieldValue(m.value))
	}
	if m.state == partContent && m.rack && m.rackBody && m.rackMethod {
		m.out.add(fieldValue(m.rackValue))
	}
	m.method, m.rack = false, false
}

// fieldValue is a field's value less the line end before the delimiter,
// at most maxValue+1 bytes.
func fieldValue(v []byte) string {
	if n := len(v); n > 0 && v[n-1] == '\n' {
		v = v[:n-1]
	}
	if n := len(v); n > 0 && v[n-1] == '\r' {
		v = v[:n-1]
	}
	return string(v[:min(len(v), maxValue+1)])
}

func (m *multipart) End() Overrides {
	if m.state == partContent && m.method {
		// Cut off: a framework refuses such a body, but count it.
		m.out.add(string(m.value[:min(len(m.value), maxValue+1)]))
	}
	m.state = epilogue
	return m.out
}

// methodField reports whether a part's headers name a _method field, as
// any framework reads them: its headers unfolded (a line that begins with
// a space or a tab continues the one before), every name parameter of its
// Content-Disposition (Rack's pattern takes the last, PHP the last, a
// third the first), found as parameters and by a search for "name=" (a
// parser that splits at ';' without honouring a quote's escapes, as
// Django's did, reads one inside another's quoted value), RFC 2231's
// name*=UTF-8”... (Django decodes it), and its Content-ID (Rack 2 names a
// part by it when it has no name), each a spelling of _method (nameMatch;
// a multipart name is not percent-decoded). encoded says the part's
// Content-Transfer-Encoding is other than 7bit, 8bit or binary: Django
// decodes a base64 value, which the filter does not read. buf holds the
// unfolded headers, reused and read in place: a body of many parts makes
// no garbage here.
func methodField(headers []byte, buf *[]byte, keys *int) (method, encoded bool) {
	if bytes.IndexByte(headers, 0) >= 0 {
		// PHP drops a header line's rest from a NUL and joins the next
		// line on ("_met\0X\r\nhod" is _method to it); no browser sends
		// one: the part is refused.
		return true, true
	}
	*buf = unfold((*buf)[:0], headers)
	if len(*buf) == 0 {
		return false, false
	}
	// A view of buf, which nothing writes while it is read. Names are
	// searched in the whole block, not per header: Rack's pattern finds
	// one inside another header's value, and Django, Rack and PHP read a
	// line that goes on without a leading space as the one before.
	// PHP joins a line without a colon to the one before with nothing
	// between ("na\r\nme=" is name=): the block with its line breaks
	// taken out is read too.
	n := len(*buf)
	for _, c := range *buf {
		if c != '\r' && c != '\n' {
			*buf = append(*buf, c)
		}
	}
	block, joined := unsafe.String(&(*buf)[0], n), ""
	if len(*buf) > n {
		joined = unsafe.String(&(*buf)[n], len(*buf)-n)
	}
	method, encoded, n1 := namesMethod(block)
	m2, e2, n2 := namesMethod(joined)
	m3, n3 := contentIDNamesMethod(block)
	method, encoded = method || m2 || m3, encoded || e2
	// A part has a name, a file's Content-Type may name it again (and its
	// file names may hold "name=" too), and a Content-ID at most: the keys
	// past eight names and a Content-ID are counted (the joined reading
	// finds the block's again: counted once).
	if *keys += max(n1, n2, 8) - 8 + max(n3-1, 0); *keys > maxBodyKeys {
		// More names than any form has, over the body's parts: taken for
		// a _method no method is, so that a body of part headers made of
		// keys costs a few parts' reading, not one per part (an
		// outsider's 1 MiB of them: 16 s of a VM).
		return true, true
	}
	for rest := block; ; {
		// The next line with a colon, cut at its first colon.
		c := strings.IndexByte(rest, ':')
		if c < 0 {
			return method, encoded
		}
		k := rest[strings.LastIndexByte(rest[:c], '\n')+1 : c]
		v := rest[c+1:]
		if e := strings.IndexByte(v, '\n'); e >= 0 {
			v, rest = v[:e], v[e+1:]
		} else {
			rest = ""
		}
		if strings.EqualFold(strings.TrimSpace(k), "content-transfer-encoding") {
			switch strings.ToLower(strings.TrimSpace(strings.TrimSuffix(v, "\r"))) {
			case "7bit", "8bit", "binary", "":
			default:
				encoded = true
			}
		}
	}
}

// contentIDNamesMethod reports whether a Content-ID anywhere in a part's
// headers names _method (Rack 2 names a part by it when it has no name).
func contentIDNamesMethod(block string) (bool, int) {
	for n := 0; n < maxSearchKeys; n++ {
		i := indexFoldASCII(block, "content-id")
		if i < 0 {
			return false, n
		}
		block = block[i+len("content-id"):]
		v, ok := strings.CutPrefix(strings.TrimLeft(block, " \t"), ":")
		if !ok {
			continue
		}
		// Rack's pattern passes white space, line breaks too, before it.
		v = strings.TrimLeft(v, space)
		if e := strings.IndexAny(v, "\r\n"); e >= 0 {
			v = v[:e]
		}
		id := strings.TrimSpace(v)
		if isMethodName(unquoted{raw: strings.TrimSuffix(strings.TrimPrefix(id, "<"), ">")}) || isMethodName(unquoted{raw: id}) {
			return true, n + 1
		}
	}
	return true, maxBodyKeys + 1 // more Content-IDs than any part has: refused
}

// indexFoldASCII is strings.Index with ASCII letters compared without case
// (lower is lower case).
func indexFoldASCII(s, lower string) int {
	for i := 0; i+len(lower) <= len(s); i++ {
		if wire.EqualFoldASCII(s[i:i+len(lower)], lower) {
			return i
		}
	}
	return -1
}

// maxBodyKeys bounds the name= and Content-ID keys beyond those a part
// may have (eight names, a Content-ID) read over a body's part headers:
// past it the body is refused. No form's parts name themselves more.
const maxBodyKeys = 256

// transferEncoded stands for a _method part's value in a transfer encoding
// (base64, quoted-printable): no method (longer than maxValue), so the
// request is refused rather than counted as its own method.
const transferEncoded = "(transfer-encoded)"

const _ = uint(len(transferEncoded) - maxValue - 1)

// namesMethod reports whether a part's headers name _method: a name=
// found by a search (paramSearch: inside another's quoted value too, in
// double or single quotes, its backslash escapes read), or RFC 2231's
// name*= decoded. foreign says a name*= is in a charset other than UTF-8
// or ASCII's (Django decodes utf-16 or cp037 names), or names too many
// keys to read: the part is taken for a _method no method is.
func namesMethod(block string) (method, foreign bool, keys int) {
	ps := paramSearch{v: block, key: "name", word: true}
	for {
		val, quoted, ext, ok := ps.next()
		if !ok {
			return ps.tooMany, ps.tooMany, ps.n
		}
		if quoted.set && !ext && isMethodName(quoted) {
			return true, false, ps.n
		}
		// Rack reads an unquoted name as a token, to the first of
		// ()<>@,;:\"/[]?={} ("_method/" is _method to it).
		if k := strings.IndexAny(val, "()<>@,;:\\\"/[]?={}"); k >= 0 && !ext && isMethodName(unquoted{raw: val[:k]}) {
			return true, false, ps.n
		}
		var nm nameMatch
		nm.reset()
		if !ext {
			unquoted{raw: val, quoted: true}.each(nm.add)
		} else {
			if quoted.set {
				val = quoted.String() // Django reads the quoted value
			}
			// charset'language'percent-encoded
			if cs, rest, ok := strings.Cut(val, "'"); ok {
				if !asciiCharset(strings.ToLower(cs)) && cs != "" {
					return true, true, ps.n
				}
				if _, rest, ok = strings.Cut(rest, "'"); ok {
					val = rest
				}
			}
			for k := 0; k < len(val); k++ {
				c := val[k]
				if c == '%' && k+2 < len(val) && unhex(val[k+1]) >= 0 && unhex(val[k+2]) >= 0 {
					c, k = byte(unhex(val[k+1])<<4|unhex(val[k+2])), k+2
				}
				nm.add(c)
			}
		}
		if nm.matches() {
			return true, false, ps.n
		}
	}
}

// unfold appends h to dst with its continuation lines (beginning with a
// space or a tab) joined to the line before.
func unfold(dst, h []byte) []byte {
	for i := 0; i < len(h); i++ {
		c := h[i]
		if c == '\r' && i+2 < len(h) && h[i+1] == '\n' && (h[i+2] == ' ' || h[i+2] == '\t') {
			i++
			continue
		}
		if c == '\n' && i+1 < len(h) && (h[i+1] == ' ' || h[i+1] == '\t') {
			continue
		}
		dst = append(dst, c)
	}
	return dst
}

// unquoted is a parameter's value as sent: raw, and whether it was quoted
// (then a backslash escapes the byte after it).
type unquoted struct {
	raw    string
	quoted bool
	set    bool // paramSearch found a quoted value (in either quote)
}

// each calls fn with the value's bytes, unescaped.
func (u unquoted) each(fn func(byte)) {
	for i := 0; i < len(u.raw); i++ {
		if u.quoted && u.raw[i] == '\\' && i+1 < len(u.raw) {
			i++
		}
		fn(u.raw[i])
	}
}

func (u unquoted) String() string {
	if !u.quoted || !strings.Contains(u.raw, "\\") {
		return u.raw
	}
	b := make([]byte, 0, len(u.raw))
	u.each(func(c byte) { b = append(b, c) })
	return string(b)
}

// isMethodName reports whether a name, as sent, is a spelling of _method.
func isMethodName(name unquoted) bool {
	var nm nameMatch
	nm.reset()
	name.each(nm.add)
	return nm.matches()
}
