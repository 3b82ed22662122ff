package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/shared/rules"
)

// A client that comes back when a denial said (RetryAfter, and ResetAfter
// when it is later) is admitted, for every algorithm, with and without a
// progressive penalty: a retry at the time the answer named must never be
// refused, and so never count as another violation. The test waits the
// real wait (at most a few seconds: a one-second window), since all time
// comes from Redis; a slower machine only waits longer.
func TestRetryAtTheNamedTimeIsAdmitted(t *testing.T) {
	l, _ := newLimiter(t)
	ctx := context.Background()
	for _, a := range rules.Algorithms {
		for _, pen := range []*Penalty{nil, {Window: time.Minute, Threshold: 1, Multipliers: []int64{2}}} {
			t.Run(fmt.Sprintf("%s penalty %v", a, pen != nil), func(t *testing.T) {
				t.Parallel()
				r := req(a, fmt.Sprintf("retry-%s-%v", a, pen != nil), 2, 1)
				r.Penalty = pen
				var denial Result
				for i := 0; i < 3; i++ {
					res, err := l.Do(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					if want := i < 2; res.Allowed != want {
						t.Fatalf("call %d: %+v", i+1, res)
					}
					denial = res
				}
				if denial.RetryAfter <= 0 || denial.RetryAfter > 3*time.Second {
					t.Fatalf("denial %+v", denial)
				}
				time.Sleep(denial.RetryAfter)
				if res, err := l.Do(ctx, r); err != nil || !res.Allowed {
					t.Fatalf("a retry %v after the denial (its RetryAfter) was refused: %+v %v", denial.RetryAfter, res, err)
				}
			})
		}
	}
}
