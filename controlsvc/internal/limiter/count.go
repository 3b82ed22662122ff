package limiter

import (
	"context"
	"fmt"
)

// HitCount is a fixed-window counter's answer (see Count).
type HitCount struct {
	// Count is the window's hits after this call's.
	Count int64
	// ResetSeconds is the time left in the window.
	ResetSeconds int64
}

// Count adds hits to key's counter for the current window of windowSeconds
// (aligned to the Unix epoch, clocked by Redis) and returns the window's
// count: envoyproxy/ratelimit's fixed window, where every hit counts,
// refused or not. hits 0 reads. The call goes through the same pipeline as
// Do.
func (l *Limiter) Count(ctx context.Context, key string, hits, windowSeconds int64) (HitCount, error) {
	p, err := l.CountAsync(ctx, key, hits, windowSeconds)
	if err != nil {
		return HitCount{}, err
	}
	return p.Wait(ctx)
}

// PendingCount is a queued Count.
type PendingCount struct {
	c    *call
	done *HitCount // answered already (Answered)
}

// Answered is a count decided without Redis (memlimit), for callers that
// take a PendingCount.
func Answered(h HitCount) *PendingCount { return &PendingCount{done: &h} }

// CountAsync queues a Count and returns at once: counts queued one after
// another run in Redis in that order, in as few round trips as the
// pipeline takes (several descriptors of one call, counted as the peer's
// pipeline counts them).
func (l *Limiter) CountAsync(ctx context.Context, key string, hits, windowSeconds int64) (*PendingCount, error) {
	if hits < 0 || windowSeconds <= 0 {
		return nil, fmt.Errorf("%w: hits %d, window %d s", ErrBadRequest, hits, windowSeconds)
	}
	argv := append(l.hitCount.evalSha(1, 3), key, hits, windowSeconds)
	c, err := l.batch.enqueue(ctx, l.hitCount, argv)
	if err != nil {
		return nil, fmt.Errorf("queue hit count: %w", err)
	}
	return &PendingCount{c: c}, nil
}

// Wait returns the count's answer.
func (p *PendingCount) Wait(ctx context.Context) (HitCount, error) {
	if p.done != nil {
		return *p.done, nil
	}
	v, err := p.c.wait(ctx)
	if err != nil && scriptError(err) {
		return HitCount{}, fmt.Errorf("%w: hit count: %w", ErrScript, err)
	}
	if err != nil {
		return HitCount{}, fmt.Errorf("run hit count script: %w", err)
	}
	vals, ok := v.([]any)
	if !ok || len(vals) != 2 {
		return HitCount{}, fmt.Errorf("hit count script returned %T %v, want 2 integers", v, v)
	}
	c, ok1 := vals[0].(int64)
	r, ok2 := vals[1].(int64)
	if !ok1 || !ok2 {
		return HitCount{}, fmt.Errorf("hit count script returned %v, want 2 integers", vals)
	}
	return HitCount{Count: c, ResetSeconds: r}, nil
}

func newHitCountScript() (*script, error) {
	body, err := luaFiles.ReadFile("lua/hit_count.lua")
	if err != nil {
		return nil, fmt.Errorf("read hit count script: %w", err)
	}
	return newScript(string(body)), nil
}
