// Timings of a template built from code against the same steps run by hand,
// for `make bench` (hack/bench/e2b_template.go runs it). E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY point at the gateway. Modes:
//   node bench_template.mjs build N IMAGE    N × Template.build of a small Python project (5 steps, cache skipped)
//   node bench_template.mjs cached N IMAGE   N × Template.build of the same steps, cached
//   node bench_template.mjs by-hand N IMAGE  N × (Sandbox.create, the same 5 steps by SDK calls, createSnapshot, kill)
// Prints one JSON line: {"ms": [...], "total_ms": T, "failed": F, "errors": [...]}.
import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Sandbox, Template } from 'e2b'

const [mode, nArg, image] = process.argv.slice(2)
const n = Number(nArg)
if (!mode || !(n > 0) || !image) {
  console.error('usage: node bench_template.mjs build|cached|by-hand N IMAGE')
  process.exit(2)
}

// The project: a package and its tests.
const files = {
  'project/calc/__init__.py': 'from .ops import add, mul\n',
  'project/calc/ops.py': 'def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n',
  'project/tests/test_ops.py': 'import unittest\nfrom calc import add, mul\n\n\nclass T(unittest.TestCase):\n    def test(self):\n        self.assertEqual(add(2, 3), 5)\n        self.assertEqual(mul(2, 3), 6)\n',
  'project/tests/__init__.py': '',
}
const ctxDir = mkdtempSync(join(tmpdir(), 'sandman-bench-template-'))
for (const [p, body] of Object.entries(files)) {
  mkdirSync(join(ctxDir, p, '..'), { recursive: true })
  writeFileSync(join(ctxDir, p), body)
}
const steps = [
  'python3 -m venv --without-pip /srv/venv',
  'python3 -m compileall -q /srv/project',
  'cd /srv/project && python3 -m unittest -q 2>&1',
]
const template = () => {
  let t = Template({ fileContextPath: ctxDir }).fromImage(image).copy('project', '/srv/project').setEnvs({ PYTHONPATH: '/srv/project' })
  for (const s of steps) t = t.runCmd(s)
  return t
}
const name = `bench-${Date.now().toString(36)}`

const out = { ms: [], total_ms: 0, failed: 0, errors: [] }
const fail = (e) => {
  out.failed++
  if (out.errors.length < 5) out.errors.push(String(e?.stack ?? e))
}
const t0 = performance.now()
if (mode === 'cached') {
  await Template.build(template(), name, { cpuCount: 1, memoryMB: 512 }) // the first build fills the cache
}
for (let i = 0; i < n; i++) {
  const start = performance.now()
  try {
    if (mode === 'build' || mode === 'cached') {
      await Template.build(template(), name, { cpuCount: 1, memoryMB: 512, skipCache: mode === 'build' })
    } else if (mode === 'by-hand') {
      const sbx = await Sandbox.create(image, { timeoutMs: 600_000 })
      await sbx.files.write(Object.entries(files).map(([p, data]) => ({ path: '/srv/' + p, data })))
      for (const s of steps) await sbx.commands.run(s, { envs: { PYTHONPATH: '/srv/project' } })
      await sbx.createSnapshot()
      out.ms.push(performance.now() - start)
      await sbx.kill()
      continue
    } else {
      throw new Error(`unknown mode ${mode}`)
    }
    out.ms.push(performance.now() - start)
  } catch (e) {
    fail(e)
  }
}
out.total_ms = performance.now() - t0
rmSync(ctxDir, { recursive: true, force: true })
console.log(JSON.stringify(out))
