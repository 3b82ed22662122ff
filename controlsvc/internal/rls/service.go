package rls

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/credential"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/decision"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/shared/breaker"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/paths"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Bounds on one call: what a caller holding the token may make the service
// do. A larger call is refused whole (InvalidArgument naming the field),
// never cut.
const (
	MaxDescriptors = 64
	MaxEntries     = 16
	// maxQueryOverrides is how many distinct _method values of the path's
	// query a descriptor gains beside its own entries (two that disagree
	// refuse the check).
	maxQueryOverrides = 2
	MaxKeyLen         = 256
	MaxValueLen       = 1024
	// MaxHitsAddend bounds hits_addend (request and descriptor): a billion
	// hits in one call is no request a proxy makes.
	MaxHitsAddend = 1 << 30
)

// TollgateDomain is the domain whose descriptors Tollgate's own rules,
// tiers, API keys and overrides decide (see tollgateCheck).
const TollgateDomain = "tollgate"

// Entry keys of the tollgate domain.
const (
	KeyRemoteAddress = "remote_address" // Envoy's remote_address action
	KeyUser          = "tollgate.user"
	KeyAPIKey        = "tollgate.api_key"
	KeyPath          = "tollgate.path"
	KeyMethod        = "tollgate.method"
	// KeyMethodOverride is a method override header's value
	// (X-HTTP-Method-Override, X-Method-Override, X-HTTP-Method), one
	// entry per header: the request counts under the method it names too,
	// as the filter counts it (method_override = count).
	KeyMethodOverride = "tollgate.method_override"
	KeyTier           = "tollgate.tier"
	KeyTenant         = "tollgate.tenant"
)

var tollgateKeys = []string{KeyRemoteAddress, KeyUser, KeyAPIKey, KeyPath, KeyMethod, KeyMethodOverride, KeyTier, KeyTenant}

// Counters counts: Count for envoyproxy/ratelimit's fixed window, Do for the
// other algorithms (the limiter).
type Counters interface {
	CountAsync(ctx context.Context, key string, hits, windowSeconds int64) (*limiter.PendingCount, error)
	DoAsync(ctx context.Context, r limiter.Request) (*limiter.PendingDo, error)
}

// Checker decides a check with Tollgate's model (decision.Service).
type Checker interface {
	Check(ctx context.Context, req *wire.CheckRequest, trust decision.Trust) (wire.CheckResponse, error)
}

// Observer sees every descriptor's outcome (metrics).
type Observer interface {
	RLSDecision(domain, code string)
}

// Deps are the service's collaborators.
type Deps struct {
	Counters Counters
	Checker  Checker
	// Local counts while Redis cannot be reached and the failure mode is
	// fail_open (memlimit, shared with the decision service).
	Local   decision.LocalCounters
	Observe Observer
	Log     *slog.Logger
	Now     func() time.Time
	// BreakerThreshold consecutive Redis failures stop Redis calls for
	// BreakerCooldown (the decision API's setting).
	BreakerThreshold int
	BreakerCooldown  time.Duration
}

// Settings are what the service reads of the configuration in force.
type Settings struct {
	// Digests are the SHA-256 of the decision tokens; none: every caller is
	// untrusted (the listener is then on loopback, which config enforces).
	Digests credential.Digests
	// FailOpen answers OK when Redis fails; otherwise Unavailable.
	FailOpen bool
	Headers  wire.HeaderSet
	// Disabled answers every descriptor OK without counting (enabled =
	// false).
	Disabled bool
	// Shadow answers nothing OVER_LIMIT (shadow_mode): everything is
	// counted, and refusals are reported only in metrics.
	Shadow bool
}

// Service serves envoy.service.ratelimit.v3.RateLimitService.
type Service struct {
	rlspb.UnimplementedRateLimitServiceServer
	d       Deps
	cfg     atomic.Pointer[Config]
	set     atomic.Pointer[Settings]
	breaker *breaker.Breaker
}

