package main

// The kubelet port: where its serving certificate comes from, its TLS, and
// the authentication and authorization in front of it.

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"

	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"

	"github.com/sandman-dev/sandman/vk/kubeletauth"
	"github.com/sandman-dev/sandman/vk/kubeletcert"
)

// startServingCert asks for the kubelet serving certificate with
// --serving-cert=csr (nil otherwise) and renews it until ctx ends (wg
// waits): asked for early, so the request runs while the node agents sync.
func startServingCert(ctx context.Context, wg *sync.WaitGroup, o options, client kubernetes.Interface, log *slog.Logger) (*kubeletcert.Manager, error) {
	if o.serving != servingCSR {
		return nil, nil
	}
	certs, err := kubeletcert.New(kubeletcert.Config{Client: client, NodeName: o.nodeName, NodeIPs: o.nodeIPs, Logger: log})
	if err != nil {
		return nil, err
	}
	wg.Go(func() {
		if err := certs.Run(ctx); err != nil && ctx.Err() == nil {
			log.Error("kubelet serving certificate", "err", err)
		}
	})
	return certs, nil
}

// waitServingCert waits --serving-cert-timeout for the first serving
// certificate.
func waitServingCert(ctx context.Context, o options, certs *kubeletcert.Manager, log *slog.Logger) error {
	wctx, cancel := context.WithTimeout(ctx, o.servingCertTimeout)
	err := certs.Wait(wctx)
	cancel()
	if err != nil {
		return fmt.Errorf("--serving-cert=csr: waited %s: %w", o.servingCertTimeout, err)
	}
	log.Info("kubelet serving certificate issued", "vnode", o.nodeName, "expires", certs.Expiry())
	return nil
}

// kubeletServer is what the kubelet port serves: mux (where vk.NewNode
// attaches the kubelet API and sandman's own routes) behind a kubelet's
// authentication and authorization (vk/kubeletauth), with its TLS
// configuration (nil: the port is not served). Watched files are
// followed until ctx ends (wg waits).
func kubeletServer(ctx context.Context, wg *sync.WaitGroup, o options, client kubernetes.Interface, certs *kubeletcert.Manager, log *slog.Logger) (
	mux *http.ServeMux, handler http.Handler, tlsConfig *tls.Config, err error) {
	mux = http.NewServeMux()
	handler = mux
	if certs != nil || o.tlsCert != "" {
		auth, err := kubeletAuth(ctx, wg, o, client, log)
		if err != nil {
			return nil, nil, nil, err
		}
		handler = auth.Handler(mux)
	}
	switch {
	case certs != nil:
		if tlsConfig, err = kubeletTLSConfig(kubeletTLSOptions("", "", o.clientCA, certs.GetCertificate)); err != nil {
			return nil, nil, nil, err
		}
	case o.tlsCert != "":
		// Files are watched: a Secret mounted there (say, cert-manager's)
		// renews the certificate without a restart.
		getCert, err := reloadingKeyPair(ctx, wg, o.tlsCert, o.tlsKey)
		if err != nil {
			return nil, nil, nil, err
		}
		if tlsConfig, err = kubeletTLSConfig(kubeletTLSOptions("", "", o.clientCA, getCert)); err != nil {
			return nil, nil, nil, err
		}
	default:
		log.Warn("no --tls-cert-file and --serving-cert=file: the kubelet API (kubectl logs/exec) is not served")
	}
	return mux, handler, tlsConfig, nil
}

// listen binds addr for the listener flag names, or says which flag and
// address could not be bound and why.
func listen(flag, addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s=%s: %w", flag, addr, err)
	}
	return l, nil
}

// kubeletTLSConfig is the kubelet port's TLS configuration as
// nodeutil.WithTLSConfig makes it (its ciphers and minimum version) with
// opts applied.
func kubeletTLSConfig(opts []func(*tls.Config) error) (*tls.Config, error) {
	var c nodeutil.NodeConfig
	if err := nodeutil.WithTLSConfig(opts...)(&c); err != nil {
		return nil, fmt.Errorf("kubelet TLS: %w", err)
	}
	return c.TLSConfig, nil
}

// inClusterCA is the cluster CA as every pod sees it.
const inClusterCA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"

// Where the kubelet serving certificate comes from.
const (
	servingFile = "file"
	servingCSR  = "csr"
)

// servingMode resolves --serving-cert: csr in a cluster unless certificate
// files are given, files otherwise (the local stack's host processes).
func servingMode(o options) (string, error) {
	switch o.servingCert {
	case "":
		if o.tlsCert == "" && o.kubeconfig == "" {
			return servingCSR, nil
		}
		return servingFile, nil
	case servingFile:
		return servingFile, nil
	case servingCSR:
		if o.tlsCert != "" {
			return "", errors.New("--serving-cert=csr and --tls-cert-file exclude each other")
		}
		return servingCSR, nil
	}
	return "", fmt.Errorf("--serving-cert: %q is neither file nor csr", o.servingCert)
}

