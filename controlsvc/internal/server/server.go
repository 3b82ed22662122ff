// Package server is the control service's HTTP face: the decision API, the
// admin API, /health and /metrics. Errors of every handler become the seed
// envelope in one place, handleError.
package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/apikeys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/decision"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/metrics"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Server holds the handlers' collaborators.
type Server struct {
	e    *echo.Echo
	svc  *decision.Service
	keys *apikeys.Store
	rdb  redis.UniversalClient
	m    *metrics.Metrics
	log  *slog.Logger
	now  func() time.Time
}

// Deps are the server's collaborators.
type Deps struct {
	Service *decision.Service
	Keys    *apikeys.Store
	Redis   redis.UniversalClient
	Metrics *metrics.Metrics
	Log     *slog.Logger
	Now     func() time.Time
}

// New builds the router.
func New(d Deps) *Server {
	s := &Server{e: echo.New(), svc: d.Service, keys: d.Keys, rdb: d.Redis, m: d.Metrics, log: d.Log, now: d.Now}
	e := s.e
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.Use(middleware.RequestID())
	e.Use(middleware.Recover())

	decide := s.decisionCaller
	e.POST(wire.PathCheck, decide(s.check))
	e.POST(wire.PathBatchCheck, decide(s.batch))
	e.GET(wire.PathStatus+"/:id/*", decide(s.status))
	e.GET("/health", s.health)
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(d.Metrics.Registry, promhttp.HandlerOpts{})))

	// Admin routes take the middleware one by one: a group with an empty
	// prefix would also put it in front of unknown paths (401 for a 404).
	admin := s.requireAdmin
	e.POST(wire.PathReset, admin(s.reset))
	e.PUT(wire.PathConfig, admin(s.setConfig))
	e.POST("/admin/v1/api-keys", admin(s.createKey))
	e.GET("/admin/v1/api-keys/:id", admin(s.getKey))
	e.POST("/admin/v1/api-keys/:id/revoke", admin(s.revokeKey))
	e.GET("/admin/v1/rules", admin(s.listRules))
	return s
}

// Handler is the server as an http.Handler.
func (s *Server) Handler() http.Handler { return s.e }

func (s *Server) check(c echo.Context) error {
	var req wire.CheckRequest
	if err := s.decode(c, &req, false); err != nil {
		return err
	}
	resp, err := s.svc.Check(c.Request().Context(), &req, trustOf(c))
	if err != nil {
		return err
	}
	setLimitHeaders(c.Response().Header(), &resp)
	if !resp.Allowed {
		c.Response().Header().Set("Retry-After", strconv.FormatInt(resp.RetryAfter, 10))
		l := resp.Limits()
		body := wire.Exceeded(&l)
		body.RequestID = requestID(c)
		return c.JSON(http.StatusTooManyRequests, struct {
			wire.CheckResponse
			Error wire.ErrorBody `json:"error"`
		}{resp, body})
	}
	return c.JSON(http.StatusOK, &resp)
}

// setLimitHeaders writes the X-RateLimit-* fields of a decision made by a
// rule (none for exempt or degraded answers, which no quota backs).
func setLimitHeaders(h http.Header, d *wire.CheckResponse) {
	if d.Limit <= 0 || d.Degraded {
		return
	}
	l := d.Limits()
	var buf [4][2]string
	for _, kv := range wire.AppendHeaders(buf[:0], &l, wire.HeaderSet{XRateLimit: true, Strategy: true}, 0, !d.Allowed) {
		h.Set(kv[0], kv[1])
	}
}

func (s *Server) batch(c echo.Context) error {
	var req wire.BatchCheckRequest
	if err := s.decode(c, &req, false); err != nil {
		return err
	}
	resp, err := s.svc.Batch(c.Request().Context(), &req, trustOf(c))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, &resp)
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
	q := c.QueryParams()
	req := wire.CheckRequest{UserID: id, Endpoint: "/" + ep, Method: q.Get("method"), Tier: q.Get("tier"), Tenant: q.Get("tenant")}
	resp, err := s.svc.Status(c.Request().Context(), &req, trustOf(c))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, &resp)
}

func (s *Server) reset(c echo.Context) error {
	var req wire.ResetRequest
	if err := s.decode(c, &req, true); err != nil {
		return err
	}
	resp, err := s.svc.Reset(c.Request().Context(), &req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, &resp)
}

func (s *Server) setConfig(c echo.Context) error {
	var req wire.ConfigRequest
	if err := s.decode(c, &req, true); err != nil {
		return err
	}
	resp, err := s.svc.SetOverride(c.Request().Context(), &req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, &resp)
}

