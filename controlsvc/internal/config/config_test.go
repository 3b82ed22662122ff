package config

import (
	"errors"
	"fmt"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

func noEnv(string) (string, bool) { return "", false }

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaultsAreValid(t *testing.T) {
	cfg, err := Parse(nil, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:8081" || cfg.RedisURL != "redis://127.0.0.1:6379/0" || cfg.FailureMode != FailOpen {
		t.Fatalf("defaults: %+v", cfg)
	}
}

const sample = `
listen = "127.0.0.1:9000"
failure_mode = "fail_closed"
default_tier = "free"

[lease]
fraction = 0.2
max = 50
ttl_ms = 500

[penalties]
enabled = true
detection_window_seconds = 600
violation_threshold = 2
multipliers = [1, 2, 4]

[exemptions]
ips = ["10.0.0.1", "192.168.0.0/16", "::1"]
users = ["ops"]

[[tiers]]
name = "free"
limit = 100
window_seconds = 60

[[tiers]]
name = "premium"
limit = 1000
window_seconds = 60
algorithm = "sliding_window"
[tiers.endpoints]
"/api/v1/request" = 50

[[rules]]
id = "login"
path = "/api/v1/auth/login"
methods = ["POST"]
scope = "ip"
algorithm = "fixed_window"
limit = 5
window_seconds = 60
priority = 100
`

func TestParseFile(t *testing.T) {
	cfg, err := Parse([]byte(sample), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Tiers) != 2 || cfg.Tiers[1].Endpoints["/api/v1/request"] != 50 {
		t.Fatalf("tiers: %+v", cfg.Tiers)
	}
	if len(cfg.Rules) != 1 || cfg.Rules[0].Scope != rules.ScopeIP || !cfg.Rules[0].IsEnabled() {
		t.Fatalf("rules: %+v", cfg.Rules)
	}
	if !cfg.Penalties.Enabled || cfg.Lease.Max != 50 || cfg.FailureMode != FailClosed {
		t.Fatalf("settings: %+v", cfg)
	}
}

func TestEnvOverridesFile(t *testing.T) {
	cfg, err := Parse([]byte(sample), envOf(map[string]string{
		"TOLLGATE_LISTEN":         "127.0.0.1:7000",
		"TOLLGATE_FAILURE_MODE":   "fail_open",
		"TOLLGATE_ADMIN_TOKEN":    "s3cret-s3cret-s3cret-s3cret-s3cret",
		"TOLLGATE_LEASE_MAX":      "7",
		"TOLLGATE_REDIS_URL":      "redis://:pw@127.0.0.1:6390/2",
		"TOLLGATE_LOG_LEVEL":      "debug",
		"TOLLGATE_LEASE_TTL_MS":   "250",
		"TOLLGATE_DEFAULT_TIER":   "premium",
		"TOLLGATE_LEASE_FRACTION": "0.5",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:7000" || cfg.FailureMode != FailOpen || cfg.Lease.Max != 7 || cfg.DefaultTier != "premium" || cfg.Lease.Fraction != 0.5 {
		t.Fatalf("env not applied: %+v", cfg)
	}
	if red := RedactURL(cfg.RedisURL); strings.Contains(red, "pw") || !strings.Contains(red, "127.0.0.1:6390") {
		t.Fatalf("redacted URL %q leaks the password or lost the address", red)
	}
}

func TestInvalidNamesTheField(t *testing.T) {
	tests := []struct {
		name, toml string
		env        map[string]string
		want       string
	}{
		{"bad failure mode", `failure_mode = "maybe"`, nil, "failure_mode:"},
		{"period of a week", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nperiod = \"week\"", nil, "rules[0].period:"},
		{"period beside a window", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nperiod = \"day\"\nwindow_seconds = 60", nil, "rules[0].window_seconds:"},
		{"period with a token bucket", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"token_bucket\"\nperiod = \"month\"", nil, "rules[0].algorithm:"},
		{"unknown time zone", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nperiod = \"day\"\ntime_zone = \"Mars/Olympus_Mons\"", nil, "rules[0].time_zone:"},
		{"the host's time zone", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nperiod = \"day\"\ntime_zone = \"Local\"", nil, "rules[0].time_zone:"},
		{"time zone path", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nperiod = \"day\"\ntime_zone = \"../../etc/passwd\"", nil, "rules[0].time_zone:"},
		{"time zone without a period", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nwindow_seconds = 60\ntime_zone = \"UTC\"", nil, "rules[0].time_zone:"},
		{"cost from a response in a sliding log", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"sliding_log\"\nwindow_seconds = 60\ncost_from = \"response_json:usage.total_tokens\"", nil, "rules[0].algorithm: \"sliding_log\" cannot take a cost charged after the response"},
		{"cost from a response, a path too deep", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nwindow_seconds = 60\ncost_from = \"response_json:a.b.c.d.e\"", nil, "rules[0].cost_from: \"response_json:a.b.c.d.e\": a path is at most 4 names deep"},
		{"cost from a response, an empty name", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nwindow_seconds = 60\ncost_from = \"response_json:usage..x\"", nil, "rules[0].cost_from:"},
		{"cost from a response, five paths", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nwindow_seconds = 60\ncost_from = \"response_json:a+b+c+d+e\"", nil, "rules[0].cost_from: \"response_json:a+b+c+d+e\": at most 4 paths are summed"},
		{"an estimate without a response cost", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nwindow_seconds = 60\nestimate_from = \"request_header:x-max\"", nil, "rules[0].estimate_from: is read only beside a cost_from of the response"},
		{"a reserve without a response cost", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nwindow_seconds = 60\nreserve = 3", nil, "rules[0].reserve: is held only beside a cost_from of the response"},
		{"a reserve on a shared counter", "[[rules]]\nid = \"q\"\nscope = \"ip\"\nlimit = 5\nalgorithm = \"fixed_window\"\nwindow_seconds = 60\ncost_from = \"response_json:usage.total_tokens\"\nreserve = 3", nil, "rules[0].reserve: is held only on a caller's own counters"},
		{"a reserve past the capacity", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nwindow_seconds = 60\ncost_from = \"response_json:usage.total_tokens\"\nreserve = 6", nil, "rules[0].reserve: 6 must be in 0..5"},
		{"a negative reserve", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nwindow_seconds = 60\ncost_from = \"response_json:usage.total_tokens\"\nreserve = -1", nil, "rules[0].reserve: -1 must be in 0..5"},
		{"an estimate from the body", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nwindow_seconds = 60\ncost_from = \"response_json:usage.total_tokens\"\nestimate_from = \"request_body_bytes\"", nil, "rules[0].estimate_from: \"request_body_bytes\" must be request_header:<name>"},
		{"cost from a response header with capitals", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nwindow_seconds = 60\ncost_from = \"response_header:X-Usage\"", nil, "rules[0].cost_from:"},
		{"cost from a header with capitals", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nwindow_seconds = 60\ncost_from = \"request_header:X-Tokens\"", nil, "rules[0].cost_from:"},
		{"cost from somewhere else", "[[rules]]\nid = \"q\"\nscope = \"user\"\nlimit = 5\nalgorithm = \"fixed_window\"\nwindow_seconds = 60\ncost_from = \"query:tokens\"", nil, "rules[0].cost_from:"},
		{"jitter above 1", "retry_after_jitter = 1.5", nil, "retry_after_jitter:"},
		{"negative jitter", "", map[string]string{"TOLLGATE_RETRY_AFTER_JITTER": "-0.1"}, "retry_after_jitter"},
		{"in memory with replicas", "redis_enabled = false\nreplicas = 2", nil, "replicas: is 2, but redis_enabled = false"},
		{"in memory with penalties", "redis_enabled = false\n[penalties]\nenabled = true", nil, "penalties.enabled:"},
		{"in memory, not a boolean", "", map[string]string{"TOLLGATE_REDIS_ENABLED": "no"}, "TOLLGATE_REDIS_ENABLED:"},
		{"tls certificate without its key", `tls_cert_file = "/nonexistent/cert.pem"`, nil, "tls_key_file:"},
		{"client CA without a certificate", `tls_client_ca_file = "/nonexistent/ca.pem"`, nil, "tls_client_ca_file:"},
		{"tls files that do not load", "tls_cert_file = \"/nonexistent/cert.pem\"\ntls_key_file = \"/nonexistent/key.pem\"", nil, "tls_cert_file:"},
		{"unknown key", `lisen = "x"`, nil, "unknown setting lisen"},
		{"unknown nested key", "[lease]\nfractoin = 1", nil, "unknown setting lease.fractoin"},
		{"wrong type", `listen = 5`, nil, "listen"},
		{"malformed toml", `listen = "`, nil, "toml"},
		{"bad listen", `listen = "nowhere"`, nil, "listen:"},
		{"zero limit", "[[tiers]]\nname = \"free\"\nlimit = 0\nwindow_seconds = 60", nil, "tiers[0].limit:"},
		{"limit a double would round", "[[tiers]]\nname = \"free\"\nlimit = 9007199254740992\nwindow_seconds = 60", nil, "tiers[0].limit: 9007199254740992 must be in 1..9007199254740991"},
		{"huge burst", "[[tiers]]\nname = \"free\"\nlimit = 1\nwindow_seconds = 60\nburst = 9223372036854775807", nil, "tiers[0].burst:"},
		{"description with a newline", "[[tiers]]\nname = \"free\"\nlimit = 1\nwindow_seconds = 60\ndescription = \"a\\r\\nX-Injected: 1\"", nil, "tiers[0].description:"},
		{"long description", "[[tiers]]\nname = \"free\"\nlimit = 1\nwindow_seconds = 60\ndescription = \"" + strings.Repeat("d", 257) + "\"", nil, "tiers[0].description:"},
		{"rule priority", "[[rules]]\nid = \"x\"\nscope = \"user\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow_seconds = 1\npriority = 9223372036854775807", nil, "rules[0].priority:"},
		{"long window", "[[tiers]]\nname = \"free\"\nlimit = 1\nwindow_seconds = 3601", nil, "tiers[0].window_seconds:"},
		{"tier name", "[[tiers]]\nname = \"Free Tier\"\nlimit = 1\nwindow_seconds = 60", nil, "tiers[0].name:"},
		{"endpoint path", "[[tiers]]\nname = \"free\"\nlimit = 1\nwindow_seconds = 60\n[tiers.endpoints]\n\"api\" = 5", nil, `tiers[0].endpoints["api"]:`},
		{"endpoint limit", "[[tiers]]\nname = \"free\"\nlimit = 1\nwindow_seconds = 60\n[tiers.endpoints]\n\"/api\" = 0", nil, `tiers[0].endpoints["/api"]:`},
		{"default tier missing", `default_tier = "gold"`, nil, "default_tier:"},
		{"bad exemption", "[exemptions]\nips = [\"10.0.0.1\", \"banana\"]", nil, "exemptions.ips[1]:"},
		{"bad exempt user", "[exemptions]\nusers = [\"a\\r\\nb\"]", nil, "exemptions.users[0]:"},
		{"bad rule", "[[rules]]\nid = \"x\"\nscope = \"user\"\nalgorithm = \"leaky\"\nlimit = 1\nwindow_seconds = 1", nil, "rules[0].algorithm:"},
		{"rule tier unknown", "[[rules]]\nid = \"x\"\ntiers = [\"gold\"]\nscope = \"user\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow_seconds = 1", nil, "rules[0].tiers:"},
		{"multiplier", "[penalties]\nmultipliers = [1, 0]", nil, "penalties.multipliers[1]:"},
		{"violation threshold beyond the log", "[penalties]\nviolation_threshold = 1001", nil, "penalties.violation_threshold:"},
		{"endpoint with a trailing slash", "[[tiers]]\nname = \"free\"\nlimit = 1\nwindow_seconds = 60\n[tiers.endpoints]\n\"/api/v1/items/\" = 5", nil, `tiers[0].endpoints["/api/v1/items/"]: path pattern must be spelled as requests are normalised`},
		{"endpoint with an escape", "[[tiers]]\nname = \"free\"\nlimit = 1\nwindow_seconds = 60\n[tiers.endpoints]\n\"/api/v1/%69tems\" = 5", nil, `tiers[0].endpoints["/api/v1/%69tems"]: path pattern must be spelled`},
		{"rule path with a trailing slash", "[[rules]]\nid = \"x\"\npath = \"/api/v1/items/\"\nscope = \"user\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow_seconds = 1", nil, "rules[0].path:"},
		{"rule path with a double slash", "[[rules]]\nid = \"x\"\npath = \"/api//items\"\nscope = \"user\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow_seconds = 1", nil, "rules[0].path:"},
		{"rule path with parameters", "[[rules]]\nid = \"x\"\npath = \"/api/items;v=1\"\nscope = \"user\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow_seconds = 1", nil, "rules[0].path:"},
		{"env integer", "", map[string]string{"TOLLGATE_LEASE_MAX": "lots"}, "TOLLGATE_LEASE_MAX:"},
		{"env mode", "", map[string]string{"TOLLGATE_FAILURE_MODE": "yolo"}, "failure_mode:"},
		{"short admin token", "", map[string]string{"TOLLGATE_ADMIN_TOKEN": "a"}, "admin_token: is 1 bytes"},
		{"short decision token", "", map[string]string{"TOLLGATE_DECISION_TOKEN": "short"}, "decision_token[0]:"},
		{"short second decision token", "", map[string]string{"TOLLGATE_DECISION_TOKEN": strings.Repeat("k", 32) + ",x"}, "decision_token[1]:"},
		{"three decision tokens", "", map[string]string{"TOLLGATE_DECISION_TOKEN": strings.Repeat("k,", 2) + "k"}, "decision_token: at most two"},
		{"token with a space", "", map[string]string{"TOLLGATE_ADMIN_TOKEN": strings.Repeat("k", 32) + " x"}, "admin_token: must be printable"},
		{"public listen without decision token", `listen = "0.0.0.0:8081"`, nil, "decision_token: is required"},
		{"adhoc limit", "max_adhoc_limit = 0", nil, "max_adhoc_limit:"},
		{"numeric rule id", "[[rules]]\nid = \"12\"\nscope = \"user\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow_seconds = 1", nil, "rules[0].id: \"12\" is a number"},
		{"endpoint above its tier", "[[tiers]]\nname = \"free\"\nlimit = 5\nwindow_seconds = 60\n[tiers.endpoints]\n\"/api\" = 50", nil, `tiers[0].endpoints["/api"]: 50 is above the tier's limit (5)`},
		{"redis url of another scheme", `redis_url = "http://x"`, nil, "redis_url: redis url: unknown scheme"},
		{"redis url with an unknown parameter", `redis_url = "redis://127.0.0.1:6379/0?colour=red"`, nil, "redis_url: redis url: unknown parameter"},
		{"lease beyond a billion", "[lease]\nmax = 1000000001", nil, "lease.max:"},
		{"env integer beyond an int64", "", map[string]string{"TOLLGATE_MAX_BATCH": "99999999999999999999"}, "TOLLGATE_MAX_BATCH:"},
		{"path case", `path_case = "mixed"`, nil, "path_case:"},
		{"upper-case rule path with path_case insensitive", "path_case = \"insensitive\"\n[[rules]]\nid = \"x\"\npath = \"/API/items\"\nscope = \"user\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow_seconds = 1", nil, `rules[0].path: "/API/items" has upper-case letters`},
		{"upper-case endpoint with path_case insensitive", "path_case = \"insensitive\"\n[[tiers]]\nname = \"free\"\nlimit = 5\nwindow_seconds = 60\n[tiers.endpoints]\n\"/Api\" = 5", nil, `tiers[0].endpoints["/Api"]: "/Api" has upper-case`},
		{"upper-case key path with path_case insensitive", "path_case = \"insensitive\"\napi_key_required_paths = [\"/api/**\", \"/Admin/**\"]", nil, "api_key_required_paths[1]:"},
		{"example decision token", "", map[string]string{"TOLLGATE_DECISION_TOKEN": wire.ExampleDecisionToken}, "decision_token[0]: is the example placeholder"},
		{"rule path through a PHP script", "[[rules]]\nid = \"x\"\npath = \"/index.php/api/*\"\nscope = \"user\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow_seconds = 1", nil, `rules[0].path: "/index.php/api/*" has a PHP script segment before more path; paths are matched without it, so spell it "/api/*"`},
		{"decision token that is an admin token", "", map[string]string{"TOLLGATE_DECISION_TOKEN": strings.Repeat("d", 32), "TOLLGATE_ADMIN_TOKEN": "ops:" + strings.Repeat("d", 32)}, "decision_token[0]: is also an admin token (ops's)"},
		{"the next decision token that is an admin token", "", map[string]string{"TOLLGATE_DECISION_TOKEN": strings.Repeat("e", 32) + "," + strings.Repeat("d", 32), "TOLLGATE_ADMIN_TOKEN": strings.Repeat("d", 32)}, "decision_token[1]: is also an admin token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.toml), envOf(tt.env))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v; want an error containing %q", err, tt.want)
			}
		})
	}
}

// A token never appears in an error, which reaches logs.
func TestTokenErrorsDoNotQuoteTheToken(t *testing.T) {
	secret := "s3cret-but-too-short"
	_, err := Parse(nil, envOf(map[string]string{"TOLLGATE_DECISION_TOKEN": secret}))
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("error %v", err)
	}
}

