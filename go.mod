module github.com/tollgate-rl/tollgate

go 1.26.0
