package fielderr

import (
	"errors"
	"fmt"
	"testing"
)

type named string

func (n named) String() string { return string(n) }

// FuzzSprintf: for the verbs and types field errors use, sprintf writes
// what fmt.Sprintf writes.
func FuzzSprintf(f *testing.F) {
	f.Add("%q must be in %d..%d (%s, %v%%)", "a\"\x00é", int64(-5), uint32(7), 1.5, true)
	f.Add("%v %v %q", "", int64(1<<62), uint32(0), -0.0, false)
	f.Fuzz(func(t *testing.T, format, s string, i int64, u uint32, fl float64, b bool) {
		for _, args := range [][]any{
			{s, i, u}, {errors.New(s), int(i), named(s)}, {[]string{s, s}, fl, b}, {int8(i), uint16(u), uint64(u)}, {nil, float32(fl), int32(i)},
		} {
			if !simple(format) {
				return
			}
			want := fmt.Sprintf(format, args...)
			got := sprintf(format, args)
			if got != want && !bad(want) && !bad(got) {
				t.Fatalf("%q %v: got %q, fmt %q", format, args, got, want)
			}
		}
	})
}

// simple: a format of plain verbs (no flags, widths or indexes).
func simple(f string) bool {
	for i := 0; i < len(f); i++ {
		if f[i] == '%' {
			if i+1 == len(f) {
				return false
			}
			switch f[i+1] {
			case 'd', 'q', 's', 'v', '%':
				i++
			default:
				return false
			}
		}
	}
	return true
}

// bad: a verb that could not be applied (fmt and sprintf each mark it their
// way; sprintf also marks the combinations it does not take, as %q of an
// integer, which field errors never use).
func bad(s string) bool {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '%' && s[i+1] == '!' {
			return true
		}
	}
	return false
}
