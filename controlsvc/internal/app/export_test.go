package app

import "time"

// SetGRPCProbation sets how long a gRPC connection may go without an
// authorized call (tests shorten it); the returned func restores it.
func SetGRPCProbation(d time.Duration) func() {
	old := grpcProbation
	grpcProbation = d
	return func() { grpcProbation = old }
}

// SetGRPCCallDeadline sets how long an authorized call has to send its
// message and be answered; the returned func restores it.
func SetGRPCCallDeadline(d time.Duration) func() {
	old := grpcCallDeadline
	grpcCallDeadline = d
	return func() { grpcCallDeadline = old }
}
