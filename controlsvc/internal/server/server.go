// Package server is the control service's HTTP face: the decision API, the
// admin API, /health and /metrics. Errors of every handler become the seed
// envelope in one place, handleError.
package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/admin"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/console"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/decision"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/leanhttp"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/metrics"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/audit"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/summary"
	"github.com/tollgate-rl/tollgate/shared/ascii"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// openAPI describes every route; a test validates real answers against it.
//
//go:embed openapi.yaml
var openAPI []byte

// Server holds the handlers' collaborators.
type Server struct {
	e     *echo.Echo
	svc   *decision.Service
	admin *admin.Service
	log   *slog.Logger
	now   func() time.Time
	set   atomic.Pointer[settings]
}

// Deps are the server's collaborators.
type Deps struct {
	Service *decision.Service
	Admin   *admin.Service
	Metrics *metrics.Metrics
	// Config is the configuration in force at start; SetConfig swaps in
	// the next.
	Config *config.Config
	Log    *slog.Logger
	Now    func() time.Time
}

// New builds the router.
func New(d Deps) *Server {
	s := &Server{e: echo.New(), svc: d.Service, admin: d.Admin, log: d.Log, now: d.Now}
	s.SetConfig(d.Config)
	e := s.e
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.Pre(dropOddRequestID)
	e.Use(middleware.RequestIDWithConfig(middleware.RequestIDConfig{Generator: newRequestID}))
	e.Use(middleware.Recover())
	e.Use(closeUncredentialed)

	decide := s.decisionCaller
	e.POST(wire.PathCheck, decide(s.check))
	e.POST(wire.PathBatchCheck, decide(jsonRoute(s, true, http.StatusOK, func(c echo.Context, req *wire.BatchCheckRequest) (wire.BatchCheckResponse, error) {
		return s.svc.Batch(c.Request().Context(), req, trustOf(c))
	})))
	e.POST(wire.PathCharge, decide(jsonRoute(s, true, http.StatusOK, func(c echo.Context, req *wire.ChargeRequest) (wire.ChargeResponse, error) {
		return s.svc.Charge(c.Request().Context(), req, trustOf(c))
	})))
	e.GET(wire.PathStatus+"/:id/*", decide(s.status))
	e.GET("/health", s.health)
	e.GET("/openapi.yaml", func(c echo.Context) error { return c.Blob(http.StatusOK, "application/yaml", openAPI) })
	// The operator's console: static files; everything it shows it reads
	// from the admin API with the admin token.
	e.GET("/console", func(c echo.Context) error { return c.Redirect(http.StatusMovedPermanently, console.Prefix) })
	e.Any(console.Prefix+"*", echo.WrapHandler(console.Handler()))
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(d.Metrics.Registry, promhttp.HandlerOpts{})))

	s.adminRoutes()
	return s
}

