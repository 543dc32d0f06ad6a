// Timings of the official E2B SDK against sandman-gateway, for `make bench`
// (hack/bench/e2b.go runs it and prints the table). E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY point at the gateway. Modes:
//   node bench.mjs create-run N TEMPLATE      N × (Sandbox.create → commands.run('true') answered), then kill
//   node bench.mjs run N TEMPLATE             one sandbox, N × commands.run('true')
//   node bench.mjs concurrent N TEMPLATE      N Sandbox.create at once from this process, then kill them all
// Prints one JSON line: {"ms": [...per call...], "total_ms": T, "failed": F, "errors": [...first few...]}.
import { Sandbox } from 'e2b'

const [mode, nArg, template] = process.argv.slice(2)
const n = Number(nArg)
if (!mode || !(n > 0) || !template) {
  console.error('usage: node bench.mjs create-run|run|concurrent N TEMPLATE')
  process.exit(2)
}
const out = { ms: [], total_ms: 0, failed: 0, errors: [] }
const fail = (e) => {
  out.failed++
  if (out.errors.length < 5) out.errors.push(String(e?.stack ?? e))
}
const t0 = performance.now()

if (mode === 'create-run') {
  for (let i = 0; i < n; i++) {
    const start = performance.now()
    try {
      const sbx = await Sandbox.create(template, { timeoutMs: 600_000 })
      await sbx.commands.run('true')
      out.ms.push(performance.now() - start)
      await sbx.kill()
    } catch (e) {
      fail(e)
    }
  }
} else if (mode === 'run') {
  const sbx = await Sandbox.create(template, { timeoutMs: 600_000 })
  await sbx.commands.run('true') // warm the connection
  for (let i = 0; i < n; i++) {
    const start = performance.now()
    try {
      await sbx.commands.run('true')
      out.ms.push(performance.now() - start)
    } catch (e) {
      fail(e)
    }
  }
  await sbx.kill()
} else if (mode === 'concurrent') {
  const made = await Promise.all(Array.from({ length: n }, async () => {
    const start = performance.now()
    try {
      const sbx = await Sandbox.create(template, { timeoutMs: 600_000 })
      out.ms.push(performance.now() - start)
      return sbx
    } catch (e) {
      fail(e)
      return null
    }
  }))
  out.total_ms = performance.now() - t0
  await Promise.all(made.filter(Boolean).map((s) => s.kill().catch(fail)))
} else {
  console.error(`unknown mode ${mode}`)
  process.exit(2)
}
if (!out.total_ms) out.total_ms = performance.now() - t0
console.log(JSON.stringify(out))