// New returns a service answering from cfg (nil: only the tollgate domain
// has limits).
func New(d Deps, cfg *Config, set Settings) *Service {
	s := &Service{d: d, breaker: breaker.New(d.BreakerThreshold, int64(d.BreakerCooldown))}
	s.SetConfig(cfg)
	s.SetSettings(set)
	return s
}

// SetConfig swaps in a configuration (reload).
func (s *Service) SetConfig(c *Config) {
	if c == nil {
		c = &Config{domains: map[string]*node{}}
	}
	s.cfg.Store(c)
}

// SetSettings swaps in the settings (reload).
func (s *Service) SetSettings(set Settings) { s.set.Store(&set) }

// Config is the configuration in force.
func (s *Service) Config() *Config { return s.cfg.Load() }

// ShouldRateLimit implements the protocol.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	set := s.set.Load()
	trust, err := authorize(ctx, set.Digests)
	if err != nil {
		return nil, err
	}
	hits, entries, err := validate(req)
	if err != nil {
		return nil, err
	}
	if req.Domain != TollgateDomain {
		if set.Disabled {
			return disabledAnswer(req), nil
		}
		resp, err := s.configured(ctx, req, entries, hits, set)
		if err != nil {
			return nil, err
		}
		if set.Shadow {
			resp.OverallCode = rlspb.RateLimitResponse_OK
		}
		return resp, nil
	}
	// The tollgate domain is decided as the decision API decides a check,
	// with enabled = false (nothing counted, answered as exempt) and in
	// shadow mode alike: API keys are access control, not rate limiting,
	// and a request refused for its key stays refused (until 2026-11-26
	// both modes answered it OK: an outsider's keyless and forged-key calls
	// passed api_key_required_paths).
	resp, refusedInput, err := s.tollgate(ctx, req, entries, hits, trust, set)
	if err != nil {
		return nil, err
	}
	if set.Disabled {
		resp.ResponseHeadersToAdd = slices.DeleteFunc(resp.ResponseHeadersToAdd, func(h *corev3.HeaderValue) bool { return h.Key != refusedHeader })
	}
	if set.Shadow && !refusedInput {
		resp.OverallCode = rlspb.RateLimitResponse_OK
	}
	return resp, nil
}

// refusedHeader names why the tollgate domain refused a check for what the
// client sent (its path, method or API key).
const refusedHeader = "x-tollgate-refused"

// disabledAnswer admits every descriptor, counting nothing (enabled =
// false).
func disabledAnswer(req *rlspb.RateLimitRequest) *rlspb.RateLimitResponse {
	resp := &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: make([]*rlspb.RateLimitResponse_DescriptorStatus, len(req.Descriptors))}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
	}
	return resp
}

// Tap refuses a call without the decision token (when tokens are set)
// before grpc-go reads its message or starts a handler for it.
func (s *Service) Tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	digests := s.set.Load().Digests
	if len(digests) == 0 {
		return ctx, nil
	}
	md := metadata.MD(info.Header)
	if _, err := authorize(metadata.NewIncomingContext(ctx, md), digests); err != nil {
		return ctx, err
	}
	return ctx, nil
}

// authorize checks the decision token in the call's metadata
// (authorization: Bearer <token>), in constant time over every digest.
func authorize(ctx context.Context, digests credential.Digests) (decision.Trust, error) {
	if len(digests) == 0 {
		return decision.Untrusted, nil
	}
	vals := metadata.ValueFromIncomingContext(ctx, "authorization")
	if len(vals) != 1 {
		msg := "metadata authorization: the rate limit service needs the decision token (authorization: Bearer <token>)"
		if len(vals) > 1 {
			msg = "metadata authorization: given more than once"
		}
		return decision.Untrusted, status.Error(codes.Unauthenticated, msg)
	}
	tok, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok || !digests.Trusted([]byte(tok)) {
		return decision.Untrusted, status.Error(codes.Unauthenticated, "metadata authorization: not a decision token of this service")
	}
	return decision.Trusted, nil
}

