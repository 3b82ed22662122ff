package filtertest

import (
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/wasmhost"
)

// Hostile headers neither crash the VM nor become identities.
func TestHostileHeaders(t *testing.T) {
	e := newEnv(t, jwtConfig(false), 1)
	big := strings.Repeat("A", 10_000)
	for _, h := range []wasmhost.Headers{
		{{"authorization", "Bearer " + big}},
		{{"authorization", "Bearer " + big + "." + big + "." + big}},
		{{"authorization", "Bearer {}.{}.{}"}},
		{{"x-api-key", big}},
		{{"x-api-key", "tg_}{evil\r\nx: y"}},
		{{"x-forwarded-for", big}},
		{{"x-forwarded-for", "\r\n, {{}}, 10.0.0.1"}},
	} {
		_, act := e.start(req{headers: h})
		if act != wasmhost.Pause {
			t.Fatalf("%.60v: action %v", h, act)
		}
		_, body := e.callout(0)
		if body.UserID != "ip:198.51.100.7" || len(body.APIKey) > 256 {
			t.Fatalf("%.60v: identity %q, key of %d bytes", h, body.UserID, len(body.APIKey))
		}
		e.answer(0, "200", decision(true, 1, 0, 0))
	}
	if err := e.vms[0].Broken(); err != nil {
		t.Fatal(err)
	}
}
