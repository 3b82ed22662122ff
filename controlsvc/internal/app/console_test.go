package app_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// chromium finds the headless browser the console tests drive.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium is not installed: run 'make deps' (apt-get install -y chromium)")
	return ""
}

// browser starts headless Chromium for the test, with the flags this
// machine's closed network needs; a JavaScript dialog the page did not
// expect (an alert an injected script would raise) fails the test.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()), chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true),
		chromedp.WindowSize(1280, 900))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelC(); cancelA() })
	_ = chromedp.Listen(ctx, func(ev any) {
		if d, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			t.Errorf("the page opened a %s dialog: %q", d.Type, d.Message)
			go chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser: no timeout on this one
		t.Fatalf("start chromium: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// shots saves screenshots of the console's pages: into the test's temp
// dir, and into TOLLGATE_SCREENSHOTS when set (docs/console keeps a set).
type shots struct {
	t    *testing.T
	dirs []string
}

func (s *shots) take(ctx context.Context, name string) {
	s.t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		s.t.Fatalf("screenshot %s: %v", name, err)
	}
	for _, d := range s.dirs {
		if err := os.WriteFile(filepath.Join(d, name+".png"), png, 0o644); err != nil {
			s.t.Fatal(err)
		}
	}
}

// An operator's walkthrough in a real browser: sign in, make a tier and a
// rule (a refused field shown beside it), make a key and see it once,
// watch the overview count the checks, revoke the key, find it in the
// audit trail, look a caller up. Hostile strings (an identity, a tier
// description) are shown as text, never run.
func TestConsoleInABrowser(t *testing.T) {
	s := startService(t, "", nil)
	ctx := browser(t)
	sh := &shots{t: t, dirs: []string{t.TempDir()}}
	if d := os.Getenv("TOLLGATE_SCREENSHOTS"); d != "" {
		sh.dirs = append(sh.dirs, d)
	}
	const hostile = `<script>alert("x")</script><img src=x onerror=alert(1)>`
	text := func(sel string) string {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(sel))); err != nil {
			t.Fatalf("wait for %s: %v", sel, err)
		}
		v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return v
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	// A wrong token is refused and nothing is shown.
	run("open", chromedp.Navigate(s.base+"/console/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	sh.take(ctx, "signin")
	run("wrong token", chromedp.SendKeys(chromedp.CSS("#token"), "not-the-token"), chromedp.Click(chromedp.CSS("#signin-form button[type=submit]")))
	run("refused", chromedp.WaitVisible(chromedp.Search(`//p[@id="signin-error"][string-length(normalize-space()) > 0]`)))
	if msg := text("#signin-error"); !strings.Contains(msg, "refused") {
		t.Fatalf("a wrong token: %q", msg)
	}
	run("sign in", chromedp.SetValue(chromedp.CSS("#token"), adminToken), chromedp.Click(chromedp.CSS("#signin-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.CSS(`[data-metric="total"]`)))
	eval := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}
	stored := eval(`sessionStorage.getItem("tollgate.admin") + "|" + document.cookie + "|" + location.href`)
	if stored != adminToken+"||"+s.base+"/console/" {
		t.Fatalf("the token is kept as %q: want sessionStorage only, no cookie, nothing in the URL", stored)
	}

	// Rules and tiers: a tier with a hostile description, a rule; a bad
	// field's error shown beside it.
	run("rules page", chromedp.Navigate(s.base+"/console/#rules"), chromedp.WaitVisible(chromedp.CSS("#tier-form")))
	run("tier", chromedp.SendKeys(chromedp.CSS(`#tier-form [data-field="tier_id"]`), "3"),
		chromedp.SendKeys(chromedp.CSS(`#tier-form [data-field="name"]`), "gold"),
		chromedp.SendKeys(chromedp.CSS(`#tier-form [data-field="limit"]`), "20"),
		chromedp.SendKeys(chromedp.CSS(`#tier-form [data-field="window_seconds"]`), "60"),
		chromedp.SendKeys(chromedp.CSS(`#tier-form [data-field="description"]`), hostile),
		chromedp.Click(chromedp.CSS("#tier-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.Search(`//td[text()="gold"]`)))
	run("bad rule", chromedp.SetValue(chromedp.CSS(`#rule-form [data-field="tier_id"]`), "3"),
		chromedp.SendKeys(chromedp.CSS(`#rule-form [data-field="endpoint_pattern"]`), "/api/v1/search"),
		chromedp.SetValue(chromedp.CSS(`#rule-form [data-field="algorithm"]`), "sliding_window"),
		chromedp.SendKeys(chromedp.CSS(`#rule-form [data-field="limit"]`), "0"),
		chromedp.SendKeys(chromedp.CSS(`#rule-form [data-field="window_seconds"]`), "60"),
		chromedp.Click(chromedp.CSS("#rule-form button[type=submit]")))
	if msg := text(`#rule-form [data-field="limit"] + .field-error`); !strings.Contains(msg, "limit") && !strings.Contains(msg, "must") {
		t.Fatalf("the refused limit's error: %q", msg)
	}
	// A hostile pattern: refused, and the refusal (which quotes it) shown
	// as text.
	run("hostile pattern", chromedp.SetValue(chromedp.CSS(`#rule-form [data-field="endpoint_pattern"]`), "/api/"+hostile),
		chromedp.SetValue(chromedp.CSS(`#rule-form [data-field="limit"]`), "2"),
		chromedp.Click(chromedp.CSS("#rule-form button[type=submit]")),
		// The pattern's own error: the limit's, from the step before, stays
		// shown until this answer arrives, and a good rule sent meanwhile
		// would race it.
		chromedp.WaitVisible(chromedp.CSS(`#rule-form [data-field="endpoint_pattern"] + .field-error`)))
	run("good rule", chromedp.SetValue(chromedp.CSS(`#rule-form [data-field="endpoint_pattern"]`), "/api/v1/search"),
		chromedp.SetValue(chromedp.CSS(`#rule-form [data-field="limit"]`), "2"), chromedp.Click(chromedp.CSS("#rule-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.Search(`//td[text()="/api/v1/search"]`)))
	sh.take(ctx, "rules")

	// A key, shown once; checks with it; the overview counts them.
	run("keys page", chromedp.Navigate(s.base+"/console/#keys"), chromedp.WaitVisible(chromedp.CSS("#key-form")))
	run("create key", chromedp.SendKeys(chromedp.CSS(`#key-form [data-field="user_id"]`), hostile),
		chromedp.SetValue(chromedp.CSS(`#key-form [data-field="tier_id"]`), "3"),
		chromedp.Click(chromedp.CSS("#key-form button[type=submit]")))
	key := text("#new-key")
	if !strings.HasPrefix(key, "ak_live_") {
		t.Fatalf("the new key: %q", key)
	}
	sh.take(ctx, "keys")
	for i, want := range []int{200, 200, 429} {
		if r := s.check(map[string]any{"user_id": "ip:198.51.100.4", "endpoint": "/api/v1/search", "api_key": key}); r.status != want {
			t.Fatalf("check %d with the key: %d %s", i, r.status, r.body)
		}
	}
	if err := s.app.FlushUsage(context.Background()); err != nil {
		t.Fatal(err)
	}
	run("overview", chromedp.Navigate(s.base+"/console/#overview"), chromedp.WaitVisible(chromedp.CSS(`[data-metric="total"]`)))
	if total, throttled := text(`[data-metric="total"]`), text(`[data-metric="throttled"]`); total != "3" || throttled != "1" {
		t.Fatalf("the overview counts %s requests, %s throttled; want 3 and 1", total, throttled)
	}
	sh.take(ctx, "overview")
	// A page name is looked up as the console's own, never an object's
	// member (#constructor broke the page with a script error).
	for _, name := range []string{"constructor", "__proto__", "toString"} {
		run("#"+name, chromedp.Navigate(s.base+"/console/#"+name), chromedp.WaitVisible(chromedp.CSS(`[data-metric="total"]`)))
	}

	// Revoke it; the audit trail shows the change.
	run("revoke", chromedp.Navigate(s.base+"/console/#keys"), chromedp.WaitVisible(chromedp.CSS("[data-revoke]")),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[any](`window.confirm = () => true`)(ctx, tg)
			return err
		}),
		chromedp.Click(chromedp.CSS("[data-revoke]")),
		chromedp.WaitVisible(chromedp.Search(`//span[text()="revoked"]`)))
	if r := s.check(map[string]any{"user_id": "ip:198.51.100.5", "endpoint": "/api/v1/search", "api_key": key}); r.status != 403 {
		t.Fatalf("the revoked key: %d %s", r.status, r.body)
	}
	run("audit", chromedp.Navigate(s.base+"/console/#audit"), chromedp.WaitVisible(chromedp.Search(`//td[text()="api_key.revoke"]`)))
	sh.take(ctx, "audit")
	// A name with a character drawn as nothing (a variation selector,
	// accepted: emoji are made of them) is spelled out, never drawn as
	// the name without it (attack 53: users drawn as one "alice").
	// So are a space after a name, a no-break one, a name's combining marks
	// and the characters composing changes when it is not in composed form
	// (the Kelvin sign), and a backslash that would begin such a spelling
	// in a name typed so (attacks 56 F4, 57 B3, B4).
	for _, u := range []string{"alice\ufe0f", "alice ", "alice\u00a0", "zoe\u0301", `bob\u{FE0F}`, "\u212aim"} {
		if r := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": u}); r.status != 201 {
			t.Fatalf("a key for %q: %d %s", u, r.status, r.body)
		}
	}
	run("names spelled out", chromedp.Navigate(s.base+"/console/#overview"), chromedp.Navigate(s.base+"/console/#keys"),
		chromedp.WaitVisible(chromedp.Search(`//*[text()="alice\u{FE0F}"]`)),
		chromedp.WaitVisible(chromedp.Search(`//*[text()="alice\u{20}"]`)),
		chromedp.WaitVisible(chromedp.Search(`//*[text()="alice\u{A0}"]`)),
		chromedp.WaitVisible(chromedp.Search(`//*[text()="zoe\u{301}"]`)),
		chromedp.WaitVisible(chromedp.Search(`//*[text()="bob\u{5C}u{FE0F}"]`)),
		chromedp.WaitVisible(chromedp.Search(`//*[text()="\u{212A}im"]`)))

	// A caller looked up: its deciding counter.
	run("callers", chromedp.Navigate(s.base+"/console/#callers"), chromedp.WaitVisible(chromedp.CSS("#caller-form")),
		chromedp.SendKeys(chromedp.CSS(`#caller-form [data-field="user_id"]`), "ip:198.51.100.4"),
		chromedp.SendKeys(chromedp.CSS(`#caller-form [data-field="endpoint"]`), "/api/v1/items"),
		chromedp.Click(chromedp.CSS("#caller-form button[type=submit]")), chromedp.WaitVisible(chromedp.CSS("#reset")),
		chromedp.WaitVisible(chromedp.Search(`//td[text()="tier_free"]`)))
	sh.take(ctx, "callers")
	// A caller named ".." or an endpoint climbing out ("/../../api-keys")
	// stays in the status route: encodeURIComponent leaves dot segments as
	// they are, and the browser resolved them into another admin route
	// (attack 53). The URLs the page asks for are recorded as it builds them.
	eval(`window.__asked = []; { const f = window.fetch; window.fetch = (u, o) => { window.__asked.push(String(u)); return f(u, o); }; } ""`)
	run("callers climbing out", chromedp.SetValue(chromedp.CSS(`#caller-form [data-field="user_id"]`), ".."),
		chromedp.SetValue(chromedp.CSS(`#caller-form [data-field="endpoint"]`), "/../../api-keys"),
		chromedp.Click(chromedp.CSS("#caller-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.Search(`//form[@id="caller-form"]//p[@role="alert"][string-length(normalize-space()) > 0]`)))
	if asked := eval(`window.__asked.join(" ")`); !strings.Contains(asked, "/admin/v1/status/%2E%2E/%2E%2E/%2E%2E/api-keys") || strings.Contains(asked, "/..") {
		t.Fatalf("the console asked for %s", asked)
	}

	// A rule edited, another created and deleted.
	run("edit rule", chromedp.Navigate(s.base+"/console/#rules"), chromedp.WaitVisible(chromedp.Search(`//button[text()="Edit"]`)),
		chromedp.Click(chromedp.Search(`//button[text()="Edit"]`)),
		chromedp.SetValue(chromedp.CSS(`#rule-form [data-field="limit"]`), "7"),
		chromedp.Click(chromedp.CSS("#rule-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.Search(`//td[text()="7 / 60 s"]`)))
	run("delete rule", chromedp.SetValue(chromedp.CSS(`#rule-form [data-field="endpoint_pattern"]`), "/api/v1/gone"),
		chromedp.SetValue(chromedp.CSS(`#rule-form [data-field="limit"]`), "9"),
		chromedp.SetValue(chromedp.CSS(`#rule-form [data-field="window_seconds"]`), "60"),
		chromedp.Click(chromedp.CSS("#rule-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.Search(`//td[text()="/api/v1/gone"]`)),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[any](`window.confirm = () => true`)(ctx, tg)
			return err
		}),
		chromedp.Click(chromedp.Search(`//tr[td[text()="/api/v1/gone"]]//button[text()="Delete"]`)),
		chromedp.WaitNotPresent(chromedp.Search(`//td[text()="/api/v1/gone"]`)))

	// The hostile strings were shown as text: the page holds only its own
	// script, no element they made, and their text as typed.
	run("inert", chromedp.Navigate(s.base+"/console/#rules"), chromedp.WaitVisible(chromedp.Search(`//td[text()="gold"]`)),
		chromedp.SetValue(chromedp.CSS(`#rule-form [data-field="endpoint_pattern"]`), "/api/"+hostile),
		chromedp.SetValue(chromedp.CSS(`#rule-form [data-field="limit"]`), "2"),
		chromedp.SetValue(chromedp.CSS(`#rule-form [data-field="window_seconds"]`), "60"),
		chromedp.Click(chromedp.CSS("#rule-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.CSS(`#rule-form .field-error`)))
	if msg := text(`#rule-form .field-error`); msg == "" {
		t.Fatal("the refused pattern's error is not shown")
	} else {
		t.Logf("a hostile pattern is refused: %s", msg)
	}
	scripts, imgs, page := eval(`String(document.querySelectorAll("script").length)`), eval(`String(document.querySelectorAll("img").length)`), eval(`document.body.textContent`)
	if scripts != "1" || imgs != "0" || !strings.Contains(page, hostile) {
		t.Fatalf("hostile text: %s scripts, %s images, shown as text: %v", scripts, imgs, strings.Contains(page, hostile))
	}
}

// The console's answers carry the headers that keep it to its own origin.
func TestConsoleHeaders(t *testing.T) {
	s := startService(t, "", nil)
	for _, path := range []string{"/console/", "/console/console.js", "/console/console.css"} {
		resp, err := http.Get(s.base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		csp := resp.Header.Get("Content-Security-Policy")
		if resp.StatusCode != 200 || !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") ||
			!strings.Contains(csp, "frame-ancestors 'none'") || resp.Header.Get("X-Frame-Options") != "DENY" ||
			resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: %d %v", path, resp.StatusCode, resp.Header)
		}
	}
	// Only the embedded files: nothing beside or above them.
	for path, want := range map[string]int{"/console/../openapi.yaml": 404, "/console/%2e%2e/console.go": 404, "/console/nope.js": 404, "/console/assets/console.js": 404} {
		resp, err := http.Get(s.base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	resp, err := http.Post(s.base+"/console/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("POST: %d", resp.StatusCode)
	}
}
