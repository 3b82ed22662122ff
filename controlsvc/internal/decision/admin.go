package decision

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// IdempotencyTTL is how long a batch answer is replayed for its key.
const IdempotencyTTL = 5 * time.Minute

// MaxIdempotencyKey bounds an idempotency key.
const MaxIdempotencyKey = 256

// Status reads the counters of a caller and endpoint without spending.
func (s *Service) Status(ctx context.Context, req *wire.CheckRequest, trust Trust) (wire.StatusResponse, error) {
	p := s.policy.Load()
	c, aerr := p.validate(req, trust)
	if aerr != nil {
		return wire.StatusResponse{}, aerr
	}
	resp := wire.StatusResponse{UserID: req.UserID, Endpoint: c.endpoint, Identity: c.id.String()}
	if p.exempt(c.id) {
		resp.RuleID = RuleExempt
		return resp, nil
	}
	rs := s.selectRules(p, c)
	for i := range rs {
		a := &rs[i]
		res, err := s.lim.Do(ctx, limiter.Request{
			Owner: a.owner, Key: a.key, Peek: true,
			Quota: limiter.Quota{Algorithm: a.rule.Algorithm, Limit: a.rule.Limit, WindowSeconds: a.rule.WindowSeconds, Capacity: a.rule.Capacity()},
		})
		if err != nil {
			s.m.RedisErrors.WithLabelValues("status").Inc()
			return wire.StatusResponse{}, apierr.Unavailable("rate limiter unavailable", err)
		}
		a.res = res
	}
	v, _ := s.verdict(p, c, rs)
	resp.RuleID, resp.Limit, resp.Remaining, resp.ResetAt = v.RuleID, v.Limit, v.Remaining, v.ResetAt
	resp.Strategy, resp.WindowSeconds = v.Strategy, v.WindowSeconds
	if v.Limit > 0 {
		resp.UsagePercentage = float64(v.Limit-min(v.Remaining, v.Limit)) * 100 / float64(v.Limit)
	}
	return resp, nil
}

// Reset deletes a caller's counters for an endpoint: those of the rules that
// would decide its next check and count per caller (never a global or tenant
// counter), with its penalty record.
func (s *Service) Reset(ctx context.Context, req *wire.ResetRequest) (wire.ResetResponse, error) {
	p := s.policy.Load()
	c, aerr := p.validate(&wire.CheckRequest{UserID: req.UserID, Endpoint: req.Endpoint, Method: req.Method, Tier: req.Tier, Tenant: req.Tenant}, Trusted)
	if aerr != nil {
		return wire.ResetResponse{}, aerr
	}
	var n int64
	for _, a := range s.selectRules(p, c) {
		if a.rule.Scope == rules.ScopeGlobal || a.rule.Scope == rules.ScopeTenant {
			continue
		}
		// Keys of one owner share a slot; deleting one at a time keeps this
		// correct on a cluster whatever the owners. UNLINK frees a large
		// value (a sliding log holds up to its limit in entries) off Redis's
		// main thread, where DEL would stall every other check meanwhile.
		for _, k := range []string{a.key, keys.Penalty(a.owner), keys.Block(a.owner)} {
			d, err := s.rdb.Unlink(ctx, k).Result()
			if err != nil {
				s.m.RedisErrors.WithLabelValues("reset").Inc()
				return wire.ResetResponse{}, apierr.Unavailable("rate limiter unavailable", err)
			}
			n += d
		}
	}
	s.log.Info("counters reset", "identity", c.id.String(), "endpoint", c.endpoint, "keys", n)
	return wire.ResetResponse{UserID: req.UserID, Endpoint: c.endpoint, KeysDeleted: n, ResetAt: s.now().UTC().Format(time.RFC3339)}, nil
}

// SetOverride stores a per-caller, per-endpoint quota.
func (s *Service) SetOverride(ctx context.Context, req *wire.ConfigRequest) (wire.ConfigResponse, error) {
	p := s.policy.Load()
	c, aerr := p.validate(&wire.CheckRequest{UserID: req.UserID, Endpoint: req.Endpoint}, Trusted)
	if aerr != nil {
		return wire.ConfigResponse{}, aerr
	}
	if req.Strategy == "" {
		return wire.ConfigResponse{}, apierr.Invalid("strategy", "is required")
	}
	if !rules.ValidAlgorithm(rules.Algorithm(req.Strategy)) {
		e := apierr.Invalid("strategy", fmt.Sprintf("%q is not one of %v", req.Strategy, rules.Algorithms))
		e.Code = wire.CodeInvalidStrategy
		return wire.ConfigResponse{}, e
	}
	if _, aerr := p.adhocRule(RuleOverride, &req.Limit, &req.WindowSeconds, req.Strategy, req.BurstCapacity); aerr != nil {
		return wire.ConfigResponse{}, aerr
	}
	ov := Override{Limit: req.Limit, WindowSeconds: req.WindowSeconds, Algorithm: rules.Algorithm(req.Strategy), Burst: req.BurstCapacity, UpdatedAt: s.now().UTC().Truncate(time.Second)}
	if err := s.overrides.Set(ctx, c.id.String(), c.endpoint, ov); err != nil {
		s.m.RedisErrors.WithLabelValues("config").Inc()
		return wire.ConfigResponse{}, apierr.Unavailable("could not store the override", err)
	}
	s.log.Info("override set", "identity", c.id.String(), "endpoint", c.endpoint, "limit", req.Limit, "window_seconds", req.WindowSeconds, "strategy", req.Strategy)
	out := *req
	out.Endpoint = c.endpoint
	return wire.ConfigResponse{ConfigRequest: out, UpdatedAt: ov.UpdatedAt.Format(time.RFC3339)}, nil
}

