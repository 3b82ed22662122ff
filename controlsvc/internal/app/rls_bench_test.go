package app_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// BenchmarkRLSOverGRPC is one ShouldRateLimit call with one descriptor,
// over a kept gRPC connection, against a real Redis: the rate limit
// service's own cost per decision (make bench compares it with the peer's).
func BenchmarkRLSOverGRPC(b *testing.B) {
	_, c, _ := rlsService(b, "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000000000}\n", "", nil)
	ctx := withToken(decisionToken)
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			req := &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprintf("bench-%d", i%1000)}}}}}
			r, err := c.ShouldRateLimit(ctx, req)
			if err != nil || r.OverallCode != rlspb.RateLimitResponse_OK {
				b.Fatalf("%v %v", r, err)
			}
		}
	})
}
