package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

// benchDaemon measures the daemon over loopback TCP, as a separate process
// built exactly as it ships (static, stripped).
func benchDaemon(cfg config) ([]row, error) {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "sandman-bench-daemon")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin, err := buildDaemon(cfg.root, tmp)
	if err != nil {
		return nil, err
	}
	const token = "bench-token"
	sum := sha256.Sum256([]byte(token))
	port := "127.0.0.1:49983"
	d := exec.Command(bin, "--listen", port, "--token-sha256", hex.EncodeToString(sum[:]),
		"--subreaper", "--state-dir", filepath.Join(tmp, "state"), "--log-level", "warn")
	d.Stderr = os.Stderr
	if err := d.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = d.Process.Kill(); _ = d.Wait() }()
	c, err := client.New(port, client.WithToken(token))
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := c.Health(ctx); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("daemon did not answer on %s", port)
		}
		time.Sleep(10 * time.Millisecond)
	}
	idleRSS, err := rssKB(d.Process.Pid)
	if err != nil {
		return nil, err
	}

	var rows []row
	truePath, err := exec.LookPath("true")
	if err != nil {
		return nil, err
	}
	// Interleaved: one fork+exec, one daemon exec, in turn.
	fork, execTrue, err := timeInterleaved(cfg.n, func() error { return exec.Command(truePath).Run() }, func() error {
		r, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"true"}})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", r.ExitCode)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	rows = append(rows, row{name: "fork+exec `true` in Go (baseline)", n: cfg.n, p50: ms(fork.p50()), p99: ms(fork.p99()), baseline: "-", ratio: "1.00×"})
	rows = append(rows, row{name: "daemon exec `true` round trip (loopback)", n: cfg.n, p50: ms(execTrue.p50()), p99: ms(execTrue.p99()),
		baseline: "fork+exec `true`", ratio: ratio(execTrue.p50(), fork.p50()), note: "interleaved with the baseline; goal ≤ 1.3×"})

	// The HTTP round trip alone (what an exec pays beyond its fork+exec).
	health, err := timeN(cfg.n, func() error { _, err := c.Health(ctx); return err })
	if err != nil {
		return nil, err
	}
	rows = append(rows, row{name: "daemon health round trip (HTTP alone)", n: cfg.n, p50: ms(health.p50()), p99: ms(health.p99()),
		baseline: "daemon exec `true`", ratio: ratio(health.p50(), execTrue.p50())})

	sess, err := c.CreateSession(ctx, api.SessionRequest{})
	if err != nil {
		return nil, err
	}
	run, err := timeN(cfg.n, func() error {
		r, err := c.Run(ctx, sess.ID, api.RunRequest{Command: "true"})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("session run exited %d", r.ExitCode)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	rows = append(rows, row{name: "session run `true` round trip", n: cfg.n, p50: ms(run.p50()), p99: ms(run.p99()),
		baseline: "daemon exec `true`", ratio: ratio(run.p50(), execTrue.p50())})

	// 100 MiB upload and download, against writing and reading the same
	// file directly on the same disk.
	const size = 100 << 20
	data := make([]byte, size)
	_, _ = rand.Read(data)
	target := filepath.Join(tmp, "upload.bin")
	direct := filepath.Join(tmp, "direct.bin")
	const reps = 5
	var up, down, wr, rd []float64
	for range reps {
		t0 := time.Now()
		if err := os.WriteFile(direct, data, 0o644); err != nil {
			return nil, err
		}
		wr = append(wr, mbps(size, time.Since(t0)))
		t0 = time.Now()
		if _, err := c.WriteFile(ctx, target, bytes.NewReader(data), 0o644); err != nil {
			return nil, err
		}
		up = append(up, mbps(size, time.Since(t0)))
		t0 = time.Now()
		b, err := os.ReadFile(direct)
		if err != nil || len(b) != size {
			return nil, fmt.Errorf("read direct: %v", err)
		}
		rd = append(rd, mbps(size, time.Since(t0)))
		t0 = time.Now()
		rc, err := c.ReadFile(ctx, target)
		if err != nil {
			return nil, err
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil || n != size {
			return nil, fmt.Errorf("download: %d bytes, %v", n, err)
		}
		down = append(down, mbps(size, time.Since(t0)))
	}
	rows = append(rows,
		row{name: "100 MiB upload (PUT /v1/files)", n: reps, p50: fmt.Sprintf("%.0f MB/s", median(up)), p99: fmt.Sprintf("%.0f MB/s (min)", slices.Min(up)),
			baseline: fmt.Sprintf("os.WriteFile %.0f MB/s", median(wr)), ratio: fmt.Sprintf("%.2f×", median(up)/median(wr)), note: "target ≥ 500 MB/s"},
		row{name: "100 MiB download (GET /v1/files)", n: reps, p50: fmt.Sprintf("%.0f MB/s", median(down)), p99: fmt.Sprintf("%.0f MB/s (min)", slices.Min(down)),
			baseline: fmt.Sprintf("os.ReadFile %.0f MB/s", median(rd)), ratio: fmt.Sprintf("%.2f×", median(down)/median(rd)), note: "target ≥ 500 MB/s"},
	)
	afterRSS, err := rssKB(d.Process.Pid)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(bin)
	if err != nil {
		return nil, err
	}
	rows = append(rows,
		row{name: "daemon idle RSS at start", n: 1, p50: fmt.Sprintf("%.1f MB", float64(idleRSS)/1024), p99: "-", baseline: "-", ratio: "-", note: "target ≤ 10 MB"},
		row{name: "daemon RSS after the runs above", n: 1, p50: fmt.Sprintf("%.1f MB", float64(afterRSS)/1024), p99: "-", baseline: "-", ratio: "-"},
		row{name: "daemon binary size (static, stripped)", n: 1, p50: fmt.Sprintf("%.1f MB", float64(fi.Size())/1e6), p99: "-", baseline: "-", ratio: "-"},
	)
	return rows, nil
}

func mbps(n int, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// rssKB reads VmRSS of pid.
func rssKB(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// buildDaemon builds the daemon as it ships (static, stripped) into dir.
func buildDaemon(root, dir string) (string, error) {
	bin := filepath.Join(dir, "sandman-daemon")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/sandman-daemon")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build daemon: %v\n%s", err, out)
	}
	return bin, nil
}
