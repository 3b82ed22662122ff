module github.com/tollgate-rl/tollgate/controlsvc

go 1.26