// adminRoutes registers the operator's routes. Each takes the admin
// middleware by itself: a group with an empty prefix would also put it in
// front of unknown paths (401 for a 404).
func (s *Server) adminRoutes() {
	e, operator := s.e, s.requireAdmin
	ctx := func(c echo.Context) context.Context { return c.Request().Context() }
	e.POST(wire.PathReset, operator(jsonRoute(s, true, http.StatusOK, func(c echo.Context, req *wire.ResetRequest) (wire.ResetResponse, error) {
		return s.svc.Reset(ctx(c), req)
	})))
	e.PUT(wire.PathConfig, operator(jsonRoute(s, true, http.StatusOK, func(c echo.Context, req *wire.ConfigRequest) (wire.ConfigResponse, error) {
		return s.svc.SetOverride(ctx(c), req)
	})))
	e.GET("/admin/v1/overrides", operator(readRoute(func(c echo.Context) (map[string]any, error) {
		if _, err := strictQuery(c); err != nil {
			return nil, err
		}
		all := s.svc.Overrides()
		return map[string]any{"overrides": all, "total": len(all)}, nil
	})))
	e.DELETE(wire.PathConfig, operator(deleteRoute(func(c echo.Context) error {
		var req wire.ResetRequest
		if err := s.decode(c, &req, true); err != nil {
			return err
		}
		return s.svc.DeleteOverride(ctx(c), &req)
	})))

	e.POST("/admin/v1/api-keys", operator(jsonRoute(s, true, http.StatusCreated, func(c echo.Context, req *admin.CreateKeyRequest) (admin.KeyView, error) {
		return s.admin.CreateKey(ctx(c), req)
	})))
	e.GET("/admin/v1/api-keys", operator(readRoute(func(c echo.Context) (admin.KeyList, error) {
		q, err := strictQuery(c, "user_id", "status", "cursor", "limit")
		if err != nil {
			return admin.KeyList{}, err
		}
		return s.admin.Keys(ctx(c), q["user_id"], q["status"], q["cursor"], q["limit"])
	})))
	e.GET("/admin/v1/api-keys/:id", operator(idRoute(s.admin.Key)))
	e.POST("/admin/v1/api-keys/:id/revoke", operator(idRoute(s.admin.RevokeKey)))

	e.GET("/admin/v1/rules", operator(readRoute(func(c echo.Context) (admin.RulesResponse, error) {
		if _, err := strictQuery(c); err != nil {
			return admin.RulesResponse{}, err
		}
		return s.admin.RuleSet(), nil
	})))
	const rulesPath = "/admin/v1/rate-limit-rules"
	e.POST(rulesPath, operator(jsonRoute(s, true, http.StatusCreated, func(c echo.Context, req *admin.RuleBody) (admin.RuleView, error) {
		return s.admin.CreateRule(ctx(c), req)
	})))
	e.GET(rulesPath, operator(readRoute(func(c echo.Context) (admin.RuleList, error) {
		q, err := strictQuery(c, "tier_id")
		if err != nil {
			return admin.RuleList{}, err
		}
		return s.admin.Rules(ctx(c), q["tier_id"])
	})))
	e.GET(rulesPath+"/:id", operator(idRoute(s.admin.Rule)))
	e.PUT(rulesPath+"/:id", operator(jsonRoute(s, true, http.StatusOK, func(c echo.Context, req *admin.RuleBody) (admin.RuleView, error) {
		return s.admin.UpdateRule(ctx(c), c.Param("id"), req)
	})))
	e.DELETE(rulesPath+"/:id", operator(deleteRoute(func(c echo.Context) error {
		return s.admin.DeleteRule(ctx(c), c.Param("id"))
	})))
	e.GET("/admin/v1/tiers", operator(readRoute(func(c echo.Context) (admin.TierList, error) {
		if _, err := strictQuery(c); err != nil {
			return admin.TierList{}, err
		}
		return s.admin.Tiers(ctx(c))
	})))
	e.PUT("/admin/v1/tiers/:id", operator(jsonRoute(s, true, http.StatusOK, func(c echo.Context, req *admin.TierBody) (admin.TierView, error) {
		return s.admin.PutTier(ctx(c), c.Param("id"), req)
	})))

	e.GET("/admin/v1/usage/:who", operator(readRoute(func(c echo.Context) (admin.UsageView, error) {
		who, err := url.PathUnescape(c.Param("who"))
		if err != nil {
			return admin.UsageView{}, apierr.Invalid("identity", "is not a valid path segment")
		}
		q, err := strictQuery(c, "window")
		if err != nil {
			return admin.UsageView{}, err
		}
		return s.admin.Usage(ctx(c), who, q["window"])
	})))
	e.GET("/admin/v1/metrics/summary", operator(readRoute(func(c echo.Context) (summary.View, error) {
		q, err := strictQuery(c, "window")
		if err != nil {
			return summary.View{}, err
		}
		return s.admin.Summary(ctx(c), q["window"])
	})))
	// A caller's counter as the decision API's status reads it, for an
	// operator (the console's caller lookup) with the admin token.
	e.GET("/admin/v1/status/:id/*", operator(func(c echo.Context) error {
		c.Set(trustKey, decision.Trusted)
		return s.status(c)
	}))
	e.GET("/admin/v1/audit", operator(readRoute(func(c echo.Context) (admin.AuditPage, error) {
		q, err := strictQuery(c, "type", "since", "limit")
		if err != nil {
			return admin.AuditPage{}, err
		}
		return s.admin.Audit(ctx(c), q["type"], q["since"], q["limit"])
	})))
}

