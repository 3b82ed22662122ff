package rls

import (
	"strings"
	"testing"
)

// Find walks the tree as envoyproxy/ratelimit does.
func TestFind(t *testing.T) {
	c, err := Parse("api.yaml", []byte(example))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		domain  string
		entries []Entry
		want    string // the limit's path, "" for none
	}{
		{"any value", "api", []Entry{{"user", "alice"}}, "api.user"},
		{"exact value wins", "api", []Entry{{"user", "vip"}}, "api.user_vip"},
		{"prefix wildcard", "api", []Entry{{"path", "/admin/users"}}, "api.path_/admin*"},
		{"prefix wildcard, nothing after", "api", []Entry{{"path", "/admin"}}, "api.path_/admin*"},
		{"inner wildcards", "api", []Entry{{"path", "/v2/items/42/x"}}, "api.path_/v*/items/*/x"},
		{"inner wildcard, wrong suffix", "api", []Entry{{"path", "/v2/items/42/y"}}, ""},
		{"no such key", "api", []Entry{{"tenant", "t"}}, ""},
		{"nested", "api", []Entry{{"remote_address", "1.2.3.4"}, {"path", "/p"}}, "api.remote_address.path"},
		{"parent of a nested limit has none", "api", []Entry{{"remote_address", "1.2.3.4"}}, ""},
		{"longer than the tree", "api", []Entry{{"user", "alice"}, {"path", "/p"}}, ""},
		{"node without a limit", "api", []Entry{{"bare", "x"}}, ""},
		{"unknown domain", "other", []Entry{{"user", "alice"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := c.Find(tc.domain, tc.entries)
			got := ""
			if l != nil {
				got = l.Path
			}
			if got != tc.want {
				t.Fatalf("limit %q, want %q", got, tc.want)
			}
		})
	}
}

func TestWildcardMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, value string
		want           bool
	}{
		{"a*", "a", true},
		{"a*", "abc", true},
		{"a*", "ba", false},
		{"*c", "abc", true},
		{"a*c", "ac", true},
		{"a*c", "abc", true},
		{"a*c", "abd", false},
		{"ab*ba", "aba", false}, // the prefix and the suffix may not overlap
		{"a*b*c", "abc", true},
		{"a*b*c", "ac", false},
		{"a*b*b*c", "abbc", true},
		{"a*b*b*c", "abc", false},
		{"*", "", true},
		{"exact", "exact", true},
	} {
		if got := wildcardMatch(strings.Split(tc.pattern, "*"), tc.value); got != tc.want {
			t.Errorf("wildcardMatch(%q, %q) = %v, want %v", tc.pattern, tc.value, got, tc.want)
		}
	}
}