// validate bounds the request and returns each descriptor's hits and
// entries.
func validate(req *rlspb.RateLimitRequest) ([]int64, [][]Entry, error) {
	bad := func(field, msg string) error {
		return status.Error(codes.InvalidArgument, field+": "+msg)
	}
	switch {
	case req.Domain == "":
		return nil, nil, bad("domain", "empty")
	case len(req.Domain) > MaxValueLen:
		return nil, nil, bad("domain", fmt.Sprintf("longer than %d bytes", MaxValueLen))
	case len(req.Descriptors) == 0:
		return nil, nil, bad("descriptors", "empty")
	case len(req.Descriptors) > MaxDescriptors:
		return nil, nil, bad("descriptors", fmt.Sprintf("%d descriptors, more than %d", len(req.Descriptors), MaxDescriptors))
	case req.HitsAddend > MaxHitsAddend:
		return nil, nil, bad("hits_addend", fmt.Sprintf("%d is more than %d", req.HitsAddend, MaxHitsAddend))
	}
	hits := make([]int64, len(req.Descriptors))
	entries := make([][]Entry, len(req.Descriptors))
	for i, d := range req.Descriptors {
		f := fmt.Sprintf("descriptors[%d]", i)
		if d == nil || len(d.Entries) == 0 {
			return nil, nil, bad(f+".entries", "empty")
		}
		if len(d.Entries) > MaxEntries {
			return nil, nil, bad(f+".entries", fmt.Sprintf("%d entries, more than %d", len(d.Entries), MaxEntries))
		}
		es := make([]Entry, len(d.Entries))
		for j, e := range d.Entries {
			switch {
			case e == nil || e.Key == "":
				return nil, nil, bad(fmt.Sprintf("%s.entries[%d].key", f, j), "empty")
			case len(e.Key) > MaxKeyLen:
				return nil, nil, bad(fmt.Sprintf("%s.entries[%d].key", f, j), fmt.Sprintf("longer than %d bytes", MaxKeyLen))
			}
			v := e.Value
			if req.Domain == TollgateDomain && e.Key == KeyPath {
				// The query string is no part of the path rules match, and
				// the client chooses its length. The path is matched after
				// it is normalised, so it is never cut to a bounded value
				// (a cut "/auth;aaa...a/login" normalised as "/auth" would
				// escape the rules of "/auth/login"): a path longer than
				// the decision API takes is refused as the check refuses
				// it, and only its length past that bound is dropped.
				// A _method parameter of the query is an override, as
				// the override headers are (the upstream may honour it).
				// Two that disagree are all a check needs to refuse them:
				// no more are kept (a query is the client's, up to
				// Envoy's header limit, and thousands of repeats made
				// thousands of entries).
				var seen []string
				paths.EachMethodParam(v, func(m string) bool {
					if u := upperASCII(m); !slices.Contains(seen, u) {
						seen = append(seen, u)
						es = append(es, Entry{Key: KeyMethodOverride, Value: boundedValue(m)})
					}
					return len(seen) < maxQueryOverrides
				})
				v, _, _ = strings.Cut(v, "?")
				es[j] = Entry{Key: e.Key, Value: v[:min(len(v), paths.MaxLen+1)]}
				continue
			}
			es[j] = Entry{Key: e.Key, Value: boundedValue(v)}
		}
		entries[i] = es
		// As envoyproxy/ratelimit: the descriptor's own hits_addend (0 is a
		// read) over the request's, and 0 there means 1.
		switch {
		case d.HitsAddend != nil:
			if d.HitsAddend.Value > MaxHitsAddend {
				return nil, nil, bad(f+".hits_addend", fmt.Sprintf("%d is more than %d", d.HitsAddend.Value, MaxHitsAddend))
			}
			hits[i] = int64(d.HitsAddend.Value)
		default:
			hits[i] = max(1, int64(req.HitsAddend))
		}
		if l := d.Limit; l != nil {
			if _, ok := unitSeconds[Unit(l.Unit)]; !ok {
				return nil, nil, bad(f+".limit.unit", "not a unit")
			}
		}
	}
	return hits, entries, nil
}

