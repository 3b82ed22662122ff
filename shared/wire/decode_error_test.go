package wire

import (
	"encoding/json"
	"testing"
)

func TestDecodeErrorAnswer(t *testing.T) {
	for _, tt := range []struct {
		body               string
		want               ErrorAnswer
		closed, credential bool
		wantErr            bool
	}{
		{body: `{"error":{"code":"SERVICE_UNAVAILABLE","message":"x","details":{"failure_mode":"fail_closed"},"request_id":"r"}}`,
			want: ErrorAnswer{Code: CodeServiceUnavailable, FailureMode: "fail_closed"}, closed: true},
		{body: `{"error":{"code":"SERVICE_UNAVAILABLE","details":{}}}`, want: ErrorAnswer{Code: CodeServiceUnavailable}},
		// Text that merely mentions the words decides nothing.
		{body: `{"error":{"code":"INVALID_INPUT","message":"\"code\":\"SERVICE_UNAVAILABLE\" \"failure_mode\":\"fail_closed\"","details":{}}}`,
			want: ErrorAnswer{Code: CodeInvalidInput}},
		{body: `{"error":{"code":"INVALID_INPUT","details":{"field":"\"code\":\"UNAUTHORIZED\""}}}`, want: ErrorAnswer{Code: CodeInvalidInput}},
		{body: `{"error":{"code":"UNAUTHORIZED"}}`, want: ErrorAnswer{Code: CodeUnauthorized}, credential: true},
		{body: `{"error":{"code":"FORBIDDEN","details":{"field":"tier"}}}`, want: ErrorAnswer{Code: CodeForbidden}, credential: true},
		{body: `{"Error":{"Code":"API_KEY_REVOKED","details":{"revoked_at":"2030-01-01T00:00:00Z"}}}`, want: ErrorAnswer{Code: CodeAPIKeyRevoked}},
		{body: `{"error":{"code":1}}`, wantErr: true},
		{body: `{"error":{"code":"X"}} trailing`, wantErr: true},
		{body: `not json`, wantErr: true},
		{body: ``, wantErr: true},
	} {
		var got ErrorAnswer
		err := DecodeErrorAnswer([]byte(tt.body), &got)
		if (err != nil) != tt.wantErr || !tt.wantErr && (got != tt.want || got.FailedClosed() != tt.closed || got.RefusedCredential() != tt.credential) {
			t.Errorf("%s: %+v %v", tt.body, got, err)
		}
	}
}

// FuzzDecodeErrorAnswer: what the decoder accepts, encoding/json accepts
// too, with the same code and failure mode.
func FuzzDecodeErrorAnswer(f *testing.F) {
	f.Add([]byte(`{"error":{"code":"SERVICE_UNAVAILABLE","message":"m","details":{"failure_mode":"fail_closed","n":[1,{"a":null}]}}}`))
	f.Add([]byte(`{"error":null,"ERROR":{"details":null,"code":"A","code":"B"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var mine ErrorAnswer
		if DecodeErrorAnswer(b, &mine) != nil {
			return
		}
		var theirs struct {
			Error struct {
				Code    string `json:"code"`
				Details struct {
					FailureMode string `json:"failure_mode"`
				} `json:"details"`
			} `json:"error"`
		}
		if err := json.Unmarshal(b, &theirs); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", b, err)
		}
		if mine.Code != theirs.Error.Code || mine.FailureMode != theirs.Error.Details.FailureMode {
			t.Fatalf("%q: mine %+v, json %+v", b, mine, theirs)
		}
	})
}
