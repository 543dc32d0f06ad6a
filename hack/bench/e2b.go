package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	daemonapi "github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/daemon/envd/spec/process"
	"github.com/sandman-dev/sandman/daemon/envd/spec/process/processconnect"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
)

// benchE2B: the E2B path beside sandman's own, same run. A sandbox created
// with the official SDK through sandman-gateway until its first command
// answers, against a pod created directly and its daemon's v1 exec; one
// command through the gateway and envd's protocol against v1 exec direct;
// and 500 Sandbox.create at once from one SDK process (on runtime/fake
// agents: the gateway and the virtual node are what is measured), with the
// gateway's CPU per sandbox.
func benchE2B(cfg config) ([]row, error) {
	b, ctx, done, err := newVKBench(cfg, "sandman-bench-e2b")
	if err != nil {
		return nil, err
	}
	defer done()
	image := b.env["DEBIAN_IMAGE"]
	sdk, err := installSDK(cfg.root)
	if err != nil {
		return nil, err
	}
	rt, stopRT, err := b.be.startRuntime(ctx, "bench-e2b", func(c *noderuntime.Config) {
		c.Slots, c.WarmSlots = 8, 4
		c.SnapshotRegistry = b.env["REGISTRY"] + "/" + templateSnapRepo // templates built from code
	})
	if err != nil {
		return nil, err
	}
	defer stopRT()
	agents, stopAgents, err := serveAgents(ctx, map[string]runtime.Runtime{"bench-e2b": rt})
	if err != nil {
		return nil, err
	}
	defer stopAgents()
	// The gateway's snapshots (createSnapshot, template builds) reach
	// the virtual node through the apiserver's node proxy: its kubelet
	// port serves TLS at the node IP, as a deployed one does.
	pki := b.env["PKI"]
	vk, err := b.startVK(ctx, "e2b", agents, "--tls-cert-file", filepath.Join(pki, "kubelet-serving.crt"),
		"--tls-key-file", filepath.Join(pki, "kubelet-serving.key"), "--client-ca-file", filepath.Join(pki, "ca.crt"))
	if err != nil {
		return nil, err
	}
	defer vk.stop(b.kube)

	// 500 fake slots for the concurrent creates.
	fakes := map[string]runtime.Runtime{}
	for i := range 5 {
		name := fmt.Sprintf("fake-e2b-%d", i)
		f, err := fake.New(fake.Config{Node: name, Slots: 120, IPBase: fmt.Sprintf("10.252.%d", i),
			BindLatency: 20 * time.Millisecond, ReadyLatency: 5 * time.Millisecond})
		if err != nil {
			return nil, err
		}
		defer f.Close()
		fakes[name] = f
	}
	fakeAgents, stopFakes, err := serveAgents(ctx, fakes)
	if err != nil {
		return nil, err
	}
	defer stopFakes()
	vkFake, err := b.startVK(ctx, "e2bfake", fakeAgents)
	if err != nil {
		return nil, err
	}
	defer vkFake.stop(b.kube)

	gw, err := b.startGateway(ctx, cfg.root, map[string]string{"real": "e2b", "fake": "e2bfake"})
	if err != nil {
		return nil, err
	}
	defer gw.stop()
	n := min(cfg.n, 50)
	var rows []row

	// Create → first command: directly, then through the SDK and gateway.
	rw, err := b.watchReady(ctx)
	if err != nil {
		return nil, err
	}
	var direct durations
	for i := range n {
		name := fmt.Sprintf("direct-%d", i)
		start := time.Now()
		if _, err := b.kube.CoreV1().Pods(b.ns).Create(ctx, b.pod(name, "e2b", image, ""), metav1.CreateOptions{}); err != nil {
			rw.stop()
			return nil, err
		}
		if _, err := rw.wait([]string{name}, 2*time.Minute); err != nil {
			rw.stop()
			return nil, err
		}
		pod, err := b.kube.CoreV1().Pods(b.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			rw.stop()
			return nil, err
		}
		c, err := client.New(pod.Status.PodIP+":49983", client.WithToken("bench"))
		if err != nil {
			rw.stop()
			return nil, err
		}
		if _, err := c.Exec(ctx, daemonapi.ExecRequest{Cmd: []string{"true"}}); err != nil {
			rw.stop()
			return nil, fmt.Errorf("direct %s: %w", name, err)
		}
		direct = append(direct, time.Since(start))
		_ = b.kube.CoreV1().Pods(b.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		if err := b.waitGone(ctx, []string{name}); err != nil {
			rw.stop()
			return nil, err
		}
	}
	rw.stop()
	viaSDK, err := gw.sdk(ctx, sdk, "real", "create-run", n, image)
	if err != nil {
		return nil, err
	}
	rows = append(rows,
		row{name: "pod create → first v1 exec answered, direct (baseline)", n: len(direct), p50: ms(direct.p50()), p99: ms(direct.p99()), baseline: "-", ratio: "1.00×"},
		row{name: "E2B SDK Sandbox.create → commands.run answered, via gateway", n: len(viaSDK.d), p50: ms(viaSDK.d.p50()), p99: ms(viaSDK.d.p99()),
			baseline: "direct", ratio: ratio(viaSDK.d.p50(), direct.p50()), note: "target ≤ 1.2×"})

	// One command: v1 exec direct, envd's Start through the gateway, the SDK.
	sb, err := gw.create(ctx, "real", image)
	if err != nil {
		return nil, err
	}
	defer gw.kill(sb.id)
	pod, err := b.kube.CoreV1().Pods(sb.namespace).Get(ctx, sb.id, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	v1, err := client.New(pod.Status.PodIP+":49983", client.WithToken(sb.token))
	if err != nil {
		return nil, err
	}
	execN := cfg.n
	v1d, err := timeN(execN, func() error {
		res, err := v1.Exec(ctx, daemonapi.ExecRequest{Cmd: []string{"true"}})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exit %d", res.ExitCode)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("v1 exec: %w", err)
	}
	pc := processconnect.NewProcessClient(http.DefaultClient, gw.url, connect.WithProtoJSON(),
		connect.WithInterceptors(sandboxHeaders(sb.id, sb.token)))
	envd, err := timeN(execN, func() error {
		stream, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "true"}}))
		if err != nil {
			return err
		}
		defer stream.Close()
		for stream.Receive() {
			if end := stream.Msg().GetEvent().GetEnd(); end != nil {
				if end.ExitCode != 0 {
					return fmt.Errorf("exit %d", end.ExitCode)
				}
				return nil
			}
		}
		if err := stream.Err(); err != nil {
			return err
		}
		return fmt.Errorf("the stream ended without an end event")
	})
	if err != nil {
		return nil, fmt.Errorf("envd Start via gateway: %w", err)
	}
	sdkRun, err := gw.sdk(ctx, sdk, "real", "run", min(execN, 200), image)
	if err != nil {
		return nil, err
	}
	rows = append(rows,
		row{name: "exec `true`, v1 API direct (baseline)", n: len(v1d), p50: ms(v1d.p50()), p99: ms(v1d.p99()), baseline: "-", ratio: "1.00×"},
		row{name: "exec `true`, envd Process.Start via gateway (Go Connect client)", n: len(envd), p50: ms(envd.p50()), p99: ms(envd.p99()),
			baseline: "v1 direct", ratio: ratio(envd.p50(), v1d.p50()), note: "extra p50 " + ms(envd.p50()-v1d.p50()) + "; target ≤ 1.5 ms"},
		row{name: "E2B SDK commands.run('true') via gateway", n: len(sdkRun.d), p50: ms(sdkRun.d.p50()), p99: ms(sdkRun.d.p99()),
			baseline: "v1 direct", ratio: ratio(sdkRun.d.p50(), v1d.p50()), note: "includes the SDK's own cost in Node.js"})

	prows, err := benchPorts(ctx, b, gw, cfg.n)
	rows = append(rows, prows...)
	if err != nil {
		return rows, err
	}

	trows, err := benchTemplate(ctx, gw, sdk, image, cfg.n)
	rows = append(rows, trows...)
	if err != nil {
		return rows, err
	}

	// 500 at once on fake agents.
	const many = 500
	cpu0 := cpuTime(gw.cmd.Process.Pid)
	conc, err := gw.sdk(ctx, sdk, "fake", "concurrent", many, b.env["BUSYBOX_IMAGE"])
	if err != nil {
		return nil, err
	}
	cpu := cpuTime(gw.cmd.Process.Pid) - cpu0
	note := fmt.Sprintf("%d of %d created, all at once in %.1f s; gateway CPU %.2f ms per sandbox (create and kill)",
		len(conc.d), many, conc.total.Seconds(), float64(cpu)/float64(time.Millisecond)/float64(many))
	if conc.failed > 0 {
		note += fmt.Sprintf("; %d FAILED: %s", conc.failed, strings.Join(conc.errors, " | "))
	}
	rows = append(rows, row{name: "500 concurrent Sandbox.create from one SDK process (fake agents)", n: len(conc.d),
		p50: ms(conc.d.p50()), p99: ms(conc.d.p99()), baseline: "-", ratio: "-", note: note})
	if conc.failed > 0 {
		return rows, fmt.Errorf("%d of %d concurrent creates failed: %s", conc.failed, many, strings.Join(conc.errors, " | "))
	}
	return rows, nil
}

