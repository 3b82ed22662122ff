package rls

import (
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// FuzzRequest: whatever bytes a caller sends as a ShouldRateLimit request,
// validation answers INVALID_ARGUMENT naming a field or passes a request
// within the bounds, and what passes is matched and turned into checks
// without a panic.
func FuzzRequest(f *testing.F) {
	cfg, err := Parse("api.yaml", []byte(example))
	if err != nil {
		f.Fatal(err)
	}
	seed := func(r *rlspb.RateLimitRequest) {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(&rlspb.RateLimitRequest{Domain: "api", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "1.2.3.4"}, {Key: "path", Value: "/x"}}}}})
	seed(&rlspb.RateLimitRequest{Domain: TollgateDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: KeyUser, Value: "alice"}, {Key: KeyPath, Value: "/a?b"}}}}})
	f.Fuzz(func(t *testing.T, b []byte) {
		var req rlspb.RateLimitRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		hits, entries, err := validate(&req)
		if err != nil {
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), ": ") {
				t.Fatalf("refusal %v names no field", err)
			}
			return
		}
		if len(entries) > MaxDescriptors {
			t.Fatalf("%d descriptors passed", len(entries))
		}
		for i, es := range entries {
			if hits[i] < 0 || hits[i] > MaxHitsAddend || len(es) > MaxEntries {
				t.Fatalf("descriptor %d passed out of bounds: hits %d, %d entries", i, hits[i], len(es))
			}
			cfg.Find(req.Domain, es)
			if c, err := checkOf(i, es, hits[i]); err == nil && c.UserID == "" {
				t.Fatalf("a check without a caller: %+v", c)
			}
		}
	})
}
