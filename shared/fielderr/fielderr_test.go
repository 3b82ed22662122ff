package fielderr

import (
	"errors"
	"fmt"
	"testing"
)

var errKind = errors.New("invalid thing")

func TestError(t *testing.T) {
	tests := []struct {
		name string
		err  *Error
		want string
	}{
		{"field", New("limit", "must be in 1..%d", 10), "limit: must be in 1..10"},
		{"no args keeps percent", New("path", "100% wrong"), "path: 100% wrong"},
		{"kind without field", &Error{Reason: "empty id", Kind: errKind}, "invalid thing: empty id"},
		{"bare", &Error{Reason: "bad"}, "bad"},
		{"index under parent", New("[2].id", "taken").In("rules"), "rules[2].id: taken"},
		{"field under parent", New("max", "too big").In("lease"), "lease.max: too big"},
		{"field-less under parent", (&Error{Reason: "empty id", Kind: errKind}).In("user_id"), "user_id: empty id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Fatalf("Error() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestAsAndIs(t *testing.T) {
	base := &Error{Reason: "empty id", Kind: errKind}
	wrapped := fmt.Errorf("load: %w", base.In("exemptions.users[0]"))
	fe, ok := As(wrapped)
	if !ok || fe.Field != "exemptions.users[0]" || fe.Reason != "empty id" {
		t.Fatalf("As = %+v, %v", fe, ok)
	}
	if !errors.Is(wrapped, errKind) {
		t.Fatal("errors.Is lost the kind through In and wrapping")
	}
	if base.Field != "" {
		t.Fatal("In changed its receiver")
	}
	if _, ok := As(errors.New("plain")); ok {
		t.Fatal("As found a field error in a plain error")
	}
}

func TestAt(t *testing.T) {
	if got := At("rules", New("[1].id", "taken")).Error(); got != "rules[1].id: taken" {
		t.Fatalf("At(field error) = %q", got)
	}
	if got := At("jwt.jwks", errors.New("not JSON")).Error(); got != "jwt.jwks: not JSON" {
		t.Fatalf("At(plain error) = %q", got)
	}
}
