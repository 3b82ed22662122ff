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
			if hits[i] < 0 || hits[i] > MaxHitsAddend || len(es) > MaxEntries+maxQueryOverrides {
				t.Fatalf("descriptor %d passed out of bounds: hits %d, %d entries", i, hits[i], len(es))
			}
			cfg.Find(req.Domain, es)
			if c, err := checkOf(i, es, hits[i]); err == nil && c.UserID == "" {
				t.Fatalf("a check without a caller: %+v", c)
			}
		}
	})
}

// A path's query adds at most two override entries, whatever it repeats:
// one value is an override, two that disagree refuse the check (an
// outsider's query of thousands made thousands of entries).
func TestPathMethodOverridesBounded(t *testing.T) {
	for _, tc := range []struct {
		query, want string
		entries     int
	}{
		{"_method=delete", "DELETE", 4},
		{strings.Repeat("_method=GET&", 4000), "GET", 4},
		{strings.Repeat("_method=GET&_method=put&", 2000), "GET,PUT", 5},
		{"_method=a&_method=b&_method=c&_method=d", "A,B", 5},
	} {
		req := &rlspb.RateLimitRequest{Domain: TollgateDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: KeyRemoteAddress, Value: "192.0.2.1"}, {Key: KeyMethod, Value: "POST"}, {Key: KeyPath, Value: "/items?" + tc.query}}}}}
		hits, entries, err := validate(req)
		if err != nil {
			t.Fatalf("%.40s: %v", tc.query, err)
		}
		if len(entries[0]) != tc.entries {
			t.Errorf("%.40s: %d entries, want %d", tc.query, len(entries[0]), tc.entries)
		}
		c, err := checkOf(0, entries[0], hits[0])
		if err != nil {
			t.Fatalf("%.40s: %v", tc.query, err)
		}
		if c.MethodOverride != tc.want {
			t.Errorf("%.40s: override %q, want %q", tc.query, c.MethodOverride, tc.want)
		}
	}
}
