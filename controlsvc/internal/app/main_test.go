package app_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every service a test starts stops with it: no goroutine of the service
// (HTTP and gRPC servers, Redis pools, watchers, the usage flusher, the
// limiter's pipeline) outlives the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
