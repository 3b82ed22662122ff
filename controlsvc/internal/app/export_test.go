package app

import "time"

// SetGRPCProbation sets how long a gRPC connection may go without an
// authorized call (tests shorten it); the returned func restores it.
func SetGRPCProbation(d time.Duration) func() {
	old := grpcProbation
	grpcProbation = d
	return func() { grpcProbation = old }
}
