module github.com/tollgate-rl/tollgate/shared

go 1.26.0
