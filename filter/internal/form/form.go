// Package form finds method overrides in a request body as it streams: a
// _method field of an application/x-www-form-urlencoded or a
// multipart/form-data body, which Rails (Rack::MethodOverride), Laravel
// and Symfony read to route a POST as the method it names, or a top-level
// "_method" of a JSON body, which Laravel reads as a form field. The filter
// lets each chunk go but the last, so it reads the body in pieces: the
// scanner keeps what it needs between them, in bounded memory, whatever
// the body's size.
package form

import "strings"

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

// New returns the scanner of a POST body of contentType ("" when the
// request has none), or nil when no framework reads a method override from
// such a body. Rack reads a POST without a content type as a form, and
// parses multipart/mixed and multipart/related bodies too.
func New(contentType string) Scanner {
	media, params, _ := strings.Cut(contentType, ";")
	switch strings.ToLower(strings.TrimSpace(media)) {
	case "application/x-www-form-urlencoded", "":
		return &urlencoded{}
	case "multipart/form-data", "multipart/mixed", "multipart/related":
		if b, ok := param(params, "boundary"); ok && len(b) >= 1 && len(b) <= 70 {
			return newMultipart(b)
		}
		// No boundary: no framework parses it; nothing to read.
	default:
		if isJSON(media) {
			return &jsonBody{}
		}
	}
	return nil
}

// isJSON reports whether a media type is JSON as Laravel's isJson reads
// it: one containing "/json" or "+json".
func isJSON(media string) bool {
	m := strings.ToLower(media)
	return strings.Contains(m, "/json") || strings.Contains(m, "+json")
}

// Reads reports whether New reads a body of contentType.
func Reads(contentType string) bool {
	media, _, _ := strings.Cut(contentType, ";")
	switch strings.ToLower(strings.TrimSpace(media)) {
	case "application/x-www-form-urlencoded", "", "multipart/form-data", "multipart/mixed", "multipart/related":
		return true
	}
	return isJSON(media)
}

// A name is matched as paths.IsMethodParam matches it, one decoded byte
// at a time: leading spaces dropped, cut at a NUL, seven characters.
type nameMatch struct {
	buf  [8]byte
	n    int
	lead bool // still in the leading spaces
	cut  bool // a NUL ended it
	long bool // more than seven characters before any NUL
}

func (m *nameMatch) reset() { *m = nameMatch{lead: true} }

func (m *nameMatch) add(c byte) {
	switch {
	case m.cut || m.long:
	case m.lead && c == ' ':
	case c == 0:
		m.cut = true
	case m.n == 7:
		m.long = true
	default:
		m.lead = false
		m.buf[m.n] = c
		m.n++
	}
}

// matches reports whether the decoded name is one of _method's spellings
// (paths.IsMethodParam, on the name already decoded).
func (m *nameMatch) matches() bool {
	if m.long || m.n != 7 || strings.IndexByte("_ .[", m.buf[0]) < 0 {
		return false
	}
	return strings.EqualFold(string(m.buf[1:7]), "method")
}
