// Package credential keeps the decision tokens as digests, computed once per
// configuration, and checks a presented token against them: the HTTP
// decision route and the gRPC rate limit service check the same way.
package credential

import (
	"crypto/sha256"
	"crypto/subtle"
)

// Digests are the SHA-256 of the accepted tokens; none means no token is
// configured.
type Digests [][sha256.Size]byte

// Of digests tokens.
func Of(tokens []string) Digests {
	d := make(Digests, 0, len(tokens))
	for _, t := range tokens {
		d = append(d, sha256.Sum256([]byte(t)))
	}
	return d
}

// Trusted reports whether got is one of the tokens. Every digest is
// compared, so the time taken does not say which one (or whether the first)
// matched; an empty token never is.
func (d Digests) Trusted(got []byte) bool {
	gh := sha256.Sum256(got)
	ok := 0
	for i := range d {
		ok |= subtle.ConstantTimeCompare(gh[:], d[i][:])
	}
	return len(got) > 0 && ok == 1
}