// boundedValue is v, or for a value longer than MaxValueLen (a client
// chooses header values) its first bytes and the SHA-256 of the whole: a
// bounded value that still counts apart from every other, and still
// matches prefix wildcards. A long value is never refused: a refusal is an
// error to Envoy, which may then let the request through.
func boundedValue(v string) string {
	if len(v) <= MaxValueLen {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return v[:MaxValueLen-1-2*len(sum)] + "#" + hex.EncodeToString(sum[:])
}

// outcome is one descriptor's answer before it becomes a status.
type outcome struct {
	limit     *Limit // nil: no limit applies
	unlimited bool
	remaining int64
	reset     int64 // seconds
	over      bool  // past the limit (a shadow limit still answers OK)
	refusing  bool  // answered OVER_LIMIT
	degraded  bool  // Redis did not count it
	local     bool  // counted in this process instead (fail_open)
}

// configured answers a domain of the YAML configuration.
func (s *Service) configured(ctx context.Context, req *rlspb.RateLimitRequest, entries [][]Entry, hits []int64, set *Settings) (*rlspb.RateLimitResponse, error) {
	cfg := s.cfg.Load()
	n := len(req.Descriptors)
	out := make([]outcome, n)
	replaced := map[string]bool{}
	for i, d := range req.Descriptors {
		var l *Limit
		if o := d.Limit; o != nil {
			// A limit the proxy sends itself (route metadata) replaces the
			// configured one, as envoyproxy/ratelimit does.
			l = &Limit{Path: req.Domain + "." + entryPath(entries[i]), Unit: Unit(o.Unit), RequestsPerUnit: o.RequestsPerUnit}
		} else {
			l = cfg.Find(req.Domain, entries[i])
		}
		if l == nil {
			continue
		}
		for _, r := range l.Replaces {
			replaced[r] = true
		}
		if l.Unlimited {
			out[i].unlimited = true
			continue
		}
		out[i].limit = l
	}
	for i := range out {
		if l := out[i].limit; l != nil && l.Name != "" && replaced[l.Name] {
			out[i].limit = nil
		}
	}
	if err := s.count(ctx, req.Domain, entries, hits, out, set.FailOpen); err != nil {
		if !set.FailOpen {
			// The cause (an address, a Redis error) goes to the log, not
			// to the caller.
			s.d.Log.Warn("rate limit service: redis failed; answering UNAVAILABLE (fail_closed)", "domain", req.Domain, "err", err)
			return nil, status.Error(codes.Unavailable, "rate limiter unavailable (failure_mode fail_closed)")
		}
		s.d.Log.Warn("rate limit service: redis failed; failing open", "domain", req.Domain, "err", err)
	}
	resp := &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: make([]*rlspb.RateLimitResponse_DescriptorStatus, n)}
	var headerFrom *outcome
	degraded := false
	for i := range out {
		o := &out[i]
		st := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
		resp.Statuses[i] = st
		code := "no_limit"
		switch {
		case o.unlimited:
			st.LimitRemaining = math.MaxUint32
			code = "unlimited"
		case o.degraded && !o.local:
			degraded = true
			code = "degraded"
		case o.limit != nil:
			degraded = degraded || o.local
			l := o.limit
			st.CurrentLimit = &rlspb.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: l.Unit}
			st.DurationUntilReset = durationpb.New(time.Duration(o.reset) * time.Second)
			st.LimitRemaining = uint32(min(max(o.remaining, 0), math.MaxUint32))
			code = "ok"
			if o.local {
				code = "degraded"
			}
			if o.over {
				st.Code, st.LimitRemaining, code = rlspb.RateLimitResponse_OVER_LIMIT, 0, "over_limit"
				if l.Shadow {
					st.Code, code = rlspb.RateLimitResponse_OK, "shadow_over_limit"
				} else {
					resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
				}
			}
			o.refusing = st.Code == rlspb.RateLimitResponse_OVER_LIMIT
			if headerFrom == nil || o.refusing && !headerFrom.refusing || o.refusing == headerFrom.refusing && o.remaining < headerFrom.remaining {
				headerFrom = o
			}
		}
		s.d.Observe.RLSDecision(cfg.metricDomain(req.Domain), code)
	}
	if headerFrom != nil {
		resp.ResponseHeadersToAdd = s.headers(headerFrom, set, resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT)
	}
	if degraded {
		resp.RequestHeadersToAdd = []*corev3.HeaderValue{{Key: "x-tollgate-decision", Value: "degraded"}}
	}
	return resp, nil
}

