package gateway

import (
	"strings"
	"testing"
)

// A -cluster flag either names an http(s) upstream with a host, or is
// refused with the value quoted; it never panics.
func FuzzParseCluster(f *testing.F) {
	for _, s := range []string{"controlsvc=http://127.0.0.1:8081", "a=https://svc", "=http://x", "a=ftp://x", "a=http://", "a=http://[::1", "a=http://h:port", "noequals"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		name, u, err := ParseCluster(s)
		if err != nil {
			if !strings.Contains(err.Error(), "cluster ") {
				t.Fatalf("%q: error %q names no cluster", s, err)
			}
			return
		}
		if name == "" || strings.Contains(name, "=") || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			t.Fatalf("%q accepted as %q %v", s, name, u)
		}
	})
}