func (s *Server) listRules(c echo.Context) error {
	p := s.svc.Policy()
	return c.JSON(http.StatusOK, map[string]any{"version": p.Rules.Version(), "rules": p.Rules.Rules(), "tiers": p.Config.Tiers, "default_tier": p.Config.DefaultTier})
}

// health reports each component; 503 when Redis does not answer.
func (s *Server) health(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), time.Second)
	defer cancel()
	status, code := "healthy", http.StatusOK
	comps := map[string]string{"redis": "healthy", "rate_limiter": "healthy"}
	body := map[string]any{"components": comps, "timestamp": s.now().UTC().Format(time.RFC3339)}
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		status, code = "unhealthy", http.StatusServiceUnavailable
		comps["redis"] = "unhealthy"
		comps["rate_limiter"] = "degraded"
		body["errors"] = []string{"redis: " + err.Error()}
		body["failure_mode"] = s.svc.Policy().Config.FailureMode
	}
	body["status"] = status
	return c.JSON(code, body)
}

// requireAdmin checks the admin credential.
func (s *Server) requireAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		want := s.svc.Policy().Config.AdminToken
		if want == "" {
			return apierr.New(http.StatusUnauthorized, wire.CodeUnauthorized, "the admin API is disabled: set TOLLGATE_ADMIN_TOKEN")
		}
		got, repeated := onlyHeader(c, "X-Admin-Token")
		if got == "" && !repeated {
			got, repeated = bearer(c)
		}
		if repeated || !tokenMatches(got, want) {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="tollgate-admin"`)
			msg := "a valid admin token is required"
			if repeated {
				msg = "send the admin token once: the request repeats its credential header"
			}
			return apierr.New(http.StatusUnauthorized, wire.CodeUnauthorized, msg)
		}
		return next(c)
	}
}

const trustKey = "tollgate.trust"

// decisionCaller checks the decision API's service credential. With tokens
// configured, a request without one of them is refused. Without tokens (the
// service then listens on loopback only) every caller is untrusted and may
// use the seed's plain check shape only.
func (s *Server) decisionCaller(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		digests := s.svc.Policy().DecisionTokenDigests()
		if len(digests) == 0 {
			c.Set(trustKey, decision.Untrusted)
			return next(c)
		}
		got, repeated := bearer(c)
		gh := sha256.Sum256([]byte(got))
		ok := 0
		for i := range digests {
			// Every token is compared, so the time taken does not say which
			// one (or whether the first) matched.
			ok |= subtle.ConstantTimeCompare(gh[:], digests[i][:])
		}
		if got == "" || ok != 1 {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="tollgate-decision"`)
			msg := "the decision API needs its service credential (Authorization: Bearer)"
			if repeated {
				msg = "send one Authorization header: the request repeats it"
			}
			return apierr.New(http.StatusUnauthorized, wire.CodeUnauthorized, msg)
		}
		c.Set(trustKey, decision.Trusted)
		return next(c)
	}
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

// handleError is the one place errors become HTTP answers.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var ae *apierr.Error
	var he *echo.HTTPError
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &he):
		ae = fromHTTPError(he)
	default:
		ae = &apierr.Error{Status: http.StatusInternalServerError, Code: wire.CodeInternal, Message: "internal error", Err: err}
	}
	if ae.Status >= 500 {
		s.log.Error("request failed", "method", c.Request().Method, "path", c.Path(), "status", ae.Status, "err", err, "request_id", requestID(c))
	}
	for k, v := range ae.Headers {
		c.Response().Header().Set(k, v)
	}
	body := ae.Body()
	body.RequestID = requestID(c)
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(ae.Status)
		return
	}
	_ = c.JSON(ae.Status, wire.ErrorEnvelope{Error: body})
}

func fromHTTPError(he *echo.HTTPError) *apierr.Error {
	msg := http.StatusText(he.Code)
	switch he.Code {
	case http.StatusNotFound:
		return apierr.New(he.Code, wire.CodeNotFound, "no such route")
	case http.StatusMethodNotAllowed:
		return apierr.New(he.Code, wire.CodeInvalidInput, "method not allowed on this route")
	case http.StatusRequestEntityTooLarge:
		return apierr.New(he.Code, wire.CodePayloadTooLarge, "request body is too large")
	}
	if he.Code < 500 {
		return apierr.New(he.Code, wire.CodeInvalidInput, msg)
	}
	return &apierr.Error{Status: he.Code, Code: wire.CodeInternal, Message: msg, Err: he}
}

func requestID(c echo.Context) string {
	return c.Response().Header().Get(echo.HeaderXRequestID)
}
