package app

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/credential"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/rls"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// The gRPC listener's bounds. What a connection can make the service
// buffer is their product: a message a call has begun and not finished is
// held, with no deadline, so an outsider holding the token held 2 MiB on
// each of 1,024 streams of each connection (4.3 GB from two). A call of
// Envoy's is a few KiB (a path at most Envoy's 60 KiB of headers), and
// Envoy's workers multiplex tens of calls on a connection: now at most
// 256 KiB x 128 calls, 32 MiB a connection; larger messages are refused
// before they are read whole.
const (
	grpcMaxMessage = 256 << 10
	grpcMaxStreams = 128
	grpcMaxHeaders = 64 << 10
)

// rlsSettings are the rate limit service's settings in cfg.
func rlsSettings(cfg *config.Config) rls.Settings {
	return rls.Settings{FailOpen: cfg.FailureMode == config.FailOpen, Shadow: cfg.ShadowMode, Disabled: !cfg.Enabled, Digests: credential.Of(cfg.DecisionTokens()),
		Headers: wire.HeaderSet{XRateLimit: true, Strategy: true, IETF: cfg.RLSIETFHeaders}.WithPrefix(cfg.HeaderPrefix)}
}

// loadRLS reads the rate limit service's configuration, if cfg names one.
func loadRLS(cfg *config.Config) (*rls.Config, error) {
	if cfg.RLSConfig == "" {
		return nil, nil
	}
	return rls.Load(cfg.RLSConfig)
}

// grpcProbation is how long a gRPC connection may go without an
// authorized call (a variable: tests shorten it).
var grpcProbation = 10 * time.Second

// grpcCallDeadline is how long an authorized call has to send its message
// and be answered (a variable: tests shorten it). grpc-go reads a call's
// message before its handler runs and gives that read no deadline: an
// outsider holding the token began calls and never finished them, each
// holding what it had sent. The tap's context is the one the message is
// read under, so its deadline ends such a call (and frees what it held).
var grpcCallDeadline = 5 * time.Second

type callDone struct{}

// withCallDeadline is ctx with grpcCallDeadline, its cancel kept in it for
// endCall: a timer a call, stopped when the call is answered.
func withCallDeadline(ctx context.Context) context.Context {
	ctx, cancel := context.WithTimeout(ctx, grpcCallDeadline)
	return context.WithValue(ctx, callDone{}, cancel)
}

// endCall stops the call's deadline timer.
func endCall(ctx context.Context) {
	if cancel, ok := ctx.Value(callDone{}).(context.CancelFunc); ok {
		cancel()
	}
}

// listenGRPC opens the rate limit service's listener (grpc_listen), with
// the HTTP listener's TLS (and client certificates) when it has them.
func (a *App) listenGRPC() error {
	if a.cfg.GRPCListen == "" {
		return nil
	}
	ln, err := a.listen(a.cfg.GRPCListen, "grpc")
	if err != nil {
		return fmt.Errorf("listen on %s (grpc_listen): %w", a.cfg.GRPCListen, err)
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(grpcMaxMessage),
		grpc.MaxConcurrentStreams(grpcMaxStreams),
		grpc.ConnectionTimeout(5 * time.Second),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 5 * time.Minute}),
		// A fixed pool of workers serves the streams instead of a goroutine
		// per call, and idle connections hold no write buffer of their own
		// (many Envoy workers each keep one connection).
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.SharedWriteBuffer(true),
		// Metadata is a few short headers: refuse more before reading it
		// whole (grpc-go's default allows 16 MB a call, unauthenticated).
		grpc.MaxHeaderListSize(grpcMaxHeaders),
		// A call without the decision token is refused before its message
		// is read and before a handler runs; one with it keeps its
		// connection past the listener's probation.
		grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
			ctx, err := a.rls.Tap(ctx, info)
			if err != nil {
				return ctx, err
			}
			if p, ok := peer.FromContext(ctx); ok {
				ln.Vouch(p.Addr)
			}
			return withCallDeadline(ctx), nil
		}),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			defer endCall(ctx)
			return handler(ctx, req)
		}),
	}
	// A connection that makes no authorized call within grpcProbation is
	// closed: grpc-go keeps an idle one for MaxConnectionIdle, so a
	// preface alone held one for 5 minutes (an outsider's attack filled
	// the listener that way from a few addresses).
	ln.Probation(grpcProbation)
	t, err := a.cfg.TLS()
	if err != nil {
		ln.Close()
		return fmt.Errorf("tls: %w", err)
	}
	if t != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(t)))
	}
	a.grpc = grpc.NewServer(opts...)
	rlspb.RegisterRateLimitServiceServer(a.grpc, a.rls)
	a.grpcLn = ln
	return nil
}

// GRPCAddr is the rate limit service's address ("" when off).
func (a *App) GRPCAddr() string {
	if a.grpcLn == nil {
		return ""
	}
	return a.grpcLn.Addr().String()
}

// RLS is the rate limit service.
func (a *App) RLS() *rls.Service { return a.rls }

// serveGRPC serves until stopGRPC; errors go to errc.
func (a *App) serveGRPC(errc chan<- error) {
	if a.grpc == nil {
		return
	}
	a.log.Info("rate limit service listening", "addr", a.GRPCAddr(), "domains", a.rls.Config().Domains())
	go func() {
		if err := a.grpc.Serve(a.grpcLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errc <- fmt.Errorf("grpc: %w", err)
		}
	}()
}

// stopGRPC drains the calls in flight until ctx ends, then stops.
func (a *App) stopGRPC(ctx context.Context) {
	if a.grpc == nil {
		return
	}
	done := make(chan struct{})
	go func() { a.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		a.grpc.Stop()
	}
}
