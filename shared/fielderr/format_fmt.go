//go:build !wasip1

package fielderr

import "fmt"

// formatArgs is fmt.Sprintf outside the filter's module (the control service,
// tests), where fmt costs nothing; sprintf agrees with it on what the
// filter formats (FuzzSprintf).
func formatArgs(f string, args []any) string { return fmt.Sprintf(f, args...) }
