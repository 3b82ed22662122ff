package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate-rl/tollgate/testkit/loadtest"
)

// benchYAML is the one descriptor both services answer: a per-user limit
// no run reaches, in envoyproxy/ratelimit's format (Tollgate reads it as
// its rls_config, the peer from its runtime directory).
const benchYAML = "domain: bench\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1000000000\n"

// grpcConns is how many connections the load generator opens: Envoy holds
// one per worker to its rate limit cluster.
const grpcConns = 4

// decideGRPC runs one bounded load of ShouldRateLimit calls against t's
// gRPC listener, prints what it took, and returns the CPU (service + Redis)
// in µs per decision.
func decideGRPC(t *target, redisAddr string, requests int64, concurrency int, callers int64, maxTime time.Duration) (float64, error) {
	var conns []*grpc.ClientConn
	for range grpcConns {
		c, err := grpc.NewClient(t.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return 0, err
		}
		defer c.Close()
		conns = append(conns, c)
	}
	before, err := usageOf(t.pid, redisAddr)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), maxTime)
	defer cancel()
	if t.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+t.token)
	}
	var next, failures atomic.Int64
	lat := make([][]time.Duration, concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := rlspb.NewRateLimitServiceClient(conns[w%len(conns)])
			for {
				i := next.Add(1) - 1
				if i >= requests || ctx.Err() != nil {
					return
				}
				req := &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
					Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprintf("bench-%d", i%callers)}}}}}
				t0 := time.Now()
				resp, err := client.ShouldRateLimit(ctx, req)
				lat[w] = append(lat[w], time.Since(t0))
				if err != nil || resp.OverallCode != rlspb.RateLimitResponse_OK {
					failures.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	after, err := usageOf(t.pid, redisAddr)
	if err != nil {
		return 0, err
	}
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return 0, errors.New("no call was made")
	}
	slices.Sort(all)
	res := loadtest.Result{Requests: int64(len(all)), Elapsed: elapsed, PerSec: float64(len(all)) / elapsed.Seconds(),
		P50: all[len(all)/2], P99: all[len(all)*99/100], Failures: failures.Load()}
	if res.Failures > 0 {
		return 0, fmt.Errorf("%d of %d calls failed or were refused", res.Failures, res.Requests)
	}
	n := float64(res.Requests)
	svc := (after.service - before.service).Seconds() * 1e6 / n
	red := (after.redis - before.redis).Seconds() * 1e6 / n
	fmt.Printf("%-22s %v  service %.0f µs + Redis %.0f µs CPU per decision\n", t.name, res, svc, red)
	fmt.Printf("%-22s Redis commands per decision: %s\n", "", after.commands.since(before.commands, n))
	return svc + red, nil
}