// Handler is the server as an http.Handler.
func (s *Server) Handler() http.Handler { return s.e }

func (s *Server) check(c echo.Context) error {
	var req wire.CheckRequest
	if err := s.decode(c, &req, true); err != nil {
		return err
	}
	resp, err := s.svc.Check(c.Request().Context(), &req, trustOf(c))
	if err != nil {
		return err
	}
	bp := answerBufs.Get().(*[]byte)
	defer answerBufs.Put(bp)
	var hbuf [6][2]string
	status, headers, body := checkAnswer((*bp)[:0], hbuf[:0], &resp, requestID(c), s.set.Load().headers)
	*bp = body
	h := c.Response().Header()
	for _, kv := range headers {
		h.Set(kv[0], kv[1])
	}
	return c.Blob(status, echo.MIMEApplicationJSON, body)
}

// leanCheck is the decision route on the lean path (leanhttp): the same
// answer as check, without net/http's and echo's per-request work. A
// request it would answer with an error before deciding (a refused
// credential, a body the fast decoder does not take, one over
// max_body_bytes) it declines, and check answers it.
func (s *Server) leanCheck(ctx context.Context, r *leanhttp.Request, w *leanhttp.Response) bool {
	// Without a token, check answers (and refuses a browser's request:
	// refuseBrowser); with one, a request without it.
	digests := s.set.Load().decisionDigests
	a := r.Authorization
	if len(digests) == 0 || r.Authorizations != 1 || len(a) <= 7 || !wire.EqualFoldASCII(a[:7], "bearer ") || !digests.Trusted(a[7:]) {
		return false
	}
	trust := decision.Trusted
	var req wire.CheckRequest
	if int64(len(r.Body)) > s.set.Load().maxBodyBytes || wire.DecodeCheckRequest(r.Body, &req) != nil {
		return false
	}
	id := string(r.RequestID)
	if !clientRequestID(id) {
		id = newRequestID()
	}
	w.Header(echo.HeaderXRequestID, id)
	resp, err := s.svc.Check(ctx, &req, trust)
	if err != nil {
		status, body := s.errorAnswer(err, http.MethodPost, wire.PathCheck, id)
		b, _ := json.Marshal(wire.ErrorEnvelope{Error: body})
		w.Write(status, echo.MIMEApplicationJSON, append(b, '\n'))
		return true
	}
	bp := answerBufs.Get().(*[]byte)
	defer answerBufs.Put(bp)
	var hbuf [6][2]string
	status, headers, body := checkAnswer((*bp)[:0], hbuf[:0], &resp, id, s.set.Load().headers)
	*bp = body
	for _, kv := range headers {
		w.Header(kv[0], kv[1])
	}
	w.Write(status, echo.MIMEApplicationJSON, body)
	return true
}

// checkAnswer renders a decision: its status, its header fields (appended
// to hs) and its body (appended to b, newline-terminated as echo's JSON).
// An allowed check's answer is written without reflection.
func checkAnswer(b []byte, hs [][2]string, resp *wire.CheckResponse, requestID string, set wire.HeaderSet) (int, [][2]string, []byte) {
	hs = limitHeaders(hs, resp, set)
	if resp.Allowed {
		return http.StatusOK, hs, append(wire.AppendCheckResponse(b, resp), '\n')
	}
	hs = append(hs, [2]string{"retry-after", strconv.FormatInt(resp.RetryAfter, 10)})
	l := resp.Limits()
	exceeded := wire.Exceeded(&l)
	exceeded.RequestID = requestID
	body, _ := json.Marshal(struct {
		wire.CheckResponse
		Error wire.ErrorBody `json:"error"`
	}{*resp, exceeded})
	return http.StatusTooManyRequests, hs, append(append(b, body...), '\n')
}