// installSDK installs the pinned E2B SDK (e2e/e2b) with npm ci unless it is.
func installSDK(root string) (string, error) {
	dir := filepath.Join(root, "e2e", "e2b")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err == nil {
		return dir, nil
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm ci in %s: %v\n%s", dir, err, out)
	}
	return dir, nil
}

// benchGateway is a running sandman-gateway with a key per pool.
type benchGateway struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	url  string
	ns   string            // the keys' namespace
	keys map[string]string // key name → API key
}

func (b *vkBench) startGateway(ctx context.Context, root string, pools map[string]string) (*benchGateway, error) {
	keys := map[string]benchKey{}
	for name, pool := range pools {
		keys[name] = benchKey{pool: pool, ns: b.ns}
	}
	return b.startGatewayKeys(root, keys)
}

// benchKey is one API key of a bench gateway: its pool and namespace.
type benchKey struct{ pool, ns string }

// startGatewayKeys runs sandman-gateway with one API key per entry of
// keys, and args besides.
func (b *vkBench) startGatewayKeys(root string, keys map[string]benchKey, args ...string) (*benchGateway, error) {
	bin := filepath.Join(b.tmp, "sandman-gateway")
	build := exec.Command("go", "build", "-o", bin, "./cmd/sandman-gateway")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build sandman-gateway: %v\n%s", err, out)
	}
	g := &benchGateway{keys: map[string]string{}, ns: b.ns}
	file := map[string]map[string]string{}
	for name, k := range keys {
		key := "e2b_" + hex.EncodeToString([]byte(fmt.Sprintf("bench-%-16s", name)))
		sum := sha256.Sum256([]byte(key))
		g.keys[name] = key
		file[name] = map[string]string{"sha256": hex.EncodeToString(sum[:]), "namespace": k.ns, "pool": k.pool}
	}
	keysFile := filepath.Join(b.tmp, "e2b-keys.json")
	data, _ := json.Marshal(file)
	if err := os.WriteFile(keysFile, data, 0o600); err != nil {
		return nil, err
	}
	addr := freeAddr("127.0.0.1")
	g.url = "http://" + addr
	g.cmd = exec.Command(bin, append([]string{"--kubeconfig", b.env["KUBECONFIG"], "--listen", addr, "--metrics-listen", freeAddr("127.0.0.1"),
		"--keys-file", keysFile, "--log-level", "warn"}, args...)...)
	g.cmd.Stdout, g.cmd.Stderr = &g.out, &g.out
	if err := g.cmd.Start(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(g.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return g, nil
			}
		}
		if time.Now().After(deadline) {
			g.stop()
			return nil, fmt.Errorf("sandman-gateway did not serve: %s", g.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (g *benchGateway) stop() {
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = g.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = g.cmd.Process.Kill()
		<-done
	}
}

// sdkResult is what e2e/e2b/bench.mjs printed.
type sdkResult struct {
	d      durations
	total  time.Duration
	failed int
	errors []string
}

func (g *benchGateway) sdk(ctx context.Context, dir, key, mode string, n int, template string) (sdkResult, error) {
	return g.sdkScript(ctx, dir, "bench.mjs", key, mode, n, template)
}

// sdkScript runs one of e2e/e2b's bench scripts (node SCRIPT MODE N
// TEMPLATE) with key's API key.
func (g *benchGateway) sdkScript(ctx context.Context, dir, script, key, mode string, n int, template string) (sdkResult, error) {
	cmd := exec.CommandContext(ctx, "node", script, mode, fmt.Sprint(n), template)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+g.url, "E2B_SANDBOX_URL="+g.url, "E2B_API_KEY="+g.keys[key])
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return sdkResult{}, fmt.Errorf("node %s %s: %v\n%s\n%s", script, mode, err, out, stderr.String())
	}
	var r struct {
		MS      []float64 `json:"ms"`
		TotalMS float64   `json:"total_ms"`
		Failed  int       `json:"failed"`
		Errors  []string  `json:"errors"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
		return sdkResult{}, fmt.Errorf("node %s %s printed %q: %w", script, mode, out, err)
	}
	res := sdkResult{total: time.Duration(r.TotalMS * float64(time.Millisecond)), failed: r.Failed, errors: r.Errors}
	for _, v := range r.MS {
		res.d = append(res.d, time.Duration(v*float64(time.Millisecond)))
	}
	if mode != "concurrent" && r.Failed > 0 {
		return res, fmt.Errorf("node %s %s: %d failed: %s", script, mode, r.Failed, strings.Join(r.Errors, " | "))
	}
	return res, nil
}

// gwSandbox is a sandbox created through the gateway's control API.
type gwSandbox struct{ id, token, namespace string }

func (g *benchGateway) create(ctx context.Context, key, template string) (gwSandbox, error) {
	body, _ := json.Marshal(map[string]any{"templateID": template, "timeout": 600})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/sandboxes", bytes.NewReader(body))
	req.Header.Set("X-API-Key", g.keys[key])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return gwSandbox{}, err
	}
	defer resp.Body.Close()
	var out struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if resp.StatusCode/100 != 2 || json.NewDecoder(resp.Body).Decode(&out) != nil || out.SandboxID == "" {
		return gwSandbox{}, fmt.Errorf("create through the gateway: %s", resp.Status)
	}
	// The gateway's pods live in the key's namespace: the bench's.
	return gwSandbox{id: out.SandboxID, token: out.EnvdAccessToken, namespace: g.ns}, nil
}

func (g *benchGateway) kill(id string) {
	req, _ := http.NewRequest(http.MethodDelete, g.url+"/sandboxes/"+id, nil)
	req.Header.Set("X-API-Key", g.keys["real"])
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
}

// sandboxHeaders routes Connect calls through the gateway to a sandbox, as
// the SDK's single-endpoint mode does.
func sandboxHeaders(id, token string) connect.Interceptor {
	return headerInterceptor{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
}

type headerInterceptor map[string]string

func (h headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		for k, v := range h {
			req.Header().Set(k, v)
		}
		return next(ctx, req)
	}
}

func (h headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		for k, v := range h {
			conn.RequestHeader().Set(k, v)
		}
		return conn
	}
}

func (h headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
