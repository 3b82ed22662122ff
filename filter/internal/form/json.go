package form

import (
	"bytes"
	"unicode/utf8"
)

// jsonBody reads a JSON body for a top-level "_method" string: Laravel
// reads a JSON POST's fields as its form (its request bag is the JSON
// input), and Symfony's method override reads _method from that bag, as
// Express's method-override does from body-parser's req.body. Only
// the top-level object's members are fields; the key is compared decoded
// (escapes too), exactly, as PHP's json_decode names it. Every other value
// is skipped, at any depth, in bounded memory: strings are followed
// through their escapes so that no brace or quote in one is misread. A
// UTF-8 byte order mark before the body is passed over (body-parser
// strips it), and a "_method" that is an array or an object reads as an
// override naming no method (method-override takes an array's first
// element): the request is refused rather than counted as one method
// while an upstream routes it as another.
type jsonBody struct {
	bom      int // bytes of a leading byte order mark read
	started  bool
	object   bool // the body is an object: it has fields
	depth    int  // containers open
	inString bool
	esc      int  // 1 after '\\'; 2..5 in \\u's hex digits
	u        rune // the \\u escape's value so far
	hi       rune // a high surrogate waiting for its low one (0: none)
	// At depth 1: what comes next (key, colon, value, comma), whether the
	// string read is a key, the key read so far (matched against
	// "_method"), and the value of a matching key.
	next    int
	isKey   bool
	key     []byte
	keyLong bool
	match   bool // the last key read is "_method"
	isValue bool // the string read is that key's value
	value   []byte
	out     Overrides
}

// bom is UTF-8's byte order mark.
const bom = "\xEF\xBB\xBF"

// containerValue stands for a "_method" that is an array or an object: a
// value no method is (longer than maxValue).
const containerValue = "(array or object)"

const _ = uint(len(containerValue) - maxValue - 1)

const (
	jsonKey = iota
	jsonColon
	jsonValue
	jsonComma
)

func (j *jsonBody) Feed(chunk []byte) {
	for len(chunk) > 0 {
		// Bytes no one keeps, up to the next that may matter: inside a
		// string skipped, its end or an escape; deeper than the top
		// object's members, a string or a container's edge.
		var stop string
		switch {
		case j.inString && j.esc == 0 && j.hi == 0 && !j.isKey && !j.isValue:
			stop = "\"\\"
		case !j.inString && j.depth > 1:
			stop = "\"{}[]"
		}
		if stop != "" {
			i := bytes.IndexAny(chunk, stop)
			if i < 0 {
				return
			}
			chunk = chunk[i:]
		}
		j.byte(chunk[0])
		chunk = chunk[1:]
	}
}

func (j *jsonBody) End() Overrides { return j.out }

func (j *jsonBody) byte(c byte) {
	if j.inString {
		j.stringByte(c)
		return
	}
	switch c {
	case ' ', '\t', '\r', '\n':
		return
	}
	if !j.started && j.bom < len(bom) && c == bom[j.bom] {
		j.bom++
		return
	}
	if !j.started {
		j.started = true
		j.object = c == '{'
	}
	if !j.object {
		return // an array, a string, a number: no fields
	}
	switch c {
	case '{', '[':
		if j.depth == 1 && j.next == jsonValue {
			if j.match {
				j.out.add(containerValue)
			}
			j.next = jsonComma
		}
		j.depth++
		if j.depth == 1 {
			j.next = jsonKey
		}
	case '}', ']':
		j.depth--
	case '"':
		j.inString, j.esc, j.hi = true, 0, 0
		j.isKey = j.depth == 1 && j.next == jsonKey
		j.isValue = j.depth == 1 && j.next == jsonValue && j.match
		if j.isKey {
			j.key, j.keyLong = j.key[:0], false
		}
		if j.isValue {
			j.value = j.value[:0]
		}
	case ':':
		if j.depth == 1 && j.next == jsonColon {
			j.next = jsonValue
		}
	case ',':
		if j.depth == 1 {
			j.next, j.match = jsonKey, false
		}
	default:
		if j.depth == 1 && j.next == jsonValue {
			j.next = jsonComma // a number, true, false, null: no method
		}
	}
}

// stringByte reads a byte of a string, decoding escapes for a key or a
// value that is kept.
func (j *jsonBody) stringByte(c byte) {
	switch {
	case j.esc == 1:
		j.esc = 0
		switch c {
		case 'u':
			j.esc, j.u = 2, 0
		case 'b':
			j.decoded('\b')
		case 'f':
			j.decoded('\f')
		case 'n':
			j.decoded('\n')
		case 'r':
			j.decoded('\r')
		case 't':
			j.decoded('\t')
		default:
			j.decoded(rune(c)) // '"', '\\', '/'
		}
	case j.esc >= 2:
		d := unhex(c)
		if d < 0 {
			j.esc = 0 // not JSON: a parser refuses the body
			return
		}
		j.u = j.u<<4 | rune(d)
		if j.esc++; j.esc == 6 {
			j.esc = 0
			j.unicode(j.u)
		}
	case c == '\\':
		j.esc = 1
	case c == '"':
		j.flushHi()
		j.inString = false
		j.endString()
	default:
		j.flushHi()
		j.decodedByte(c)
	}
}

// unicode takes a \u escape's code unit, pairing surrogates (a lone one
// is U+FFFD, as encoding/json reads it).
func (j *jsonBody) unicode(u rune) {
	switch {
	case 0xD800 <= u && u < 0xDC00:
		j.flushHi()
		j.hi = u
		return
	case 0xDC00 <= u && u < 0xE000 && j.hi != 0:
		u, j.hi = 0x10000+(j.hi-0xD800)<<10+(u-0xDC00), 0
	case 0xDC00 <= u && u < 0xE000:
		u = utf8.RuneError
	}
	j.decoded(u)
}

// flushHi writes a high surrogate no low one followed as U+FFFD.
func (j *jsonBody) flushHi() {
	if j.hi != 0 {
		j.hi = 0
		j.decoded(utf8.RuneError)
	}
}

func (j *jsonBody) decoded(r rune) {
	j.flushHi()
	var b [utf8.UTFMax]byte
	for _, c := range b[:utf8.EncodeRune(b[:], r)] {
		j.decodedByte(c)
	}
}

func (j *jsonBody) decodedByte(c byte) {
	switch {
	case j.isKey && len(j.key) < len("_method"):
		j.key = append(j.key, c)
	case j.isKey:
		j.keyLong = true
	case j.isValue && len(j.value) <= maxValue:
		j.value = append(j.value, c)
	}
}

// endString ends a key (the colon comes next) or a value.
func (j *jsonBody) endString() {
	switch {
	case j.isKey:
		j.match = !j.keyLong && string(j.key) == "_method"
		j.next = jsonColon
	case j.depth == 1 && j.next == jsonValue:
		if j.isValue {
			j.out.add(string(j.value))
		}
		j.next = jsonComma
	}
	j.isKey, j.isValue = false, false
}
