package jwt

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"
)

// base64URL reads what encoding/base64's unpadded URL encoding reads, the
// same bytes, strict or not; it only takes no line breaks in a token
// (encoding/base64 skips them even when strict: more spellings of one
// token).
func FuzzBase64URL(f *testing.F) {
	for _, s := range []string{"", "QQ", "QR", "QUI", "QUJ", "QUJD", "_-8", "a", "ab=", "a\nb", "YWJj\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, strict := range []bool{false, true} {
			enc := base64.RawURLEncoding
			if strict {
				enc = enc.Strict()
			}
			want, werr := enc.DecodeString(s)
			got, err := base64URL(s, strict)
			if strings.ContainsAny(s, "\r\n") {
				if err == nil {
					t.Fatalf("%q (strict %v): a line break taken", s, strict)
				}
				continue
			}
			if (err == nil) != (werr == nil) || err == nil && !bytes.Equal(got, want) {
				t.Fatalf("%q (strict %v): %x %v; encoding/base64 %x %v", s, strict, got, err, want, werr)
			}
		}
	})
}
