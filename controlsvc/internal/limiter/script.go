package limiter

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// script is a Lua script sent as EVALSHA with an EVAL fallback, its
// command built once per call: go-redis's Script.EvalSha copies the keys
// and arguments into a second slice and boxes the hash again on every
// call, which a check that runs at the rate of the service's traffic does
// not need.
type script struct {
	*redis.Script
	src  any // the source and the hash, boxed once
	hash any
}

func newScript(src string) *script {
	s := redis.NewScript(src)
	return &script{Script: s, src: src, hash: s.Hash()}
}

// evalSha starts an EVALSHA command of n keys, with room for more
// arguments: the caller appends the keys, then the arguments.
func (s *script) evalSha(n, more int) []any {
	argv := make([]any, 0, 3+more)
	return append(argv, "evalsha", s.hash, n)
}

// once is a script call go-redis must not send again by itself: a script
// that ran and whose answer was lost (a timeout), or that shared a
// pipeline with a call answered TRYAGAIN (go-redis's cluster pipeline sends
// a node's whole part again when its first command's answer is retryable),
// would count its caller again; every other caller of a resharded node
// was counted up to four times a check (attack 46 B1). Answers that say a
// script did not run (MOVED, ASK: go-redis follows them; TRYAGAIN: the
// batcher's tryAgain) are still followed.
type once struct{ *redis.Cmd }

// NoRetry is redis.Cmder's: never send it again.
func (once) NoRetry() bool { return true }

// run runs argv (from evalSha, or "evalsha_ro" in its first slot), loading
// the script with EVAL when Redis does not have it.
func (s *script) run(ctx context.Context, c Client, argv []any) (any, error) {
	cmd := redis.NewCmd(ctx, argv...)
	_ = c.Process(ctx, once{cmd})
	v, err := cmd.Result()
	if noScript(err) {
		return s.eval(ctx, c, argv)
	}
	return v, err
}

// eval runs argv as EVAL (or EVAL_RO) of the script's source: Redis
// caches the script again as it runs it.
func (s *script) eval(ctx context.Context, c Client, argv []any) (any, error) {
	name := "eval"
	if argv[0] == "evalsha_ro" {
		name = "eval_ro"
	}
	e := make([]any, len(argv))
	copy(e, argv)
	e[0], e[1] = name, s.src
	cmd := redis.NewCmd(ctx, e...)
	_ = c.Process(ctx, once{cmd})
	return cmd.Result()
}

// noScript is Redis's answer to EVALSHA of a script it does not hold.
func noScript(err error) bool { return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") }