// reloadingKeyPair serves the key pair in certFile and keyFile, read again
// whenever either changes (a mounted Secret is updated in place) until ctx
// ends; wg waits for the watch.
func reloadingKeyPair(ctx context.Context, wg *sync.WaitGroup, certFile, keyFile string) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), error) {
	if keyFile == "" {
		return nil, errors.New("--tls-cert-file needs --tls-key-file")
	}
	kp, err := dynamiccertificates.NewDynamicServingContentFromFiles("kubelet-serving", certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert-file, --tls-key-file: %w", err)
	}
	wg.Go(func() { kp.Run(ctx, 1) })
	var mu sync.Mutex
	var lastCert []byte
	var last *tls.Certificate
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		certPEM, keyPEM := kp.CurrentCertKeyContent()
		mu.Lock()
		defer mu.Unlock()
		if last != nil && bytes.Equal(certPEM, lastCert) {
			return last, nil
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("kubelet serving certificate %s: %w", certFile, err)
		}
		lastCert, last = certPEM, &pair
		return last, nil
	}, nil
}

// kubeletTLSOptions configures the kubelet port's TLS: the serving
// certificate from getCert (asked at every handshake, so a renewed one is
// used without a restart) or else from files; with a client CA, client
// certificates are asked for (naming the CA) but not required, as a kubelet
// does: a client may bring a bearer token instead, and kubeletauth verifies
// whichever it brings. Without one, none is asked for.
func kubeletTLSOptions(certFile, keyFile, clientCA string, getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) []func(*tls.Config) error {
	var opts []func(*tls.Config) error
	if getCert != nil {
		opts = append(opts, func(c *tls.Config) error {
			c.GetCertificate = getCert
			return nil
		})
	} else {
		opts = append(opts, nodeutil.WithKeyPairFromPath(certFile, keyFile))
	}
	if clientCA == "" {
		return append(opts, func(c *tls.Config) error {
			c.ClientAuth = tls.NoClientCert
			return nil
		})
	}
	return append(opts, func(c *tls.Config) error {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return fmt.Errorf("--client-ca-file: %w", err)
		}
		c.ClientAuth = tls.RequestClientCert
		return nodeutil.WithCACert(pem)(c)
	})
}

// kubeletAuth builds what guards the kubelet port from the flags; the
// client CA file is watched for changes until ctx ends (wg waits for it).
func kubeletAuth(ctx context.Context, wg *sync.WaitGroup, o options, client kubernetes.Interface, log *slog.Logger) (*kubeletauth.Auth, error) {
	cfg := kubeletauth.Config{
		NodeName: o.nodeName, Client: client, TokenWebhook: o.tokenWebhook, Anonymous: o.anonymousAuth,
		Mode: kubeletauth.Mode(o.authorizationMode), TokenCacheTTL: o.tokenCacheTTL, AllowCacheTTL: o.allowTTL, DenyCacheTTL: o.denyTTL,
		Logger: log.With("subsystem", "kubelet-auth"),
	}
	if o.clientCA != "" {
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("client-ca-bundle", o.clientCA)
		if err != nil {
			return nil, fmt.Errorf("--client-ca-file: %w", err)
		}
		wg.Go(func() { ca.Run(ctx, 1) })
		cfg.ClientCA = ca
	}
	auth, err := kubeletauth.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubelet API: %w", err)
	}
	log.Info("kubelet API clients", "client-ca", o.clientCA, "token-review", o.tokenWebhook, "anonymous", o.anonymousAuth, "authorization", o.authorizationMode)
	if o.clientCA == "" {
		log.Warn("no --client-ca-file: client certificates authenticate no one on the kubelet API, the apiserver's own included, " +
			"so kubectl exec/logs through the apiserver get 401; only bearer tokens get in")
	}
	if cfg.Mode == kubeletauth.ModeAlwaysAllow {
		log.Warn("--authorization-mode=AlwaysAllow: whoever authenticates to the kubelet API may exec into every sandbox (tests and local experiments only)", "anonymous", o.anonymousAuth)
	}
	return auth, nil
}

// kubeletPort is the port of --kubelet-listen (10250 when it has none).
func kubeletPort(listen string) int32 {
	_, p, err := net.SplitHostPort(listen)
	if err != nil {
		return 10250
	}
	var n int32
	_, _ = fmt.Sscan(p, &n)
	return n
}