var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// limitHeaders appends the X-RateLimit-* fields of a decision made by a
// rule (none for exempt or degraded answers, which no quota backs).
func limitHeaders(hs [][2]string, d *wire.CheckResponse, set wire.HeaderSet) [][2]string {
	if d.Limit <= 0 || d.Degraded {
		return hs
	}
	l := d.Limits()
	return wire.AppendHeaders(hs, &l, set, 0, !d.Allowed)
}

func (s *Server) status(c echo.Context) error {
	id, err := url.PathUnescape(c.Param("id"))
	if err != nil {
		return apierr.Invalid("user_id", "is not a valid path segment")
	}
	ep, err := url.PathUnescape(c.Param("*"))
	if err != nil {
		return apierr.Invalid("endpoint", "is not a valid path")
	}
	req := wire.StatusRequest{UserID: id, Endpoint: "/" + ep}
	if err := statusQuery(c.QueryParams(), &req); err != nil {
		return err
	}
	resp, err := s.svc.Status(c.Request().Context(), &req, trustOf(c))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, &resp)
}

// statusQuery reads the status route's query into req. A parameter it does
// not know, or one given twice, is refused rather than ignored: a status
// that silently answered for another counter would mislead.
// strictQuery reads an admin route's query as strictly as its bodies are
// read: a parameter given twice ("?type=admin&type=violation" was read as
// the first) or one the route does not take is refused, naming it.
func strictQuery(c echo.Context, names ...string) (map[string]string, error) {
	q, err := url.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		// A ';' or a bad escape: echo would drop the whole query, and the
		// route would answer as if no filter had been asked for.
		return nil, apierr.Invalid("query", "is malformed (a ';' or a bad escape)")
	}
	out := make(map[string]string, len(names))
	for name, vs := range q {
		switch {
		case !slices.Contains(names, name):
			return nil, apierr.Invalid(fmt.Sprintf("%.64s", name), "is not a query parameter of this route")
		case len(vs) > 1:
			return nil, apierr.Invalid(name, "is given more than once")
		}
		out[name] = vs[0]
	}
	return out, nil
}

func statusQuery(q url.Values, req *wire.StatusRequest) error {
	for name, vs := range q {
		if len(vs) > 1 {
			return apierr.Invalid("query", fmt.Sprintf("%.64q is given more than once", name))
		}
		v := vs[0]
		switch name {
		case "method":
			req.Method = v
		case "tier":
			req.Tier = v
		case "tenant":
			req.Tenant = v
		case "strategy":
			req.Strategy = v
		case "limit", "window_seconds":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return apierr.Invalid(name, "must be an integer")
			}
			if name == "limit" {
				req.Limit = &n
			} else {
				req.WindowSeconds = &n
			}
		default:
			// The name is the client's: quoted and clipped, under "query".
			return apierr.Invalid("query", fmt.Sprintf("%.64q is not a parameter of the status route (method, tier, tenant, strategy, limit, window_seconds)", name))
		}
	}
	return nil
}

// health reports each component; 503 when Redis does not answer. Without
// the admin credential it says only that (the status a load balancer reads):
// Redis's error text and the failure mode in force would tell an attacker
// when limits are open.
func (s *Server) health(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), time.Second)
	defer cancel()
	status, code := "healthy", http.StatusOK
	comps := map[string]string{"redis": "healthy", "rate_limiter": "healthy"}
	body := map[string]any{"components": comps, "timestamp": s.now().UTC().Format(time.RFC3339)}
	if s.set.Load().inMemory {
		comps["redis"] = "disabled" // every state in this process (redis_enabled = false)
	} else if err := s.svc.Ping(ctx); err != nil {
		status, code = "unhealthy", http.StatusServiceUnavailable
		comps["redis"] = "unhealthy"
		comps["rate_limiter"] = "degraded"
		body["errors"] = []string{"redis: " + err.Error()}
		body["failure_mode"] = s.set.Load().failureMode
	}
	if _, err := s.adminHolder(c); err != nil {
		return c.JSON(code, map[string]any{"status": status, "timestamp": body["timestamp"]})
	}
	comps["breaker"] = "closed"
	if s.svc.BreakerOpen() {
		comps["breaker"] = "open" // Redis calls are skipped: the failure mode answers
	}
	body["status"] = status
	return c.JSON(code, body)
}

