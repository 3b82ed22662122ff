package wire

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

var usagePaths = [][]string{{"usage", "total_tokens"}, {"usage", "input_tokens"}, {"usage", "output_tokens"}, {"n"}}

func TestReadUsage(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want []Usage
	}{
		{`{"id":"x","usage":{"prompt_tokens":3,"total_tokens":42}}`, []Usage{{true, true, 42}, {}, {}, {}}},
		{`{"usage":{"input_tokens":10,"output_tokens":5}}`, []Usage{{}, {true, true, 10}, {true, true, 5}, {}}},
		{`{"usage":{"total_tokens":-3}}`, []Usage{{true, false, 0}, {}, {}, {}}},
		{`{"usage":{"total_tokens":-0}}`, []Usage{{true, true, 0}, {}, {}, {}}},
		{`{"usage":{"total_tokens":12.1}}`, []Usage{{true, true, 13}, {}, {}, {}}},
		{`{"usage":{"total_tokens":1e400}}`, []Usage{{true, true, MaxUsage}, {}, {}, {}}},
		{`{"usage":{"total_tokens":99999999999999999999}}`, []Usage{{true, true, MaxUsage}, {}, {}, {}}},
		{`{"usage":{"total_tokens":"42"}}`, []Usage{{true, false, 0}, {}, {}, {}}},
		{`{"usage":{"total_tokens":null}}`, []Usage{{true, false, 0}, {}, {}, {}}},
		{`{"usage":[{"total_tokens":5}]}`, []Usage{{}, {}, {}, {}}},
		{`{"usage":{"total_tokens":1},"usage":{"total_tokens":2}}`, []Usage{{true, true, 2}, {}, {}, {}}},
		{`{"n":{"a":1}}`, []Usage{{}, {}, {}, {true, false, 0}}},
		{`[1,2]`, []Usage{{}, {}, {}, {}}},
		{`  {"n" : 7 }  `, []Usage{{}, {}, {}, {true, true, 7}}},
	} {
		got := make([]Usage, len(usagePaths))
		if err := ReadUsage([]byte(tc.doc), usagePaths, got); err != nil {
			t.Errorf("%s: %v", tc.doc, err)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%s: path %v: %+v, want %+v", tc.doc, usagePaths[i], got[i], tc.want[i])
			}
		}
	}
	for _, bad := range []string{``, `{`, `{"usage":{"total_tokens":}}`, `{"usage":{"total_tokens":01}}`, `{} {}`, `{"a":1,}`, strings.Repeat(`{"a":`, 100) + "1" + strings.Repeat("}", 100)} {
		if err := ReadUsage([]byte(bad), usagePaths, make([]Usage, len(usagePaths))); err == nil {
			t.Errorf("%q read", bad)
		}
	}
}

// FuzzReadUsage holds ReadUsage to encoding/json: a document it reads,
// encoding/json reads too, and every path's value is what encoding/json
// finds there (a number as its rounded-up amount).
func FuzzReadUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"total_tokens":42,"input_tokens":1.5,"output_tokens":-2},"n":[1]}`))
	f.Add([]byte(`{"usage":{"usage":{"total_tokens":1}},"usage":null}`))
	f.Add([]byte(`{"n":1e3,"usage":{"total_tokens":"x"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got := make([]Usage, len(usagePaths))
		if err := ReadUsage(b, usagePaths, got); err != nil {
			return
		}
		var doc any
		err := json.Unmarshal(b, &doc)
		var outOfRange *json.UnmarshalTypeError
		if errors.As(err, &outOfRange) {
			return // a number past a double's range: read here as MaxUsage
		}
		if err != nil {
			t.Fatalf("read %q, which encoding/json refuses: %v", b, err)
		}
		for i, path := range usagePaths {
			var v any = doc
			found := true
			for _, name := range path {
				m, ok := v.(map[string]any)
				if !ok {
					found = false
					break
				}
				if v, ok = m[name]; !ok {
					found = false
					break
				}
			}
			want := Usage{Found: found}
			if f, ok := v.(float64); ok && found && f >= 0 {
				want.Valid = true
				want.N = int64(min(math.Ceil(f), MaxUsage))
			}
			if got[i] != want {
				t.Fatalf("%q: path %v: %+v, encoding/json finds %v (%+v)", b, path, got[i], v, want)
			}
		}
	})
}
