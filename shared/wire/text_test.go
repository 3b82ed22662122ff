//go:build !wasip1

package wire

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// BadText names the first string that is not Unicode text, wherever it is,
// and nothing in a document of valid text.
func TestBadText(t *testing.T) {
	for _, c := range []struct {
		doc, field, reason string
	}{
		{`{"user_id":"user:alice","endpoint":"/x"}`, "", ""},
		{`{"user_id":"\u00e9\ud83d\ude00 \ufffd"}`, "", ""}, // a pair and a real U+FFFD are text
		{"{\"user_id\":\"user:\xff\"}", "user_id", "is not UTF-8 text"},
		{`{"user_id":"user:\ud800"}`, "user_id", "is not UTF-8 text"},
		{`{"user_id":"user:\udfff"}`, "user_id", "is not UTF-8 text"},
		{`{"user_id":"\ud83d\u0041"}`, "user_id", "is not UTF-8 text"}, // a high half, then no low one
		{"{\"endpoint\":\"/\xc3(\"}", "endpoint", "is not UTF-8 text"},
		{`{"checks":[{"user_id":"a"},{"user_id":"b","tier":"\udc00"}]}`, "checks[1].tier", "is not UTF-8 text"},
		{`{"cost_headers":{"x-a":"1","x-b":"\ud800"}}`, "cost_headers.x-b", "is not UTF-8 text"},
		{`{"cost_headers":{"x-\ud800":"1"}}`, "cost_headers", "has a key that is not UTF-8 text"},
		{`{"a":[[1,2],[3,"\ud800"]]}`, "a[1][1]", "is not UTF-8 text"},
		{`{"a":[[],{}],"b":"\ud800"}`, "b", "is not UTF-8 text"}, // found after nested empty values
		{`{"a":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`, "a" + strings.Repeat("[0]", 64), "nests deeper than 64 levels"},
	} {
		field, reason, bad := BadText([]byte(c.doc))
		if field != c.field || reason != c.reason || bad != (c.reason != "") {
			t.Errorf("BadText(%q) = %q, %q, %v; want %q, %q", c.doc, field, reason, bad, c.field, c.reason)
		}
	}
}

// Decode refuses what encoding/json would repair, naming the field; the
// decision route's fast decoder refuses it too, so the slow one names it.
func TestDecodeRefusesBadText(t *testing.T) {
	for _, doc := range []string{"{\"user_id\":\"user:\xfe\"}", `{"user_id":"user:\ud800"}`, `{"endpoint":"\udfff"}`} {
		var r CheckRequest
		if DecodeCheckRequest([]byte(doc), &r) == nil {
			t.Errorf("the fast decoder accepted %q", doc)
		}
		err := Decode([]byte(doc), &r, true)
		if err == nil || !strings.Contains(err.Error(), "not UTF-8 text") {
			t.Errorf("Decode(%q) = %v, want a refusal naming the field", doc, err)
		}
	}
}

// FuzzBadText: a document encoding/json reads without repairing a string
// (its strings re-encode to the same text) has no bad text, and one whose
// bytes are not valid UTF-8 outside its escapes is reported.
func FuzzBadText(f *testing.F) {
	f.Add([]byte(`{"a":["\u00e9",{"b":"\ud800"}]}`))
	f.Add([]byte("{\"a\":\"\xff\"}"))
	f.Add([]byte(`{"a":[[],{}],"b":"x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var v any
		if json.Unmarshal(b, &v) != nil {
			return
		}
		_, _, bad := BadText(b) // never panics, whatever the document
		if !utf8.Valid(b) && !bad && bytes.Count(b, []byte{'['})+bytes.Count(b, []byte{'{'}) <= 64 {
			t.Fatalf("%q holds bytes that are not UTF-8, yet BadText found nothing", b)
		}
	})
}