func TestDecisionTokensAndLoopback(t *testing.T) {
	k1, k2 := strings.Repeat("a", 32), strings.Repeat("b", 40)
	for _, tc := range []struct {
		listen, tokens string
		ok             bool
	}{
		{"127.0.0.1:8081", "", true},
		{"[::1]:8081", "", true},
		{"localhost:8081", "", true},
		{"0.0.0.0:8081", "", false},
		{":8081", "", false},
		{"10.0.0.5:8081", "", false},
		{"0.0.0.0:8081", k1, true},
		{"0.0.0.0:8081", k1 + "," + k2, true},
	} {
		cfg, err := Parse(nil, envOf(map[string]string{"TOLLGATE_LISTEN": tc.listen, "TOLLGATE_DECISION_TOKEN": tc.tokens}))
		if (err == nil) != tc.ok {
			t.Errorf("listen %s tokens %d bytes: %v", tc.listen, len(tc.tokens), err)
			continue
		}
		if err == nil && strings.Join(cfg.DecisionTokens(), ",") != tc.tokens {
			t.Errorf("tokens %v", cfg.DecisionTokens())
		}
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tollgate.toml")
	if err := os.WriteFile(path, []byte(sample), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path, noEnv); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(filepath.Join(dir, "missing.toml"), noEnv); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte("failure_mode = 1"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path, noEnv); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("bad file error should name the file: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(sample))
	f.Add([]byte(`failure_mode = "fail_open"`))
	f.Add([]byte("[[tiers]]\nname = \"x\""))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data, noEnv)
		if err != nil {
			return
		}
		// Whatever parses must also validate as a whole.
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that Validate refuses: %v", err)
		}
	})
}