// count runs the counters of the limited descriptors: queued in
// descriptor order, so that Redis runs them in that order (two descriptors
// of one call on one counter see each other's hits, as in the peer's
// pipeline) and the pipeline carries them together. Redis calls go through
// a circuit breaker; a descriptor Redis could not count is counted in this
// process (degraded) when the failure mode is fail_open and a local limiter
// is there; otherwise its error is returned.
func (s *Service) count(ctx context.Context, domain string, entries [][]Entry, hits []int64, out []outcome, failOpen bool) error {
	type pending struct {
		i     int
		count *limiter.PendingCount
		do    *limiter.PendingDo
	}
	var queued []pending
	var errs []error
	fail := func(i int, err error) {
		if failOpen && s.d.Local != nil && ctx.Err() == nil && !errors.Is(err, limiter.ErrBadRequest) && !errors.Is(err, limiter.ErrScript) {
			s.countLocally(domain, entries[i], hits[i], &out[i])
			return
		}
		errs, out[i].degraded = append(errs, err), true
	}
	redisUp := s.breaker.Allow(s.d.Now().UnixNano())
	for i := range out {
		l := out[i].limit
		if l == nil {
			continue
		}
		if !redisUp {
			fail(i, errBreakerOpen)
			continue
		}
		key := counterKey(domain, entries[i], l)
		if l.Algorithm == "" {
			p, err := s.d.Counters.CountAsync(ctx, key, hits[i], l.Window())
			if err != nil {
				fail(i, err)
				continue
			}
			queued = append(queued, pending{i: i, count: p})
			continue
		}
		p, err := s.d.Counters.DoAsync(ctx, limiter.Request{Owner: keys.NewOwner("rls", key), Rule: l.rule(), Cost: hits[i]})
		if err != nil {
			fail(i, err)
			continue
		}
		queued = append(queued, pending{i: i, do: p})
	}
	for _, p := range queued {
		o := &out[p.i]
		var err error
		if p.count != nil {
			var c limiter.HitCount
			if c, err = p.count.Wait(ctx); err == nil {
				rpu := int64(o.limit.RequestsPerUnit)
				o.reset, o.over, o.remaining = c.ResetSeconds, c.Count > rpu, rpu-c.Count
			}
		} else {
			var r limiter.Result
			if r, err = p.do.Wait(ctx); err == nil {
				o.over, o.remaining = !r.Allowed, r.Remaining
				o.reset = int64(math.Ceil(r.ResetAfter.Seconds()))
			}
		}
		if !limiter.SaysNothing(ctx, err) {
			limiter.Tell(s.breaker, err, s.d.Now().UnixNano())
		}
		if err != nil {
			fail(p.i, err)
		}
	}
	return errors.Join(errs...)
}

// errBreakerOpen: Redis is not asked while the breaker is open.
var errBreakerOpen = errors.New("redis circuit breaker open")

// countLocally decides a descriptor in this process's memory, at its limit
// divided by the replicas (the decision service's local limiter): marked
// degraded, never unlimited.
func (s *Service) countLocally(domain string, es []Entry, hits int64, o *outcome) {
	l := o.limit
	r := s.d.Local.Do(limiter.Request{Owner: keys.NewOwner("rls", counterKey(domain, es, l)), Rule: l.rule(), Cost: hits})
	o.over, o.remaining, o.reset, o.degraded, o.local = !r.Allowed, r.Remaining, int64(math.Ceil(r.ResetAfter.Seconds())), true, true
}

