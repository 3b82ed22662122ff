package decision

import (
	"encoding/json"
	"testing"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/paths"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

func testPolicy(t testing.TB) *view {
	t.Helper()
	cfg := config.Default()
	p, err := policy.Compile(&cfg.Spec, "test")
	if err != nil {
		t.Fatal(err)
	}
	return &view{Policy: p, Settings: SettingsOf(&cfg)}
}

// FuzzValidate: whatever a check says, validate never panics; an untrusted
// caller gets through only with the seed's plain shape; and what passes is
// bounded: a canonical endpoint, a cost the counter can hold, an ad-hoc limit
// within max_adhoc_limit.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{
		`{"user_id":"alice","endpoint":"/api/v1/items"}`,
		`{"user_id":"key:k1","endpoint":"/api/v1/%69tems","tier":"premium","cost":5,"lease":10,"returned":3}`,
		`{"user_id":"ip:10.0.0.1","endpoint":"/a//b/./c;x?q","strategy":"sliding_log","limit":1000000,"window_seconds":3600,"cost":1000000}`,
		`{"user_id":"user:a}{b","endpoint":"/","tenant":"acme","method":"GET","limit":9223372036854775807}`,
		`{"user_id":"alice","endpoint":"/x","method":"POST","method_override":"DELETE","override_only":true,"lease":5}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	p := testPolicy(f)
	f.Fuzz(func(t *testing.T, body []byte, trusted bool) {
		var req wire.CheckRequest
		if json.Unmarshal(body, &req) != nil {
			return
		}
		c, aerr := p.validate(&req, Trust(trusted))
		if aerr != nil {
			if !aerr.Kind.ClientError() || aerr.Code == "" {
				t.Fatalf("refusal %+v is not a client error with a code", aerr)
			}
			return
		}
		if !trusted && (req.Tier != "" || req.Tenant != "" || req.Cost > 1 || req.Lease != 0 || req.Returned != 0 || req.OverrideOnly || c.id.Kind == identity.KindKey) {
			t.Fatalf("an untrusted caller got through with %+v", req)
		}
		if n, err := paths.Normalize(c.endpoint); err != nil || n != c.endpoint || len(c.endpoint) > paths.MaxLen {
			t.Fatalf("endpoint %q is not canonical", c.endpoint)
		}
		if c.overrideOnly && (c.lease != 0 || c.methodOverride == "" || c.methodOverride == c.method || c.adhoc != nil) {
			t.Fatalf("an override-only check with %+v", c)
		}
		if c.cost < 1 || c.cost > MaxCost || c.lease < 0 || c.lease > p.Lease.Max || c.returned < 0 || c.returned > MaxReturned {
			t.Fatalf("unbounded amounts: %+v", c)
		}
		if r := c.adhoc; r != nil && (r.Limit < 1 || r.Limit > p.MaxAdhocLimit || c.cost > r.Capacity()) {
			t.Fatalf("ad-hoc rule %+v with cost %d", r, c.cost)
		}
	})
}