func TestUnknownEnv(t *testing.T) {
	got := UnknownEnv([]string{"TOLLGATE_LISTEN=x", "TOLLGATE_REDIS_ULR=redis://", "HOME=/root", "TOLLGATE_CONFIG=/etc/t.toml"})
	if len(got) != 1 || got[0] != "TOLLGATE_REDIS_ULR" {
		t.Fatalf("got %v", got)
	}
}

// Every single-valued setting of the file has its environment variable,
// named TOLLGATE_<FIELD> (dots as underscores), and the variable sets that
// field: the list the variables are read from and the settings cannot
// drift apart.
func TestEveryScalarSettingHasItsVariable(t *testing.T) {
	fields := map[string]reflect.Value{} // toml path -> field of a Default()
	cfg := Default()
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		for i := 0; i < v.NumField(); i++ {
			tag := v.Type().Field(i).Tag.Get("toml")
			f := v.Field(i)
			switch f.Kind() {
			case reflect.Struct:
				if v.Type().Field(i).Anonymous {
					walk(prefix, f) // an embedded section's fields are the file's own
					continue
				}
				walk(prefix+tag+".", f)
			case reflect.String, reflect.Int, reflect.Int64, reflect.Float64, reflect.Bool:
				fields[prefix+tag] = f
			}
		}
	}
	walk("", reflect.ValueOf(&cfg).Elem())
	named := map[string]bool{}
	for _, e := range Settings {
		named[e.Field] = true
		f, ok := fields[e.Field]
		if !ok {
			t.Errorf("%s sets %q, which is not a setting", e.Env, e.Field)
			continue
		}
		if want := "TOLLGATE_" + strings.ToUpper(strings.ReplaceAll(e.Field, ".", "_")); e.Env != want {
			t.Errorf("%s sets %s; name it %s", e.Env, e.Field, want)
		}
		// A value of the field's kind, spaced as people write them, and
		// what the field must hold after it.
		sample := map[reflect.Kind]struct {
			value string
			want  any
		}{
			reflect.String:  {" x ", " x "},
			reflect.Int:     {" 7", 7},
			reflect.Int64:   {"7 ", int64(7)},
			reflect.Float64: {"0.5", 0.5},
			reflect.Bool:    {"true", true},
		}[f.Kind()]
		value, want := sample.value, sample.want
		if err := e.set(&cfg, value); err != nil {
			t.Errorf("%s=%q: %v", e.Env, value, err)
			continue
		}
		got := f.Interface()
		if s, ok := got.(rules.Algorithm); ok {
			got = string(s)
		}
		if got != want {
			t.Errorf("%s=%q set %s to %v, want %v", e.Env, value, e.Field, got, want)
		}
	}
	for field := range fields {
		if !named[field] {
			t.Errorf("setting %s has no TOLLGATE_ variable", field)
		}
	}
}

