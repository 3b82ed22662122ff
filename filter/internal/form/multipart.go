package form

import (
	"bytes"
	"strings"
)

// maxPartHeaders bounds a part's header block. A part whose headers are
// longer cannot be read for its name: it is taken for an override that
// names no method (the filter refuses the request), since a framework
// might read it as _method.
const maxPartHeaders = 8 << 10

// multipart reads a multipart/form-data body. A delimiter is "--boundary"
// at the start of a line ("\n--boundary": a line ended with "\r\n" leaves
// its '\r' in what came before, which is dropped from a value), found with
// a KMP automaton across chunks; the bytes of a delimiter begun and not
// finished are passed on as content.
type multipart struct {
	delim []byte // "\n--" + boundary
	fail  []int  // KMP failure function of delim
	match int    // delim[:match] seen last
	// virt: the '\n' that delim[:match] begins with was not in the body
	// (a line's start taken for one: the body's, a delimiter line's end).
	virt bool

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
	value    []byte // its content, up to maxValue+2 bytes ('\r' included)
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
	m := &multipart{delim: []byte("\n--" + boundary)}
	m.fail = make([]int, len(m.delim)+1)
	for i, k := 1, 0; i < len(m.delim); i++ {
		for k > 0 && m.delim[i] != m.delim[k] {
			k = m.fail[k]
		}
		if m.delim[i] == m.delim[k] {
			k++
		}
		m.fail[i+1] = k
	}
	m.match, m.virt = 1, true // the body's start counts as a line's: "--boundary" first
	return m
}

func (m *multipart) Feed(chunk []byte) {
	for len(chunk) > 0 && m.state != epilogue {
		if m.match == 0 && (m.state == preamble || m.state == partContent && !m.method) {
			// Bytes no one keeps, up to where a delimiter may begin: a
			// file's content costs a search for '\n', not a state each.
			i := bytes.IndexByte(chunk, '\n')
			if i < 0 {
				return
			}
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
		k := m.fail[m.match]
		emit := m.delim[:m.match-k]
		if m.virt {
			emit, m.virt = emit[1:], false
		}
		m.content(emit)
		m.match = k
	}
	if c == m.delim[m.match] {
		m.match++
		if m.match == len(m.delim) {
			m.match, m.virt = 0, false
			if m.state == partHeaders {
				// The delimiter's '\n' may end the headers too: an empty
				// part ("name=\"_method\"\n\n--boundary") is a field
				// with no value to a lenient reader.
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
		if m.closing {
			m.state = epilogue
			return
		}
		m.state, m.headers, m.method, m.value = partHeaders, m.headers[:0], false, m.value[:0]
		m.seen, m.last, m.overflow = 0, [2]byte{}, false
		m.match, m.virt = 1, true // a delimiter may follow at once (an empty part)
	}
	if m.line == 2 && m.closing {
		m.state = epilogue
	}
}

// content takes bytes that are no delimiter's.
func (m *multipart) content(b []byte) {
	switch m.state {
	case partHeaders:
		for _, c := range b {
			m.header(c)
		}
	case partContent:
		if m.method && len(m.value) <= maxValue+1 {
			m.value = append(m.value, b[:min(len(b), maxValue+2-len(m.value))]...)
		}
	}
}

func (m *multipart) header(c byte) {
	m.seen++
	blank := c == '\n' && (m.seen == 1 || m.last[1] == '\n' || m.last[1] == '\r' && (m.last[0] == '\n' || m.seen == 2))
	m.last[0], m.last[1] = m.last[1], c
	switch {
	case m.overflow:
	case len(m.headers) == maxPartHeaders:
		// Unreadable: taken for an override that names no method.
		m.overflow, m.headers = true, m.headers[:0]
	default:
		m.headers = append(m.headers, c)
	}
	if blank {
		m.state = partContent
		if m.method = m.overflow || methodField(string(m.headers)); m.overflow {
			m.value = append(m.value[:0], "(headers too long)"...)
		}
	}
}

// endPart ends the part in progress at a delimiter.
func (m *multipart) endPart() {
	if m.state == partContent && m.method {
		v := m.value
		if n := len(v); n > 0 && v[n-1] == '\r' {
			v = v[:n-1]
		}
		m.out.add(string(v[:min(len(v), maxValue+1)]))
	}
	m.method = false
}

func (m *multipart) End() Overrides {
	if m.state == partContent && m.method {
		// Cut off: a framework refuses such a body, but count it.
		m.out.add(string(m.value[:min(len(m.value), maxValue+1)]))
	}
	m.state = epilogue
	return m.out
}

// methodField reports whether a part's headers name a _method field: its
// Content-Disposition's name parameter, read leniently (a quoted string
// with backslash escapes, or a token), is one of the spellings a framework
// reads as _method (paths.IsMethodParam, with no percent-decoding: a
// multipart name is not encoded).
func methodField(headers string) bool {
	for _, line := range strings.Split(headers, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "content-disposition") {
			continue
		}
		if name, ok := param(v, "name"); ok {
			var nm nameMatch
			nm.reset()
			for i := 0; i < len(name); i++ {
				nm.add(name[i])
			}
			if nm.matches() {
				return true
			}
		}
	}
	return false
}

// param is the value of a parameter of a header value ("form-data;
// name=\"x\""), found by its key without case.
func param(v, key string) (string, bool) {
	for v != "" {
		v = strings.TrimLeft(v, " \t;")
		k, rest, ok := strings.Cut(v, "=")
		if !ok {
			return "", false
		}
		k = strings.TrimSpace(k)
		if i := strings.LastIndexByte(k, ';'); i >= 0 {
			k = strings.TrimSpace(k[i+1:])
		}
		rest = strings.TrimLeft(rest, " \t")
		var val string
		if strings.HasPrefix(rest, `"`) {
			var b strings.Builder
			i := 1
			for ; i < len(rest) && rest[i] != '"'; i++ {
				if rest[i] == '\\' && i+1 < len(rest) {
					i++
				}
				b.WriteByte(rest[i])
			}
			val, v = b.String(), rest[min(i+1, len(rest)):]
		} else {
			val, v, _ = strings.Cut(rest, ";")
			val = strings.TrimSpace(strings.TrimSuffix(val, "\r"))
		}
		if strings.EqualFold(k, key) {
			return val, true
		}
	}
	return "", false
}
