package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandman-dev/sandman/podcontract"
)

// Signed file URLs (the SDK's uploadUrl and downloadUrl on a secure
// sandbox) carry no access token but a signature in the query: "v1_" and
// the unpadded standard base64 of SHA-256 over
// "<path>:<operation>:<user>:<envd access token>[:<expiration>]", where
// path and user are the URL's path= and username= ("" when absent), the
// operation "read" for a download (GET /files) and "write" for an upload
// (POST /files), and the expiration, when the URL has one, the Unix
// second in signature_expiration= after which it is refused (the SDK's
// getSignature; envd's validateSigning). The daemon keeps only a hash of
// the token and cannot check one; the gateway derives the token, checks
// the signature in constant time and forwards the request with the token
// in X-Access-Token.
const (
	querySignature  = "signature"
	queryExpiration = "signature_expiration"
	signaturePrefix = "v1_"
)

// signed says whether r is a signed file URL.
func signed(r *http.Request) bool {
	return r.URL.Path == "/files" && r.URL.Query().Get(querySignature) != ""
}

// signingOperation is the operation a request on /files signs.
func signingOperation(method string) (string, bool) {
	switch method {
	case http.MethodGet:
		return "read", true
	case http.MethodPost:
		return "write", true
	}
	return "", false
}

// fileSignature is the signature of an operation on path as user with
// token, expiring at exp ("" for never).
func fileSignature(path, operation, user, token, exp string) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if exp != "" {
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	return signaturePrefix + base64.RawStdEncoding.EncodeToString(sum[:])
}

// signedParams are what a signed request's query says, checked for form.
type signedParams struct {
	path, user, operation, signature string
	// exp is the expiration as signed ("": none); expired is set when it
	// lies before now.
	exp     string
	expired bool
	// bad says what is malformed ("": nothing).
	bad string
}

func readSigned(r *http.Request, now time.Time) signedParams {
	q := r.URL.Query()
	p := signedParams{path: q.Get("path"), user: q.Get("username"), signature: q.Get(querySignature)}
	op, ok := signingOperation(r.Method)
	if !ok {
		p.bad = "a signed file URL is for GET (download) or POST (upload), not " + r.Method
		return p
	}
	p.operation = op
	if raw := q.Get(queryExpiration); raw != "" {
		exp, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			p.bad = queryExpiration + " " + strconv.Quote(raw) + " is not a Unix time in seconds"
			return p
		}
		p.exp = strconv.FormatInt(exp, 10)
		p.expired = exp < now.Unix()
	}
	if !strings.HasPrefix(p.signature, signaturePrefix) {
		p.bad = "the signature is not of E2B's v1 form"
	}
	return p
}

// signatureCheck is the podCheck of a signed request: the pod must be the
// gateway's sandbox in a key's namespace, and the signature made with its
// access token for this path, user and operation, and not expired.
func (g *Gateway) signatureCheck(r *http.Request, now time.Time) podCheck {
	p := readSigned(r, now)
	return func(pod *corev1.Pod, id, _ string) verdict {
		if !g.proven(pod, id) {
			return notOurs
		}
		if p.bad != "" || p.expired {
			return wrongToken
		}
		tok, ok := g.cfg.Tokens.Recover(pod.Namespace, id, pod.Annotations[podcontract.AnnotationTokenSHA256])
		if !ok {
			return wrongToken
		}
		want := fileSignature(p.path, p.operation, p.user, tok, p.exp)
		if subtle.ConstantTimeCompare([]byte(want), []byte(p.signature)) != 1 {
			return wrongToken
		}
		return tokenMatches
	}
}

// signatureRefusal says why a signed request was refused.
func signatureRefusal(r *http.Request, now time.Time) string {
	p := readSigned(r, now)
	switch {
	case p.bad != "":
		return p.bad
	case p.expired:
		exp, _ := strconv.ParseInt(p.exp, 10, 64)
		return "the signature expired at " + time.Unix(exp, 0).UTC().Format(time.RFC3339) + ": ask for a new URL"
	}
	return "the signature is not this sandbox's for this path, user and operation: sign with the sandbox's own envdAccessToken (uploadUrl, downloadUrl)"
}