// requireAdmin checks the admin credential.
func (s *Server) requireAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		holder, err := s.adminHolder(c)
		if err != nil {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="tollgate-admin"`)
			return err
		}
		// An operator's change runs to its end, audit entry included,
		// whether or not the client waits for the answer: on the
		// request's context, a client that reset its connection just
		// after sending a change had it stored and its audit entry (or
		// the announce to the other replicas) cancelled (attack 53: 107
		// rules created and 90 overrides set with no trace in the trail,
		// 85 changes answered 503 although stored). Every step is bounded
		// by the Redis client's timeouts.
		ctx := audit.WithActor(context.WithoutCancel(c.Request().Context()), holder)
		c.SetRequest(c.Request().WithContext(ctx))
		// No cache keeps an operator's answers: one carries a new API key.
		c.Response().Header().Set("Cache-Control", "no-store")
		credentialed(c)
		return next(c)
	}
}

// adminHolder returns the name of the admin credential the request
// presents, or the error that refuses it.
func (s *Server) adminHolder(c echo.Context) (string, error) {
	tokens := s.set.Load().adminTokens
	if len(tokens) == 0 {
		return "", apierr.New(apierr.KindUnauthorized, wire.CodeUnauthorized, "the admin API is disabled: set TOLLGATE_ADMIN_TOKEN")
	}
	// One credential header: with both, a proxy in front that checks
	// one of them could be shown one token while we act on the other.
	h := c.Request().Header
	both := len(h.Values("X-Admin-Token")) > 0 && len(h.Values("Authorization")) > 0
	got, repeated := onlyHeader(c, "X-Admin-Token")
	if got == "" && !repeated {
		got, repeated = bearer(c)
	}
	repeated = repeated || both
	holder := ""
	for _, t := range tokens {
		// Every token is compared, so the time taken does not say which
		// one matched.
		if tokenMatches(got, t.Token) && holder == "" {
			holder = t.Name
		}
	}
	if repeated || holder == "" {
		msg := "a valid admin token is required"
		if repeated {
			msg = "send the admin token once, in Authorization or X-Admin-Token: the request repeats its credential"
		}
		return "", apierr.New(apierr.KindUnauthorized, wire.CodeUnauthorized, msg)
	}
	return holder, nil
}

// closeUncredentialed closes a connection after answering a request that
// showed no credential (health probes, metrics, the console's files, any
// refused request) unless a route's credential check keeps it
// (credentialed): otherwise anyone who reaches the port could hold a
// connection idle for the idle timeout with one request (an outsider's
// attack held 7,466 of a listener's 7,500 from two addresses). The
// proxies' checks carry their credential and keep theirs; the lean route
// serves only those.
func closeUncredentialed(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		c.Response().Header().Set(echo.HeaderConnection, "close")
		return next(c)
	}
}

// credentialed keeps the connection of a request that showed a valid
// credential open for the next.
func credentialed(c echo.Context) { c.Response().Header().Del(echo.HeaderConnection) }

const trustKey = "tollgate.trust"

// decisionCaller checks the decision API's service credential. With tokens
// configured, a request without one of them is refused. Without tokens (the
// service then listens on loopback only) every caller is untrusted and may
// use the plain check shape only (no tier, tenant, cost, lease or refund).
func (s *Server) decisionCaller(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		digests := s.set.Load().decisionDigests
		if len(digests) == 0 {
			if err := refuseBrowser(c.Request()); err != nil {
				return err
			}
			c.Set(trustKey, decision.Untrusted)
			return next(c)
		}
		got, repeated := bearer(c)
		if !digests.Trusted([]byte(got)) {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="tollgate-decision"`)
			msg := "the decision API needs its service credential (Authorization: Bearer)"
			if repeated {
				msg = "send one Authorization header: the request repeats it"
			}
			return apierr.New(apierr.KindUnauthorized, wire.CodeUnauthorized, msg)
		}
		c.Set(trustKey, decision.Trusted)
		credentialed(c)
		return next(c)
	}
}

