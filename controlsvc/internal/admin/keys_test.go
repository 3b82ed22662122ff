package admin

import (
	"encoding/json"
	"strconv"
	"testing"
)

// FuzzUserID: a user id is a JSON string or integer, read back exactly;
// anything else is a type error, never a panic or a silent zero.
func FuzzUserID(f *testing.F) {
	for _, s := range []string{`42`, `"42"`, `-7`, `4.5`, `1e3`, `true`, `null`, `"a\u0000b"`, `99999999999999999999`, `{}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var v struct {
			U UserID `json:"user_id"`
		}
		err := json.Unmarshal([]byte(`{"user_id":`+in+`}`), &v)
		if err != nil {
			return
		}
		if v.U.Number {
			if _, perr := strconv.ParseInt(v.U.Value, 10, 64); perr != nil {
				t.Fatalf("%s read as the number %q", in, v.U.Value)
			}
			return
		}
		var want string
		if json.Unmarshal([]byte(in), &want) != nil && in != "null" {
			t.Fatalf("%s read as the string %q", in, v.U.Value)
		}
	})
}
