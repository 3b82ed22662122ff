//go:build !wasip1

package wire

import (
	"errors"
	"strconv"
)

// BadText finds the first string of the JSON document b, key or value,
// that is not Unicode text: bytes that are not UTF-8, or half a surrogate
// pair escaped (\ud800). encoding/json reads either as U+FFFD, so two
// different identities or paths would be read as one; a reader that must
// lose nothing refuses them. field is the path of the bad value as Decode
// names fields ("checks[2].user_id"; for a bad key, the object that holds
// it), reason says what is wrong. b is a document encoding/json accepted:
// what this walk cannot read (deeper than 64 levels) is reported too.
func BadText(b []byte) (field, reason string, bad bool) {
	p := parser{b: b, strictText: true}
	field, reason = p.walkText(0, "")
	return field, reason, reason != ""
}

// errStop ends a walk that found what it reports.
var errStop = errors.New("stop")

func (p *parser) walkText(depth int, path string) (field, reason string) {
	if depth > 64 {
		return path, "nests deeper than 64 levels"
	}
	p.ws()
	if p.i >= len(p.b) {
		return "", ""
	}
	switch p.b[p.i] {
	case '{':
		err := p.object(func(key []byte) error {
			field, reason = p.walkText(depth+1, join(path, string(key)))
			if reason != "" {
				return errStop
			}
			return nil
		})
		if errors.Is(err, errBadText) {
			return path, "has a key that is not UTF-8 text"
		}
		return field, reason
	case '[':
		p.i++
		if p.next(']') {
			return "", ""
		}
		for i := 0; ; i++ {
			if field, reason = p.walkText(depth+1, path+"["+strconv.Itoa(i)+"]"); reason != "" {
				return field, reason
			}
			if p.next(']') || !p.next(',') {
				return "", ""
			}
		}
	case '"':
		var s []byte
		if errors.Is(p.rawString(&s), errBadText) {
			return path, "is not UTF-8 text"
		}
		return "", ""
	}
	_ = p.skip(depth) // a number, true, false or null
	return "", ""
}