// refuseBrowser refuses, on a decision API without a token, what a web
// page can send: a request with an Origin (a browser's, which a page on
// any origin can make with a simple POST, spending any caller's quota) or
// whose Host is no loopback name (a page rebound to loopback by DNS, which
// could read the answers too). A filter or a local tool sends neither.
func refuseBrowser(r *http.Request) error {
	if r.Header.Get("Origin") != "" {
		return apierr.New(apierr.KindForbidden, wire.CodeForbidden, "the decision API without a decision token answers no browser (the request has an Origin)")
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if a, err := netip.ParseAddr(host); (err != nil || !a.IsLoopback()) && !strings.EqualFold(host, "localhost") {
		return apierr.New(apierr.KindForbidden, wire.CodeForbidden, "the decision API without a decision token answers loopback names only (Host "+strconv.Quote(r.Host)+")")
	}
	return nil
}

func trustOf(c echo.Context) decision.Trust {
	t, _ := c.Get(trustKey).(decision.Trust)
	return t
}

// bearer returns the token of the request's Bearer Authorization header
// ("" without one), and whether the header was repeated: then no token is
// returned. Picking one of several would be a guess, and whatever sits in
// front of the service may have read another (the filter refuses such
// requests from clients for the same reason).
func bearer(c echo.Context) (token string, repeated bool) {
	auth, repeated := onlyHeader(c, "Authorization")
	if len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
		return auth[7:], false
	}
	return "", repeated
}

// onlyHeader returns the value of a header sent once ("" when absent), or
// reports that it was sent more than once.
func onlyHeader(c echo.Context, name string) (value string, repeated bool) {
	switch vs := c.Request().Header.Values(name); len(vs) {
	case 0:
		return "", false
	case 1:
		return vs[0], false
	default:
		return "", true
	}
}

// tokenMatches compares in constant time. Hashing both sides first makes the
// comparison independent of the token's length too.
func tokenMatches(got, want string) bool {
	gh, wh := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return got != "" && subtle.ConstantTimeCompare(gh[:], wh[:]) == 1
}

// jsonRoute is the shape of a route with a JSON body: decode it into Req
// (strict: unknown fields refused), call, answer the result with status.
func jsonRoute[Req, Resp any](s *Server, strict bool, status int, call func(echo.Context, *Req) (Resp, error)) echo.HandlerFunc {
	return func(c echo.Context) error {
		var req Req
		if err := s.decode(c, &req, strict); err != nil {
			return err
		}
		resp, err := call(c, &req)
		if err != nil {
			return err
		}
		return c.JSON(status, &resp)
	}
}

// readRoute answers what call returns as JSON, 200.
func readRoute[Resp any](call func(echo.Context) (Resp, error)) echo.HandlerFunc {
	return func(c echo.Context) error {
		resp, err := call(c)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, &resp)
	}
}

// idRoute is a read about one thing named by its :id segment.
func idRoute[Resp any](call func(context.Context, string) (Resp, error)) echo.HandlerFunc {
	return readRoute(func(c echo.Context) (Resp, error) { return call(c.Request().Context(), c.Param("id")) })
}

// deleteRoute answers 204 once call succeeds.
func deleteRoute(call func(echo.Context) error) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := call(c); err != nil {
			return err
		}
		return c.NoContent(http.StatusNoContent)
	}
}

// statusOf is the HTTP status of each kind of error: the one place an error
// kind becomes a status.
var statusOf = [...]int{
	apierr.KindInternal:     http.StatusInternalServerError,
	apierr.KindInvalid:      http.StatusBadRequest,
	apierr.KindUnauthorized: http.StatusUnauthorized,
	apierr.KindForbidden:    http.StatusForbidden,
	apierr.KindNotFound:     http.StatusNotFound,
	apierr.KindConflict:     http.StatusConflict,
	apierr.KindTooLarge:     http.StatusRequestEntityTooLarge,
	apierr.KindUnavailable:  http.StatusServiceUnavailable,
}

