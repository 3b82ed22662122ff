package fielderr

import (
	"strconv"
	"strings"
)

// sprintf formats what field errors say without package fmt, which would
// carry reflect into the filter's Wasm module (a fifth of a megabyte). It
// takes the verbs and types field errors use — %d, %q, %s, %v and %% of
// strings, integers, floats, booleans, errors, string slices and Stringers
// — and writes them as fmt.Sprintf does (its fuzz test holds it to that).
// Anything else is written as fmt writes a bad verb ("%!v(?)"), never a
// panic. The control service formats with fmt itself (format_fmt.go).
func sprintf(format string, args []any) string {
	var b strings.Builder
	next := 0
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		verb := format[i]
		if verb == '%' {
			b.WriteByte('%')
			continue
		}
		if next >= len(args) {
			b.WriteString("%!" + string(verb) + "(MISSING)")
			continue
		}
		b.WriteString(formatArg(verb, args[next]))
		next++
	}
	if next < len(args) {
		b.WriteString("%!(EXTRA)")
	}
	return b.String()
}

type stringer interface{ String() string }

func formatArg(verb byte, a any) string {
	switch verb {
	case 'd':
		if s, ok := integer(a); ok {
			return s
		}
	case 'q':
		if s, ok := text(a); ok {
			return strconv.Quote(s)
		}
	case 's', 'v':
		if s, ok := text(a); ok {
			return s
		}
		if verb == 'v' {
			if s, ok := integer(a); ok {
				return s
			}
			switch v := a.(type) {
			case bool:
				return strconv.FormatBool(v)
			case float64:
				return strconv.FormatFloat(v, 'g', -1, 64)
			case float32:
				return strconv.FormatFloat(float64(v), 'g', -1, 32)
			case []string:
				return "[" + strings.Join(v, " ") + "]"
			case nil:
				return "<nil>"
			}
		}
	}
	return "%!" + string(verb) + "(?)"
}

// text is a string, an error's message or a Stringer's string.
func text(a any) (string, bool) {
	switch v := a.(type) {
	case string:
		return v, true
	case error:
		return v.Error(), true
	case stringer:
		return v.String(), true
	}
	return "", false
}

func integer(a any) (string, bool) {
	switch v := a.(type) {
	case int:
		return strconv.Itoa(v), true
	case int8:
		return strconv.FormatInt(int64(v), 10), true
	case int16:
		return strconv.FormatInt(int64(v), 10), true
	case int32:
		return strconv.FormatInt(int64(v), 10), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case uint:
		return strconv.FormatUint(uint64(v), 10), true
	case uint8:
		return strconv.FormatUint(uint64(v), 10), true
	case uint16:
		return strconv.FormatUint(uint64(v), 10), true
	case uint32:
		return strconv.FormatUint(uint64(v), 10), true
	case uint64:
		return strconv.FormatUint(v, 10), true
	}
	return "", false
}