// rule is the limit as a Tollgate rule: its algorithm (the peer's fixed
// window when it names none), limit, window and burst.
func (l *Limit) rule() *rules.Rule {
	alg := l.Algorithm
	if alg == "" {
		alg = rules.FixedWindow
	}
	return &rules.Rule{ID: "rls", Algorithm: alg, Limit: max(int64(l.RequestsPerUnit), 1), WindowSeconds: l.Window(), Burst: l.Burst, Scope: rules.ScopeGlobal}
}

// counterKey names a descriptor's counter: its domain, entries and limit,
// hashed, so that no choice of keys and values (which may hold any byte,
// "_" and ":" included) makes two descriptors share a counter, and a key
// has a fixed length whatever the descriptor's.
func counterKey(domain string, entries []Entry, l *Limit) string {
	h := sha256.New()
	var n [4]byte
	put := func(s string) {
		n[0], n[1], n[2], n[3] = byte(len(s)>>24), byte(len(s)>>16), byte(len(s)>>8), byte(len(s))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	put(domain)
	for _, e := range entries {
		put(e.Key)
		put(e.Value)
	}
	put(l.Unit.String())
	put(string(l.Algorithm))
	sum := h.Sum(nil)
	return fmt.Sprintf("tg:rls:%x", sum[:16])
}

func entryPath(es []Entry) string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteByte('_')
			b.WriteString(e.Value)
		}
	}
	return b.String()
}

// headers are the X-RateLimit fields of the descriptor that decided (the
// one over its limit, else the one with the least left).
func (s *Service) headers(o *outcome, set *Settings, denied bool) []*corev3.HeaderValue {
	now := s.d.Now().Unix()
	l := wire.Limits{RuleID: o.limit.Name, Strategy: string(o.limit.Algorithm), Limit: int64(o.limit.RequestsPerUnit), Remaining: max(o.remaining, 0),
		ResetAt: now + o.reset, WindowSeconds: o.limit.Window()}
	if l.Strategy == "" {
		l.Strategy = string(rules.FixedWindow)
	}
	if l.RuleID == "" {
		l.RuleID = o.limit.Path
	}
	if denied {
		l.RetryAfter = o.reset
	}
	var out []*corev3.HeaderValue
	for _, h := range wire.AppendHeaders(nil, &l, set.Headers, now, denied) {
		out = append(out, &corev3.HeaderValue{Key: h[0], Value: h[1]})
	}
	return out
}

