package kubeletauth

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/kubernetes"
)

// Mode is how authenticated requests are authorized.
type Mode string

const (
	// ModeWebhook asks the apiserver with a SubjectAccessReview.
	ModeWebhook Mode = "Webhook"
	// ModeAlwaysAllow lets every authenticated request in: anyone who can
	// authenticate (with anonymous auth, anyone at all) may exec into every
	// sandbox. For tests and local experiments only.
	ModeAlwaysAllow Mode = "AlwaysAllow"
)

// The kubelet's defaults (KubeletConfiguration v1beta1).
const (
	DefaultTokenCacheTTL = 2 * time.Minute
	DefaultAllowCacheTTL = 5 * time.Minute
	DefaultDenyCacheTTL  = 30 * time.Second
)

// Config configures an Auth.
type Config struct {
	// NodeName is the node every SubjectAccessReview names. Required.
	NodeName string
	// Client makes the TokenReviews and SubjectAccessReviews; required
	// with TokenWebhook or ModeWebhook.
	Client kubernetes.Interface
	// ClientCA verifies client certificates (user = CN, groups = O); nil:
	// certificates authenticate no one.
	ClientCA dynamiccertificates.CAContentProvider
	// TokenWebhook authenticates bearer tokens with TokenReviews.
	TokenWebhook bool
	// Anonymous lets unauthenticated requests through as system:anonymous
	// (group system:unauthenticated), to be authorized like any other.
	Anonymous bool
	// Mode defaults to ModeWebhook.
	Mode Mode
	// How long a TokenReview's answer, an allowed and a refused
	// SubjectAccessReview are kept (default the kubelet's: 2 min, 5 min,
	// 30 s).
	TokenCacheTTL, AllowCacheTTL, DenyCacheTTL time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Auth guards the kubelet port's handler.
type Auth struct {
	nodeName string
	authn    authenticator.Request
	authz    authorizer.Authorizer
	log      *slog.Logger
}

// New builds the authenticator and the authorizer.
func New(cfg Config) (*Auth, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("kubeletauth: no node name")
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeWebhook
	}
	if cfg.TokenCacheTTL == 0 {
		cfg.TokenCacheTTL = DefaultTokenCacheTTL
	}
	if cfg.AllowCacheTTL == 0 {
		cfg.AllowCacheTTL = DefaultAllowCacheTTL
	}
	if cfg.DenyCacheTTL == 0 {
		cfg.DenyCacheTTL = DefaultDenyCacheTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if (cfg.TokenWebhook || cfg.Mode == ModeWebhook) && cfg.Client == nil {
		return nil, errors.New("kubeletauth: TokenReviews and SubjectAccessReviews need a client")
	}
	if cfg.ClientCA == nil && !cfg.TokenWebhook && !cfg.Anonymous {
		return nil, errors.New("no way to authenticate kubelet API clients: give a client CA, or enable token authentication (TokenReview) or anonymous requests")
	}

	authnCfg := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                          &apiserver.AnonymousAuthConfig{Enabled: cfg.Anonymous},
		CacheTTL:                           cfg.TokenCacheTTL,
		ClientCertificateCAContentProvider: cfg.ClientCA,
	}
	if cfg.TokenWebhook {
		authnCfg.TokenAccessReviewClient = cfg.Client.AuthenticationV1()
		authnCfg.WebhookRetryBackoff = options.DefaultAuthWebhookRetryBackoff()
	}
	authn, _, err := authnCfg.New()
	if err != nil {
		return nil, fmt.Errorf("kubelet API authentication: %w", err)
	}

	var authz authorizer.Authorizer
	switch cfg.Mode {
	case ModeAlwaysAllow:
		authz = authorizerfactory.NewAlwaysAllowAuthorizer()
	case ModeWebhook:
		authz, err = authorizerfactory.DelegatingAuthorizerConfig{
			SubjectAccessReviewClient: cfg.Client.AuthorizationV1(),
			AllowCacheTTL:             cfg.AllowCacheTTL,
			DenyCacheTTL:              cfg.DenyCacheTTL,
			WebhookRetryBackoff:       options.DefaultAuthWebhookRetryBackoff(),
		}.New()
		if err != nil {
			return nil, fmt.Errorf("kubelet API authorization: %w", err)
		}
	default:
		return nil, fmt.Errorf("authorization mode %q is neither %s nor %s", cfg.Mode, ModeWebhook, ModeAlwaysAllow)
	}
	return &Auth{nodeName: cfg.NodeName, authn: authn, authz: authz, log: cfg.Logger}, nil
}

// Handler lets a request on to next once it is authenticated (else 401)
// and authorized for one of its attributes (else 403; 500 when the
// apiserver could not say).
func (a *Auth) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, ok, err := a.authn.AuthenticateRequest(r)
		if err != nil || !ok {
			if err != nil {
				a.log.Info("kubelet API: unauthenticated request", "path", r.URL.Path, "remote", r.RemoteAddr, "err", err)
			}
			metricRequests.WithLabelValues(outcomeUnauthenticated).Inc()
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		attrs := a.attributes(resp.User, r)
		subresources := make([]string, 0, len(attrs))
		for _, attr := range attrs {
			subresources = append(subresources, attr.GetSubresource())
			decision, _, err := a.authz.Authorize(r.Context(), attr)
			if err != nil {
				a.log.Warn("kubelet API: authorization error", "user", attr.GetUser().GetName(), "verb", attr.GetVerb(),
					"subresource", attr.GetSubresource(), "err", err)
				metricRequests.WithLabelValues(outcomeError).Inc()
				http.Error(w, fmt.Sprintf("Authorization error (user=%s, verb=%s, resource=%s, subresource=%s)",
					attr.GetUser().GetName(), attr.GetVerb(), attr.GetResource(), attr.GetSubresource()), http.StatusInternalServerError)
				return
			}
			if decision == authorizer.DecisionAllow {
				metricRequests.WithLabelValues(outcomeAllowed).Inc()
				next.ServeHTTP(w, r)
				return
			}
		}
		// The attributes differ only by subresource.
		u := attrs[0]
		a.log.Debug("kubelet API: forbidden", "user", u.GetUser().GetName(), "verb", u.GetVerb(), "subresources", subresources, "path", r.URL.Path)
		metricRequests.WithLabelValues(outcomeForbidden).Inc()
		http.Error(w, fmt.Sprintf("Forbidden (user=%s, verb=%s, resource=%s, subresource(s)=%v)",
			u.GetUser().GetName(), u.GetVerb(), u.GetResource(), subresources), http.StatusForbidden)
	})
}
