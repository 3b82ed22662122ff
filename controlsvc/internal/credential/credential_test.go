package credential

import "testing"

func TestTrusted(t *testing.T) {
	d := Of([]string{"current-token", "next-token"})
	for _, tc := range []struct {
		got  string
		want bool
	}{{"current-token", true}, {"next-token", true}, {"other", false}, {"", false}, {"current-token ", false}} {
		if got := d.Trusted([]byte(tc.got)); got != tc.want {
			t.Errorf("Trusted(%q) = %v", tc.got, got)
		}
	}
	if Of(nil).Trusted([]byte("x")) || Of(nil).Trusted(nil) {
		t.Error("no tokens trusts something")
	}
}
