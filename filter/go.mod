module github.com/tollgate-rl/tollgate/filter

go 1.26.0

require github.com/tollgate-rl/tollgate/shared v0.0.0

replace github.com/tollgate-rl/tollgate/shared => ../shared
