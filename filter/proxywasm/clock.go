package proxywasm

// Time is a moment on the wall clock in Unix nanoseconds: the filter keeps
// its times so, not as time.Time, so that the module links no package
// time (which alone brings internal/godebug, internal/bisect and the
// runtime's metrics tables: about 60 kB).
type Time int64

// UnixNano, UnixMilli and Unix are t in those units (as time.Time's).
func (t Time) UnixNano() int64  { return int64(t) }
func (t Time) UnixMilli() int64 { return int64(t) / 1e6 }
func (t Time) Unix() int64      { return int64(t) / 1e9 }
