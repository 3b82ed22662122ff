//go:build wasip1

package fielderr

// formatArgs is sprintf in the filter's module: no fmt there.
func formatArgs(f string, args []any) string { return sprintf(f, args) }
