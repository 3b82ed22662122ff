package form

import "bytes"

// urlencoded reads an application/x-www-form-urlencoded body: parameters
// split at '&' and ';' (as paths.EachMethodParam splits a query), names
// and values form-decoded (%XX, '+' as a space; an escape that is not one
// kept as sent).
type urlencoded struct {
	started bool
	inValue bool
	name    nameMatch
	value   []byte // the value of a matching name, up to maxValue+1 bytes
	// An escape in progress: esc is 1 after '%', 2 after '%' and a hex
	// digit (hex).
	esc int
	hex byte
	out Overrides
}

func (u *urlencoded) Feed(chunk []byte) {
	if !u.started {
		u.started = true
		u.name.reset()
	}
	for len(chunk) > 0 {
		if u.inValue && u.esc == 0 && !u.name.matches() {
			// The value of a field no one reads: only a raw '&' or ';'
			// (an escaped one is no separator) ends it.
			i := bytes.IndexAny(chunk, "&;")
			if i < 0 {
				return
			}
			chunk = chunk[i:]
		}
		u.byte(chunk[0])
		chunk = chunk[1:]
	}
}

func (u *urlencoded) End() Overrides {
	if !u.started {
		return u.out
	}
	u.flushEscape()
	u.param()
	u.started = false
	return u.out
}

func (u *urlencoded) byte(c byte) {
	switch u.esc {
	case 1:
		if unhex(c) >= 0 {
			u.esc, u.hex = 2, c
			return
		}
		u.esc = 0
		u.decoded('%')
	case 2:
		u.esc = 0
		if unhex(c) >= 0 {
			u.decoded(byte(unhex(u.hex)<<4 | unhex(c)))
			return
		}
		u.decoded('%')
		u.decoded(u.hex)
	}
	switch c {
	case '&', ';':
		if !u.inValue && u.name == (nameMatch{lead: true}) {
			return // an empty parameter: nothing to end
		}
		u.param()
	case '=':
		if !u.inValue {
			u.inValue = true
			return
		}
		u.decoded('=')
	case '%':
		u.esc = 1
	case '+':
		u.decoded(' ')
	default:
		u.decoded(c)
	}
}

// flushEscape passes on an escape the body ended in the middle of.
func (u *urlencoded) flushEscape() {
	switch u.esc {
	case 1:
		u.decoded('%')
	case 2:
		u.decoded('%')
		u.decoded(u.hex)
	}
	u.esc = 0
}

// decoded takes one decoded byte of the current name or value.
func (u *urlencoded) decoded(c byte) {
	switch {
	case !u.inValue:
		u.name.add(c)
	case len(u.value) <= maxValue && u.name.matches():
		u.value = append(u.value, c)
	}
}

// param ends the current parameter.
func (u *urlencoded) param() {
	u.flushEscape()
	if u.name.matches() {
		u.out.add(string(u.value))
	}
	u.name.reset()
	u.inValue, u.value = false, u.value[:0]
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}