// tollgate answers the tollgate domain: each descriptor is one check of
// Tollgate's model (tiers, rules, API keys, overrides, exemptions), built
// from its entries, the checks run concurrently. A check refused for what
// the client sent (a malformed path, a bad or revoked key, a method no rule
// can read) is answered OVER_LIMIT with x-tollgate-refused naming why:
// a client never turns a decision into an error Envoy might let through;
// refusedInput reports such a refusal.
func (s *Service) tollgate(ctx context.Context, req *rlspb.RateLimitRequest, entries [][]Entry, hits []int64, trust decision.Trust, set *Settings) (resp *rlspb.RateLimitResponse, refusedInput bool, err error) {
	checks := make([]*wire.CheckRequest, len(entries))
	for i, es := range entries {
		c, err := checkOf(i, es, hits[i])
		if err != nil {
			return nil, false, err
		}
		if trust == decision.Untrusted {
			// Only the service credential may name a caller's address
			// beside another identity (decision: client_address): without
			// it a signed-in user (tollgate.user) is decided as the user,
			// its address counted by no ip rule, rather than refused (an
			// outsider's token-less service answered every signed-in user
			// 429).
			c.ClientAddress = ""
		}
		checks[i] = c
	}
	type answer struct {
		resp wire.CheckResponse
		err  error
	}
	answers := make([]answer, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		if err := ambiguousPath(c.Endpoint); err != nil {
			answers[i].err = err
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i].resp, answers[i].err = s.d.Checker.Check(ctx, c, trust)
		}()
	}
	wg.Wait()
	resp = &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: make([]*rlspb.RateLimitResponse_DescriptorStatus, len(entries))}
	var decided *wire.CheckResponse
	var refused string
	degraded := false
	for i, a := range answers {
		if a.err != nil {
			code, ok := clientRefusal(a.err)
			if !ok {
				return nil, false, grpcError(a.err)
			}
			resp.Statuses[i] = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OVER_LIMIT}
			resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
			refused = cmp.Or(refused, code)
			s.d.Observe.RLSDecision(TollgateDomain, "refused_input")
			continue
		}
		ans := a.resp
		st := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK,
			CurrentLimit:       &rlspb.RateLimitResponse_RateLimit{Name: ans.RuleID, RequestsPerUnit: uint32(min(max(ans.Limit, 0), math.MaxUint32)), Unit: unitOf(ans.WindowSeconds)},
			LimitRemaining:     uint32(min(max(ans.Remaining, 0), math.MaxUint32)),
			DurationUntilReset: durationpb.New(time.Duration(max(ans.ResetAt-s.d.Now().Unix(), 0)) * time.Second)}
		code := "ok"
		if ans.Degraded {
			degraded, code = true, "degraded"
		}
		if !ans.Allowed && !ans.LogOnly {
			// A refusal, counted by Redis or, degraded, by this replica.
			st.Code, code = rlspb.RateLimitResponse_OVER_LIMIT, "over_limit"
			resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
		}
		if ans.RuleID == "" {
			st.CurrentLimit = nil
		}
		resp.Statuses[i] = st
		s.d.Observe.RLSDecision(TollgateDomain, code)
		if decided == nil || !ans.Allowed && decided.Allowed || ans.Allowed == decided.Allowed && ans.Remaining < decided.Remaining {
			decided = &answers[i].resp
		}
	}
	if decided != nil && decided.RuleID != "" && !decided.Degraded {
		now := s.d.Now().Unix()
		l := decided.Limits()
		for _, h := range wire.AppendHeaders(nil, &l, set.Headers, now, !decided.Allowed && !decided.LogOnly) {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: h[0], Value: h[1]})
		}
	}
	if refused != "" {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: refusedHeader, Value: refused})
	}
	if degraded {
		resp.RequestHeadersToAdd = []*corev3.HeaderValue{{Key: "x-tollgate-decision", Value: "degraded"}}
	}
	return resp, refused != "", nil
}

// ambiguousPath refuses a path that upstreams read two ways, as the
// filter does (its escaped_slashes default, and dot segments): an escaped
// slash or backslash, or a "." or ".." segment, which Envoy forwards as
// sent unless its connection manager unescapes and normalises paths (the
// shipped envoy-rls.yaml does; Istio's default leaves %2F): counted here
// resolved, such a path reached a wildcard route upstream as another.
func ambiguousPath(p string) error {
	if paths.HasEscapedSlash(p) || paths.HasDotSegment(p) {
		return apierr.Invalid("endpoint", "the path has an escaped slash, a backslash or a '.' or '..' segment, which upstreams read two ways")
	}
	return nil
}

// clientRefusal reports whether a check failed for what the client sent
// (the request's path, method or API key, or a key Redis cannot be asked
// about where one is required), and its error code.
func clientRefusal(err error) (string, bool) {
	var ae *apierr.Error
	if !errors.As(err, &ae) {
		return "", false
	}
	if errors.Is(err, decision.ErrKeyUnverifiable) {
		// Access control does not fail open, whatever Envoy's
		// failure_mode_deny makes of an error.
		return ae.Code, true
	}
	switch ae.Kind {
	case apierr.KindInvalid, apierr.KindUnauthorized, apierr.KindForbidden, apierr.KindNotFound, apierr.KindTooLarge:
		return ae.Code, true
	}
	return "", false
}

