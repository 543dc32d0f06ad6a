package main

import (
	"context"
	"fmt"
	"time"
)

// templateSnapRepo is where the e2b suite's templates built from code are
// pushed in the stack's registry.
const templateSnapRepo = "sandman-bench-e2b-templates"

// benchTemplate: a template built from code with the official SDK (a small
// Python project, 5 steps: COPY, ENV and three RUNs, cache skipped)
// against the same steps run by hand in a sandbox through the SDK and
// snapshotted (createSnapshot), each from Sandbox.create or Template.build
// until the snapshot is in the registry; and a rebuild of the same steps,
// which the step cache answers.
func benchTemplate(ctx context.Context, gw *benchGateway, sdk, image string, n int) ([]row, error) {
	n = max(1, min(n, 5))
	byHand, err := gw.sdkScript(ctx, sdk, "bench_template.mjs", "real", "by-hand", n, image)
	if err != nil {
		return nil, err
	}
	built, err := gw.sdkScript(ctx, sdk, "bench_template.mjs", "real", "build", n, image)
	if err != nil {
		return nil, err
	}
	cached, err := gw.sdkScript(ctx, sdk, "bench_template.mjs", "real", "cached", max(n, 10), image)
	if err != nil {
		return nil, err
	}
	return []row{
		{name: "5 steps by hand: Sandbox.create, files.write, 3 × commands.run, createSnapshot (baseline)", n: len(byHand.d),
			p50: ms(byHand.d.p50()), p99: ms(byHand.d.p99()), baseline: "-", ratio: "1.00×"},
		{name: "Template.build of the same 5 steps (cache skipped)", n: len(built.d), p50: ms(built.d.p50()), p99: ms(built.d.p99()),
			baseline: "by hand", ratio: ratio(built.d.p50(), byHand.d.p50()), note: "target ≤ 1.2×"},
		{name: "Template.build again, every step cached", n: len(cached.d), p50: ms(cached.d.p50()), p99: ms(cached.d.p99()),
			baseline: "-", ratio: "-", note: fmt.Sprintf("target ≤ %s", 2*time.Second)},
	}, nil
}
