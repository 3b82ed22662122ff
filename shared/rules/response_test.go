package rules

import (
	"strings"
	"testing"
)

// Every bad response names its field; nothing a client could choose can be
// written into one.
func TestResponseValidate(t *testing.T) {
	for _, tc := range []struct {
		r    Response
		want string // "" = valid
	}{
		{Response{}, ""},
		{Response{Status: 503, Body: `{"retry":{{retry_after}},"id":"{{request_id}}"}`, Headers: map[string]string{"content-type": "text/plain", "x-why": "quota"}}, ""},
		{Response{Status: 200}, "status: 200 must be 429, 403 or 503"},
		{Response{Status: 302}, "status:"},
		{Response{Body: strings.Repeat("b", MaxResponseBody+1)}, "body: is 4097 bytes"},
		{Response{Body: "{{identity}}"}, "body: {{identity}}"},
		{Response{Body: "{{limit"}, "body:"},
		{Response{Body: "{{ limit }}"}, "body:"},
		{Response{Headers: map[string]string{"Content-Type": "x"}}, `headers["Content-Type"]:`},
		{Response{Headers: map[string]string{"x-a": "b\r\nset-cookie: s=1"}}, `headers["x-a"]: the value must be printable`},
		{Response{Headers: map[string]string{"content-length": "0"}}, `headers["content-length"]: is set by the proxy`},
		{Response{Headers: map[string]string{"retry-after": "0"}}, `headers["retry-after"]`},
		{Response{Headers: map[string]string{"x-ratelimit-remaining": "999"}}, `headers["x-ratelimit-remaining"]`},
		{Response{Headers: map[string]string{":status": "200"}}, `headers[":status"]`},
		{Response{Headers: map[string]string{"x-a": strings.Repeat("v", 513)}}, `headers["x-a"]`},
		{Response{Body: strings.Repeat("<", 4000)}, "body: with the headers takes"},
		{Response{Headers: map[string]string{"x-tollgate-decision": "allowed"}}, `headers["x-tollgate-decision"]`},
		{Response{Headers: map[string]string{"refresh": "0;url=https://evil.example"}}, `headers["refresh"]`},
		{Response{Headers: map[string]string{"clear-site-data": `"*"`}}, `headers["clear-site-data"]`},
	} {
		err := tc.r.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v refused: %v", tc.r, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: got %v, want %q", tc.r, err, tc.want)
		}
	}
	many := Response{Headers: map[string]string{}}
	for i := range MaxResponseHeaders + 1 {
		many.Headers["x-"+strings.Repeat("a", i+1)] = "v"
	}
	if err := many.Validate(); err == nil || !strings.Contains(err.Error(), "headers:") {
		t.Errorf("17 headers: %v", err)
	}
	// Within a rule, the field is named under response.
	r := Rule{ID: "r", Scope: ScopeUser, Algorithm: GCRA, Limit: 1, WindowSeconds: 1, Response: &Response{Status: 200}}
	if err := r.Validate(); err == nil || !strings.Contains(err.Error(), "response.status:") {
		t.Errorf("rule with a bad response: %v", err)
	}
}

func TestResponseRender(t *testing.T) {
	r := Response{Body: `{"limit":{{limit}},"left":{{remaining}},"retry":{{retry_after}},"reset":{{reset_at}},"w":{{window_seconds}},"rule":"{{rule_id}}","s":"{{strategy}}","id":"{{request_id}}","x":"{{limit}}{{limit}}"}`}
	got := r.Render(ResponseValues{Limit: 10, Remaining: 0, RetryAfter: 7, ResetAt: 1800000000, WindowSeconds: 60, RuleID: "tier_free", Strategy: "gcra", RequestID: "abc"})
	want := `{"limit":10,"left":0,"retry":7,"reset":1800000000,"w":60,"rule":"tier_free","s":"gcra","id":"abc","x":"1010"}`
	if got != want {
		t.Fatalf("\n got %s\nwant %s", got, want)
	}
	hostile := (&Response{Body: `{"id":"{{request_id}}"}`}).Render(ResponseValues{RequestID: `x","admin":true,"y":"<script>` + strings.Repeat("a", 200)})
	id := strings.TrimSuffix(strings.TrimPrefix(hostile, `{"id":"`), `"}`)
	if len(id) != 128 || strings.ContainsAny(id, `"<>,\ `) || !strings.HasPrefix(id, "x___admin_:true__y_:__script_") {
		t.Fatalf("a hostile request id rendered as %s", hostile)
	}
	if (&Response{}).StatusCode() != 429 {
		t.Fatal("the default status is not 429")
	}
}

// FuzzResponseTemplate: whatever body Validate accepts renders with every
// field replaced and nothing else changed; Render never panics.
func FuzzResponseTemplate(f *testing.F) {
	f.Add("over {{limit}} {{retry_after}}")
	f.Add("{{{{limit}}}}")
	f.Add("{{limit}")
	f.Add("}}{{")
	f.Fuzz(func(t *testing.T, body string) {
		r := Response{Body: body}
		out := r.Render(ResponseValues{Limit: 5, RuleID: "r"})
		if r.Validate() != nil {
			return
		}
		for _, name := range ResponseFields {
			if strings.Contains(out, "{{"+name+"}}") && !strings.Contains(body, "{{{{"+name+"}}}}") {
				t.Fatalf("%q rendered %q with {{%s}} left", body, out, name)
			}
		}
		if !strings.Contains(body, "{{") && out != body {
			t.Fatalf("%q without fields rendered as %q", body, out)
		}
	})
}