// checkOf builds a check from a tollgate descriptor's entries.
func checkOf(i int, es []Entry, hits int64) (*wire.CheckRequest, error) {
	var user, addr string
	var overrides []string // the distinct methods override entries name
	// A check spends at least one: hits_addend 0 counts 1 here. Envoy's
	// rate limit filter reports no response: a rule whose cost the
	// response reports spends it now (ChargeNow).
	c := &wire.CheckRequest{Cost: hits, Endpoint: "/", ChargeNow: true}
	for j, e := range es {
		field := fmt.Sprintf("descriptors[%d].entries[%d]", i, j)
		switch e.Key {
		case KeyRemoteAddress:
			addr = e.Value
		case KeyUser:
			user = e.Value
		case KeyAPIKey:
			c.APIKey = e.Value
		case KeyPath:
			p, _, _ := strings.Cut(e.Value, "?")
			c.Endpoint = p
		case KeyMethod:
			c.Method = e.Value
		case KeyMethodOverride:
			// Upper-cased, as the frameworks that honour an override
			// read it.
			if m := upperASCII(e.Value); !slices.Contains(overrides, m) {
				overrides = append(overrides, m)
			}
		case KeyTier:
			c.Tier = e.Value
		case KeyTenant:
			c.Tenant = e.Value
		default:
			return nil, status.Error(codes.InvalidArgument, fmt.Sprintf("%s.key: %q is not a key of the tollgate domain (%s)", field, e.Key, strings.Join(tollgateKeys, ", ")))
		}
	}
	switch {
	case len(overrides) == 1 && overrides[0] != c.Method:
		c.MethodOverride = overrides[0]
	case len(overrides) > 1:
		// Overrides that disagree (the upstream might honour either) are
		// no method: the check refuses them as input, as the filter
		// refuses them with a 400.
		c.MethodOverride = strings.Join(overrides, ",")
	}
	if addr != "" {
		// Counted by the address's bucket, as the filter counts it: an
		// IPv6 client by its /64 (a subscriber is routinely given a whole
		// /64, and could walk around a per-address limit otherwise).
		a, err := identity.ParseAddr(addr)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, fmt.Sprintf("descriptors[%d]: %s %q is not an address", i, KeyRemoteAddress, addr))
		}
		addr = identity.Bucket(a, identity.DefaultIPv6Prefix).String()
	}
	switch {
	case user != "":
		c.UserID = "user:" + user
		c.ClientAddress = addr
	case addr != "":
		c.UserID = "ip:" + addr
	default:
		return nil, status.Error(codes.InvalidArgument, fmt.Sprintf("descriptors[%d]: names no caller (%s or %s)", i, KeyUser, KeyRemoteAddress))
	}
	return c, nil
}

// unitOf is the protocol's unit of a window, UNKNOWN when none is exact.
func unitOf(windowSeconds int64) Unit {
	for u, s := range unitSeconds {
		if s == windowSeconds {
			return u
		}
	}
	return rlspb.RateLimitResponse_RateLimit_UNKNOWN
}

// grpcError maps a decision error to a status naming its field.
func grpcError(err error) error {
	var ae *apierr.Error
	if !errors.As(err, &ae) {
		return status.Error(codes.Internal, "the check failed")
	}
	msg := ae.Message
	switch ae.Kind {
	case apierr.KindInvalid, apierr.KindTooLarge:
		return status.Error(codes.InvalidArgument, msg)
	case apierr.KindUnauthorized:
		return status.Error(codes.Unauthenticated, msg)
	case apierr.KindForbidden:
		return status.Error(codes.PermissionDenied, msg)
	case apierr.KindNotFound:
		return status.Error(codes.NotFound, msg)
	case apierr.KindUnavailable:
		return status.Error(codes.Unavailable, msg)
	}
	return status.Error(codes.Internal, msg)
}

// upperASCII upper-cases ASCII letters only.
func upperASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - ('a' - 'A')
		}
	}
	return string(b)
}
