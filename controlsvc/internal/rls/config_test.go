package rls

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-rl/tollgate/shared/rules"
)

const example = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user
    value: vip
    rate_limit: {unit: minute, requests_per_unit: 1000, name: vip, replaces: [{name: ceiling}]}
  - key: path
    value: /admin*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: "/v*/items/*/x"
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: remote_address
    descriptors:
      - key: path
        rate_limit: {unit: day, requests_per_unit: 3, algorithm: token_bucket, burst: 6}
  - key: health
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    detailed_metric: true
    rate_limit: {unit: week, requests_per_unit: 2}
  - key: ceiling
    rate_limit: {unit: minute, requests_per_unit: 100, name: ceiling}
  - key: bare
`

func TestParse(t *testing.T) {
	c, err := Parse("api.yaml", []byte(example))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Domains(), ","); got != "api" {
		t.Fatalf("domains %s", got)
	}
	l := c.Find("api", []Entry{{"remote_address", "1.2.3.4"}, {"path", "/x"}})
	if l == nil || l.Algorithm != rules.TokenBucket || l.Burst != 6 || l.Window() != 86400 || l.RequestsPerUnit != 3 || l.Path != "api.remote_address.path" {
		t.Fatalf("nested limit %+v", l)
	}
	if l := c.Find("api", []Entry{{"shadow", "x"}}); l == nil || !l.Shadow || !l.DetailedMetric || l.Unit != rlspb.RateLimitResponse_RateLimit_WEEK {
		t.Fatalf("shadow limit %+v", l)
	}
	if l := c.Find("api", []Entry{{"health", ""}}); l == nil || !l.Unlimited {
		t.Fatalf("unlimited %+v", l)
	}
}

// Every mistake names the file, the line and the field, and nothing of a
// bad file is loaded.
func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ name, yaml, want string }{
		{"empty", ``, "empty: a configuration needs a domain"},
		{"not yaml", "domain: [", "not YAML"},
		{"no domain", "descriptors: []", "domain: missing"},
		{"domain not string", "domain: [a]", "domain: must be a string"},
		{"empty domain", `domain: ""`, "domain: must be 1 to"},
		{"unknown top", "domain: a\nextra: 1", "x.yaml:2: extra: unknown field"},
		{"descriptors not list", "domain: a\ndescriptors: {}", "descriptors: must be a list"},
		{"no key", "domain: a\ndescriptors:\n  - value: b", "x.yaml:3: descriptors[0].key: missing"},
		{"empty key", "domain: a\ndescriptors:\n  - key: ''", "descriptors[0].key: must be 1 to"},
		{"long value", "domain: a\ndescriptors:\n  - key: k\n    value: " + strings.Repeat("v", MaxValueLen+1), "descriptors[0].value: longer than"},
		{"duplicate", "domain: a\ndescriptors:\n  - key: k\n  - key: k", `descriptors[1]: descriptor "k" is configured twice`},
		{"unknown field", "domain: a\ndescriptors:\n  - key: k\n    rate_limits: {}", "descriptors[0].rate_limits: unknown field"},
		{"quota mode", "domain: a\ndescriptors:\n  - key: k\n    quota_mode: true", "descriptors[0].quota_mode: quota mode is not supported"},
		{"share threshold", "domain: a\ndescriptors:\n  - key: k\n    value: a*\n    share_threshold: true", "share_threshold: shared wildcard"},
		{"bad unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}", `rate_limit.unit: "fortnight" is not a unit`},
		{"unknown unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 1}", `rate_limit.unit: "unknown" is not a unit`},
		{"no unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}", "rate_limit.unit: missing"},
		{"unlimited with unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}", "an unlimited limit has no unit"},
		{"negative", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}", "requests_per_unit: must be a whole number"},
		{"huge", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}", "requests_per_unit: must be a whole number from 0 to 4294967295"},
		{"string count", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: '5'}", "requests_per_unit: must be a whole number"},
		{"bool", "domain: a\ndescriptors:\n  - key: k\n    shadow_mode: yes please", "shadow_mode: must be true or false"},
		{"replaces self", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}", "replaces[0].name: a limit cannot replace itself"},
		{"replaces empty", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}", "replaces[0].name: empty"},
		{"replaces shape", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: n}", "replaces: must be a list"},
		{"bad algorithm", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky}", `algorithm: "leaky" is not an algorithm`},
		{"burst without bucket", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}", "burst: only token_bucket and gcra"},
		{"burst below limit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: gcra, burst: 5}", "burst: must be at least requests_per_unit"},
		{"algorithm zero", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0, algorithm: gcra}", "requests_per_unit: must be at least 1"},
		{"too deep", "domain: a\ndescriptors: " + strings.Repeat("[{key: k, descriptors: ", MaxEntries+1) + "[]" + strings.Repeat("}]", MaxEntries+1), "nested deeper than"},
		{"twice", "domain: a\ndomain: b", "domain: given twice"},
		{"reserved domain", "domain: tollgate", "domain: tollgate is reserved"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("x.yaml", []byte(c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to contain %q", err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "x.yaml") {
				t.Fatalf("error %q does not name the file", err)
			}
		})
	}
}

// A directory: every .yaml and .yml file, one domain each; a domain in two
// files is an error naming both.
func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\n")
	write("b.yml", "domain: b\n")
	write("notes.txt", "not a config")
	write(".hidden.yaml", "domain: hidden\n")
	c, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Domains(), ","); got != "a,b" {
		t.Fatalf("domains %s", got)
	}
	if _, err := Load(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatalf("one file: %v", err)
	}
	write("c.yaml", "domain: a\n")
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "a.yaml") || !strings.Contains(err.Error(), "c.yaml") {
		t.Fatalf("duplicate domain: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "rls_config") {
		t.Fatalf("missing path: %v", err)
	}
}

// FuzzParse: whatever the bytes, Parse returns a config or an error naming
// the file; it never panics, and a config it returns answers lookups.
func FuzzParse(f *testing.F) {
	f.Add([]byte(example))
	f.Add([]byte("domain: a\ndescriptors:\n  - key: k\n    value: '*'\n    rate_limit: {unit: second, requests_per_unit: 1}"))
	f.Add([]byte("domain: &a x\ndescriptors: *a"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("f.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		for _, d := range c.Domains() {
			c.Find(d, []Entry{{"k", "v"}, {"path", "/a"}})
		}
	})
}

// The example the Envoy bootstrap's /search route uses loads.
func TestShippedExample(t *testing.T) {
	c, err := Load("../../../envoy/rls-config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if l := c.Find("search", []Entry{{"generic_key", "search"}, {"remote_address", "192.0.2.1"}}); l == nil || l.RequestsPerUnit != 20 {
		t.Fatalf("search limit %+v", l)
	}
	if l := c.Find("search", []Entry{{"generic_key", "search"}, {"remote_address", "10.0.0.5"}}); l == nil || !l.Unlimited {
		t.Fatalf("exempt caller %+v", l)
	}
}
