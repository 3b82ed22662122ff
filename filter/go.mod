module github.com/tollgate-rl/tollgate/filter

go 1.26.0

require (
	github.com/tetratelabs/wazero v1.12.0
	github.com/tollgate-rl/tollgate/shared v0.0.0
)

require golang.org/x/sys v0.44.0 // indirect

replace github.com/tollgate-rl/tollgate/shared => ../shared