// Batch runs several checks. An invalid check gets its own error and does not
// stop the others. With an idempotency key, the key is first claimed with a
// digest of the checks, then the answer is stored under it and replayed for
// five minutes to the same checks. Other checks under a used key are refused
// (409 IDEMPOTENCY_KEY_REUSED) and count nothing, as is a duplicate that
// arrives while the first is still being answered: the claim comes before any
// counter is touched, so no key is ever counted twice.
func (s *Service) Batch(ctx context.Context, req *wire.BatchCheckRequest, trust Trust) (wire.BatchCheckResponse, error) {
	p := s.policy.Load()
	if len(req.Checks) == 0 {
		return wire.BatchCheckResponse{}, apierr.Invalid("checks", "must not be empty")
	}
	if len(req.Checks) > p.Config.MaxBatch {
		return wire.BatchCheckResponse{}, apierr.Invalid("checks", fmt.Sprintf("at most %d checks per batch", p.Config.MaxBatch))
	}
	var idemKey, digest string
	if req.IdempotencyKey != "" {
		if len(req.IdempotencyKey) > MaxIdempotencyKey {
			return wire.BatchCheckResponse{}, apierr.Invalid("idempotency_key", fmt.Sprintf("is longer than %d bytes", MaxIdempotencyKey))
		}
		sum := sha256.Sum256([]byte(req.IdempotencyKey))
		idemKey = keys.Idempotency(hex.EncodeToString(sum[:]))
		digest = batchDigest(req.Checks)
		replay, err := s.claimBatch(ctx, idemKey, digest)
		if err != nil || replay != nil {
			if replay != nil {
				return *replay, nil
			}
			return wire.BatchCheckResponse{}, err
		}
	}
	out := wire.BatchCheckResponse{Results: make([]wire.BatchResult, len(req.Checks))}
	for i := range req.Checks {
		chk := &req.Checks[i]
		r := wire.BatchResult{UserID: chk.UserID, Endpoint: chk.Endpoint}
		resp, err := s.Check(ctx, chk, trust)
		if err != nil {
			var ae *apierr.Error
			if !errors.As(err, &ae) {
				ae = &apierr.Error{Status: http.StatusInternalServerError, Code: wire.CodeInternal, Message: "internal error"}
			}
			body := ae.Body()
			r.Error = &body
		} else {
			r.CheckResponse = resp
		}
		out.Results[i] = r
	}
	if idemKey != "" {
		b, err := json.Marshal(storedBatch{Digest: digest, Answer: &out})
		if err == nil {
			// The claim is this request's own: the answer replaces it.
			err = s.rdb.Set(ctx, idemKey, b, IdempotencyTTL).Err()
		}
		if err != nil {
			// The decisions are made; losing the replay copy only loses
			// idempotency, so answer anyway.
			s.m.RedisErrors.WithLabelValues("batch").Inc()
			s.log.Warn("store batch answer", "err", err)
		}
	}
	return out, nil
}

// storedBatch is what an idempotency key holds: the digest of the checks it
// was first used for and, once they are answered, the answer (nil while the
// first request is still being answered).
type storedBatch struct {
	Digest string                   `json:"digest"`
	Answer *wire.BatchCheckResponse `json:"answer,omitempty"`
}

// claimTTL bounds how long a claim waits for its answer: a service that died
// mid-batch does not lock the key for the whole IdempotencyTTL.
const claimTTL = 30 * time.Second

// batchDigest is the SHA-256 of the decoded checks marshalled again: one
// canonical form of the request, whatever its spacing, key order or unknown
// fields.
func batchDigest(checks []wire.CheckRequest) string {
	b, _ := json.Marshal(checks) // plain strings and numbers: cannot fail
	d := sha256.Sum256(b)
	return hex.EncodeToString(d[:])
}

// claimBatch takes an idempotency key for the checks with this digest. It
// returns (nil, nil) when the key is this request's to answer, the stored
// answer when the same checks were answered before, and an error otherwise.
func (s *Service) claimBatch(ctx context.Context, key, digest string) (*wire.BatchCheckResponse, error) {
	pending, err := json.Marshal(storedBatch{Digest: digest})
	if err != nil {
		return nil, fmt.Errorf("encode idempotency claim: %w", err)
	}
	reused := func(msg string) error {
		return &apierr.Error{Status: http.StatusConflict, Code: wire.CodeIdempotencyKeyReused,
			Message: msg, Details: map[string]any{"field": "idempotency_key"}}
	}
	// Two rounds: a claim may expire between the SET NX and the GET.
	for range 2 {
		ok, err := s.rdb.SetNX(ctx, key, pending, claimTTL).Result()
		if err == nil && ok {
			return nil, nil
		}
		var stored []byte
		if err == nil {
			stored, err = s.rdb.Get(ctx, key).Bytes()
			if errors.Is(err, redis.Nil) {
				continue
			}
		}
		if err != nil {
			s.m.RedisErrors.WithLabelValues("batch").Inc()
			return nil, apierr.Unavailable("rate limiter unavailable", fmt.Errorf("idempotency key: %w", err))
		}
		var st storedBatch
		switch {
		case json.Unmarshal(stored, &st) != nil || st.Digest != digest:
			return nil, reused("this idempotency_key was used for other checks; use a new key")
		case st.Answer == nil:
			return nil, reused("a request with this idempotency_key is still being answered; retry it shortly")
		}
		st.Answer.Replayed = true
		return st.Answer, nil
	}
	return nil, reused("this idempotency_key is changing hands; retry it shortly")
}
