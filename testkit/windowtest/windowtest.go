// Package windowtest keeps tests that count in fixed windows clear of a
// window's edge.
package windowtest

import (
	"testing"
	"time"
)

// RoomInMinute waits, when fewer than 3 seconds are left of the current
// minute, until the next one begins. A test that counts requests in fixed
// windows of a minute (aligned to the minutes of Redis's clock, which is
// this machine's) must not straddle a window's edge: its requests would
// land in two windows, and a limit it fills would open anew. What it waits
// for is that edge itself.
func RoomInMinute(t testing.TB) {
	t.Helper()
	now := time.Now()
	if left := time.Minute - now.Sub(now.Truncate(time.Minute)); left < 3*time.Second {
		time.Sleep(left + 50*time.Millisecond)
	}
}
