module github.com/tollgate-rl/tollgate/testkit

go 1.26.0
