package gateway

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"

	"github.com/sandman-dev/sandman/podcontract"
)

// maxMaskLen bounds a maskRequestHost (a host name and port, ${PORT}
// included).
const maxMaskLen = 300

// maxHTTPSPorts bounds a sandbox's httpsPorts.
const maxHTTPSPorts = 64

// httpsPorts are a pod's network.httpsPorts.
func httpsPorts(pod *corev1.Pod) []int {
	var out []int
	for f := range strings.SplitSeq(pod.Annotations[podcontract.AnnotationE2BHTTPSPorts], ",") {
		if p, err := strconv.Atoi(f); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// withIngress adds to a new sandbox's annotations what its network config
// says of ingress, and the ports the gateway may reach on it:
//   - sandman.io/control-ports, the gateway's SandboxPorts: the node's
//     firewall opens them to the control plane alone (the gateway among
//     it), so getHost traffic reaches the sandbox's servers and nobody
//     else gains a port;
//   - allowPublicTraffic as asked (absent: public, E2B's default; false:
//     the sandbox's ports need its traffic access token);
//   - maskRequestHost, the Host its servers see;
//   - httpsPorts, the ports whose servers speak TLS (the gateway
//     forwards to them over HTTPS, certificates unchecked, as E2B's
//     proxy does).
func (g *Gateway) withIngress(n *networkConfig, annotations map[string]string) (map[string]string, error) {
	out := maps.Clone(annotations)
	if out == nil {
		out = map[string]string{}
	}
	out[podcontract.AnnotationControlPorts] = g.cfg.SandboxPorts
	if n == nil {
		return out, nil
	}
	if len(n.HTTPSPorts) > 0 {
		if len(n.HTTPSPorts) > maxHTTPSPorts {
			return nil, errorf(errdefs.ErrInvalidArgument, "network.httpsPorts: %d ports, at most %d", len(n.HTTPSPorts), maxHTTPSPorts)
		}
		ports := slices.Clone(n.HTTPSPorts)
		for _, p := range ports {
			if p < 1 || p > 65535 {
				return nil, errorf(errdefs.ErrInvalidArgument, "network.httpsPorts: port %d: want 1 to 65535", p)
			}
		}
		slices.Sort(ports)
		var s []string
		for _, p := range slices.Compact(ports) {
			s = append(s, strconv.Itoa(p))
		}
		out[podcontract.AnnotationE2BHTTPSPorts] = strings.Join(s, ",")
	}
	if n.AllowPublicTraffic != nil {
		out[podcontract.AnnotationE2BPublicTraffic] = strconv.FormatBool(*n.AllowPublicTraffic)
	}
	if n.MaskRequestHost != nil && *n.MaskRequestHost != "" {
		m := *n.MaskRequestHost
		if len(m) > maxMaskLen || strings.ContainsFunc(m, func(r rune) bool { return r <= ' ' || r >= 0x7f || strings.ContainsRune("/?#@\\", r) }) {
			return nil, errorf(errdefs.ErrInvalidArgument, "network.maskRequestHost %q: want a host, optionally with a port, such as localhost:${PORT} (at most %d characters)", m, maxMaskLen)
		}
		out[podcontract.AnnotationE2BMaskRequestHost] = m
	}
	return out, nil
}

// trafficToken is what create and connect return as trafficAccessToken:
// the sandbox's traffic access token when its ports need one, else nil
// (as E2B, which makes one only for allowPublicTraffic false).
func (g *Gateway) trafficToken(pod *corev1.Pod) *string {
	if pod == nil || publicTraffic(pod) {
		return nil
	}
	t, ok := g.cfg.Tokens.Traffic(pod.Namespace, pod.Name, pod.Annotations[podcontract.AnnotationTokenSHA256])
	if !ok {
		return nil
	}
	return &t
}
