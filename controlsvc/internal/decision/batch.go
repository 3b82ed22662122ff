package decision

import (
	"context"
	"errors"
	"fmt"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/idempotency"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// MaxIdempotencyKey bounds an idempotency key.
const MaxIdempotencyKey = 256

// Batch runs several checks. An invalid check gets its own error and does not
// stop the others. With an idempotency key, the key is first claimed with a
// digest of the checks, then the answer is stored under it and replayed for
// five minutes to the same checks. Other checks under a used key are refused
// (409 IDEMPOTENCY_KEY_REUSED) and count nothing, as is a duplicate that
// arrives while the first is still being answered: the claim comes before any
// counter is touched, so no key is ever counted twice.
func (s *Service) Batch(ctx context.Context, req *wire.BatchCheckRequest, trust Trust) (wire.BatchCheckResponse, error) {
	p := s.live.Load()
	if len(req.Checks) == 0 {
		return wire.BatchCheckResponse{}, apierr.Invalid("checks", "must not be empty")
	}
	if len(req.Checks) > p.MaxBatch {
		return wire.BatchCheckResponse{}, apierr.Invalid("checks", fmt.Sprintf("at most %d checks per batch", p.MaxBatch))
	}
	var digest string
	if req.IdempotencyKey != "" {
		if len(req.IdempotencyKey) > MaxIdempotencyKey {
			return wire.BatchCheckResponse{}, apierr.Invalid("idempotency_key", fmt.Sprintf("is longer than %d bytes", MaxIdempotencyKey))
		}
		digest = idempotency.Digest(req.Checks)
		replay, err := s.replays.Claim(ctx, req.IdempotencyKey, digest)
		switch {
		case errors.Is(err, idempotency.ErrReused), errors.Is(err, idempotency.ErrInFlight):
			return wire.BatchCheckResponse{}, &apierr.Error{Kind: apierr.KindConflict, Code: wire.CodeIdempotencyKeyReused,
				Message: err.Error(), Details: map[string]any{"field": "idempotency_key"}}
		case err != nil:
			s.m.RedisErrors.WithLabelValues("batch").Inc()
			return wire.BatchCheckResponse{}, apierr.Unavailable("rate limiter unavailable", err)
		case replay != nil:
			return *replay, nil
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
				ae = apierr.Failed(err)
			}
			body := ae.Body()
			r.Error = &body
		} else {
			r.CheckResponse = resp
		}
		out.Results[i] = r
	}
	if req.IdempotencyKey != "" {
		// The claim is this request's own: the answer replaces it. The
		// decisions are made; losing the replay copy only loses idempotency,
		// so answer anyway.
		if err := s.replays.Save(ctx, req.IdempotencyKey, digest, &out); err != nil {
			s.m.RedisErrors.WithLabelValues("batch").Inc()
			s.log.Warn("store batch answer", "err", err)
		}
	}
	return out, nil
}
