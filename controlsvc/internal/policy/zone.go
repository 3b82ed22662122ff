package policy

import (
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
