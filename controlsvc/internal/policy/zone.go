package policy

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// zones caches loaded time zones by name (time.LoadLocation reads the
// database each call).
var zones sync.Map

// Zone loads an IANA time zone ("" is UTC), cached.
func Zone(name string) (*time.Location, error) {
	if name == "" {
		return time.UTC, nil
	}
	if name == "Local" || name == "posixrules" || strings.HasPrefix(name, "right/") {
		// The host's own, or files of the host's database only: a rule
		// must mean the same on every machine (the image has no zoneinfo).
		return nil, fmt.Errorf("time zone %q depends on the host", name)
	}
	if z, ok := zones.Load(name); ok {
		return z.(*time.Location), nil
	}
	z, err := time.LoadLocation(name)
	if err != nil {
		return nil, err
	}
	zones.Store(name, z)
	return z, nil
}