// httpStatus is the status an error is answered with.
func httpStatus(ae *apierr.Error) int {
	if int(ae.Kind) < len(statusOf) {
		return statusOf[ae.Kind]
	}
	return http.StatusInternalServerError
}

// handleError is the one place errors become HTTP answers (the lean
// decision route renders them with errorAnswer too).
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	status, body := s.errorAnswer(err, c.Request().Method, c.Path(), requestID(c))
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(status)
		return
	}
	_ = c.JSON(status, wire.ErrorEnvelope{Error: body})
}

// errorAnswer is the status and envelope body of an error; a 5xx is logged.
func (s *Server) errorAnswer(err error, method, path, requestID string) (int, wire.ErrorBody) {
	var ae *apierr.Error
	var he *echo.HTTPError
	var status int
	switch {
	case errors.As(err, &ae):
		status = httpStatus(ae)
	case errors.As(err, &he):
		// An error echo raised itself (no route, wrong method): its status
		// stays echo's.
		ae, status = fromHTTPError(he), he.Code
	default:
		ae = apierr.Failed(err)
		status = httpStatus(ae)
	}
	if status >= 500 {
		s.log.Error("request failed", "method", method, "path", path, "status", status, "err", err, "request_id", requestID)
	}
	body := ae.Body()
	body.RequestID = requestID
	return status, body
}

func fromHTTPError(he *echo.HTTPError) *apierr.Error {
	switch he.Code {
	case http.StatusNotFound:
		return apierr.New(apierr.KindNotFound, wire.CodeNotFound, "no such route")
	case http.StatusMethodNotAllowed:
		return apierr.New(apierr.KindInvalid, wire.CodeMethodNotAllowed, "method not allowed on this route")
	case http.StatusRequestEntityTooLarge:
		return apierr.New(apierr.KindTooLarge, wire.CodePayloadTooLarge, "request body is too large")
	}
	if he.Code < 500 {
		return apierr.New(apierr.KindInvalid, wire.CodeInvalidInput, http.StatusText(he.Code))
	}
	e := apierr.Failed(he)
	e.Message = http.StatusText(he.Code)
	return e
}

func requestID(c echo.Context) string {
	return c.Response().Header().Get(echo.HeaderXRequestID)
}

// maxRequestID bounds a client's X-Request-Id (Envoy's are 36 bytes).
const maxRequestID = 128

// clientRequestID reports whether a client's X-Request-Id is kept: one of
// printable ASCII, at most maxRequestID bytes. Another is replaced (an
// outsider's 5 KB id came back in every answer and log line).
func clientRequestID(id string) bool { return ascii.Printable.Match(id, 1, maxRequestID) }

// dropOddRequestID removes an X-Request-Id that is not kept, before the
// request ID middleware would echo it.
func dropOddRequestID(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Request().Header
		if vs := h.Values(echo.HeaderXRequestID); len(vs) > 0 && (len(vs) > 1 || !clientRequestID(vs[0])) {
			h.Del(echo.HeaderXRequestID)
		}
		return next(c)
	}
}

// newRequestID names a request in its answer and in the logs: a random
// per-process prefix and a counter, 32 hex digits, cheap enough for the
// decision route (echo's default draws 32 random characters a request).
func newRequestID() string {
	var b [32]byte
	hex.Encode(b[:16], requestIDPrefix[:])
	binary.BigEndian.PutUint64(b[24:], requestIDs.Add(1))
	hex.Encode(b[16:], b[24:])
	return string(b[:])
}

var (
	requestIDPrefix = func() (p [8]byte) { _, _ = rand.Read(p[:]); return p }()
	requestIDs      atomic.Uint64
)

// LeanServer serves the decision route on the lean path (leanhttp) and
// every other request through fallback, whose handler is Handler.
func (s *Server) LeanServer(fallback *http.Server) *leanhttp.Server {
	return &leanhttp.Server{Path: wire.PathCheck, Handle: s.leanCheck, Fallback: fallback, Log: s.log,
		ReadHeaderTimeout: fallback.ReadHeaderTimeout, IdleTimeout: fallback.IdleTimeout}
}