// FuzzDecisionToken: whatever TOLLGATE_DECISION_TOKEN holds, the service
// either refuses it without quoting it (errors reach logs) or accepts one or
// two tokens, each long and printable, that are exactly what was given.
func FuzzDecisionToken(f *testing.F) {
	for _, s := range []string{"", strings.Repeat("a", 32), strings.Repeat("a", 32) + "," + strings.Repeat("b", 40), "short", "a,b,c", strings.Repeat("k", 32) + ", " + strings.Repeat("k", 32), wire.ExampleDecisionToken} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		cfg, err := Parse(nil, envOf(map[string]string{"TOLLGATE_DECISION_TOKEN": v}))
		if err != nil {
			if len(v) >= 16 && strings.Contains(err.Error(), v) {
				t.Fatalf("the error quotes the token: %v", err)
			}
			return
		}
		toks := cfg.DecisionTokens()
		if len(toks) > 2 || strings.Join(toks, ",") != v {
			t.Fatalf("%q read as %q", v, toks)
		}
		for _, tok := range toks {
			if len(tok) < MinTokenLen || strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r > '~' }) {
				t.Fatalf("accepted token %q", tok)
			}
		}
	})
}

// Each setting's declared default is what Default holds, and what
// -check-config prints for it.
func TestDefaultsAreTheDeclaredOnes(t *testing.T) {
	cfg := Default()
	for _, st := range Settings {
		if got := st.get(&cfg); got != st.Default {
			t.Errorf("%s: Default() holds %q, the declaration says %q", st.Field, got, st.Default)
		}
		if st.Secret && st.Value(&Config{AdminToken: "x", DecisionToken: "y"}) != "(set)" {
			t.Errorf("%s: a secret's value is printed", st.Field)
		}
	}
}

// docs/configuration.md's settings table is the one the declarations render: a setting
// added, renamed or re-documented in code shows there, or this fails.
func TestDocsListTheSettings(t *testing.T) {
	b, err := os.ReadFile("../../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- settings: begin (generated by config.SettingsTable) -->\n", "<!-- settings: end -->"
	_, rest, ok := strings.Cut(string(b), begin)
	table, _, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		t.Fatalf("docs/configuration.md lacks the %q ... %q block", begin, end)
	}
	if want := SettingsTable(); table != want {
		t.Fatalf("docs/configuration.md's settings table is stale; replace it with:\n%s", want)
	}
}

func TestRuleCountIsBounded(t *testing.T) {
	var b strings.Builder
	for i := 0; i <= policy.MaxRules; i++ {
		fmt.Fprintf(&b, "[[rules]]\nid = \"r%d\"\nscope = \"user\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow_seconds = 1\n", i)
	}
	if _, err := Parse([]byte(b.String()), noEnv); err == nil || !strings.Contains(err.Error(), "rules: at most 1000 rules") {
		t.Fatalf("%d rules: %v", policy.MaxRules+1, err)
	}
}
