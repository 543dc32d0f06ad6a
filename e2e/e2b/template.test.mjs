// Templates built from code (Template().fromTemplate(...).runCmd(...)
// .copy(...) ... and Template.build) with the official SDK against
// sandman-gateway: each step kind, build logs, a sandbox made from the
// template, a cached rebuild, a failing step. Run by e2e/e2b_e2e_test.go
// (see sdk.test.mjs for the environment).
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Sandbox, Template, BuildError } from 'e2b'
import { env } from './lib.mjs'

const base = env('SANDMAN_BASE_TEMPLATE')
const run = `${Date.now().toString(36)}`
const name = `tpl-${run}`

// The build's context: a small Python project.
const ctxDir = mkdtempSync(join(tmpdir(), 'sandman-template-'))
mkdirSync(join(ctxDir, 'app', 'data'), { recursive: true })
writeFileSync(join(ctxDir, 'app', 'main.py'), 'print("hello from the template")\n')
writeFileSync(join(ctxDir, 'app', 'data', '.hidden'), 'dot\n')

const killed = []
after(async () => {
  await Promise.all(killed.map((s) => s.kill().catch(() => {})))
  rmSync(ctxDir, { recursive: true, force: true })
})

// template is every step kind: a RUN as root, a COPY of a local
// directory, ENV, USER (a new user), WORKDIR (made for that user), a RUN
// as that user there, and a start command with a ready command.
const template = () =>
  Template({ fileContextPath: ctxDir })
    .fromTemplate(base)
    .runCmd('mkdir -p /opt/tools && echo tool > /opt/tools/marker', { user: 'root' })
    .copy('app', '/home/user/app/', { user: 'user' })
    .setEnvs({ APP_MODE: 'test', GREETING: 'hi there' })
    .setUser('worker')
    .setWorkdir('/srv/app')
    .runCmd('echo "built by $(id -un) in $(pwd) mode $APP_MODE" > built.txt')
    .setStartCmd('echo started > /tmp/start-marker; exec python3 -m http.server 8000 --bind 127.0.0.1', 'curl -sf http://127.0.0.1:8000/ >/dev/null')

let first
test('Template.build: every step kind, with build logs', async () => {
  const logs = []
  first = await Template.build(template(), name, { cpuCount: 1, memoryMB: 512, onBuildLogs: (l) => logs.push(l.toString()) })
  assert.equal(first.name, name)
  assert.ok(first.templateId && first.buildId, JSON.stringify(first))
  const text = logs.join('\n')
  for (const want of ['[1/6] RUN mkdir -p /opt/tools', '[2/6] COPY app /home/user/app/ user', '[4/6] USER worker', 'Snapshot']) {
    assert.ok(text.includes(want), `logs lack ${want}:\n${text}`)
  }
  assert.equal(await Template.exists(name), true)
  assert.equal(await Template.exists(`absent-${run}`), false)
})

test('a sandbox from the template: files, env, user, working directory, start command', async () => {
  const sbx = await Sandbox.create(name, { timeoutMs: 120_000, envs: { FROM_CREATE: 'yes' } })
  killed.push(sbx)
  // The ready command passed before create answered: the server answers now.
  const served = await sbx.commands.run('curl -s http://127.0.0.1:8000/built.txt; cat /tmp/start-marker')
  assert.equal(served.stdout, 'built by worker in /srv/app mode test\nstarted\n')
  const r = await sbx.commands.run('id -un; pwd; echo "$APP_MODE|$GREETING|$FROM_CREATE"; cat /opt/tools/marker')
  assert.equal(r.stdout, 'worker\n/srv/app\ntest|hi there|yes\ntool\n')
  const files = await sbx.commands.run('cat /home/user/app/main.py /home/user/app/data/.hidden; stat -c %U /home/user/app/main.py /srv/app/built.txt')
  assert.equal(files.stdout, 'print("hello from the template")\ndot\nuser\nworker\n')
  assert.equal((await sbx.commands.run('python3 /home/user/app/main.py')).stdout, 'hello from the template\n')
})

test('a rebuild of the same steps is cached', async () => {
  const logs = []
  const t0 = Date.now()
  const again = await Template.build(template(), name, { cpuCount: 1, memoryMB: 512, onBuildLogs: (l) => logs.push(l.toString()) })
  const took = Date.now() - t0
  assert.equal(again.templateId, first.templateId)
  assert.notEqual(again.buildId, first.buildId)
  assert.ok(logs.join('\n').includes('CACHED [6/6]'), logs.join('\n'))
  assert.ok(took < 5000, `a cached rebuild took ${took} ms`)
})

// api calls E2B's control API as the CLI does (the SDK has no call for
// these): {status, body}.
async function api(method, path) {
  const r = await fetch(new URL(path, env('E2B_API_URL')), { method, headers: { 'X-API-Key': env('E2B_API_KEY') } })
  const text = await r.text()
  return { status: r.status, body: text ? JSON.parse(text) : null }
}

test('the CLI\'s template calls: list, builds, build logs, delete', async () => {
  const list = await api('GET', '/templates')
  assert.equal(list.status, 200)
  const mine = list.body.find((t) => t.templateID === first.templateId)
  assert.ok(mine, `the list lacks ${name}: ${JSON.stringify(list.body)}`)
  assert.deepEqual(mine.names, [name])
  assert.equal(mine.buildStatus, 'ready')
  assert.equal(mine.cpuCount, 1)
  assert.equal(mine.memoryMB, 512)
  assert.ok(mine.buildCount >= 2, `buildCount ${mine.buildCount}`)
  assert.equal(list.body.find((t) => t.names.includes('base')), undefined, 'the operator\'s templates are not the key\'s')
  const builds = await api('GET', `/templates/${first.templateId}`)
  assert.equal(builds.status, 200)
  assert.ok(builds.body.builds.some((b) => b.buildID === first.buildId && b.status === 'ready'), JSON.stringify(builds.body))
  const logs = await api('GET', `/templates/${first.templateId}/builds/${first.buildId}/logs?limit=1000`)
  assert.equal(logs.status, 200)
  assert.ok(logs.body.logs.some((l) => l.message.includes('[1/6] RUN mkdir -p /opt/tools')), JSON.stringify(logs.body.logs.slice(0, 5)))
  // Delete a template of its own, then it is gone; the operator's are not the key's.
  const doomed = await Template.build(template(), `doomed-${run}`, { cpuCount: 1, memoryMB: 512 })
  assert.equal((await api('DELETE', `/templates/${doomed.templateId}`)).status, 204)
  assert.equal(await Template.exists(`doomed-${run}`), false)
  assert.equal((await api('GET', `/templates/${doomed.templateId}`)).status, 404)
  await assert.rejects(Sandbox.create(`doomed-${run}`, { timeoutMs: 60_000 }), /not found/)
  assert.equal((await api('DELETE', '/templates/base')).status, 403)
})

test('sandbox logs: the pod\'s log through the virtual node, filtered', async () => {
  const sbx = await Sandbox.create(base, { timeoutMs: 120_000 })
  killed.push(sbx)
  // A gateway sandbox has no main command, so its log is empty; the call
  // goes through the apiserver and the virtual node (kubectl logs).
  const logs = await api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs?level=info&limit=10`)
  assert.equal(logs.status, 200, JSON.stringify(logs.body))
  assert.ok(Array.isArray(logs.body.logs), JSON.stringify(logs.body))
  const v1 = await api('GET', `/sandboxes/${sbx.sandboxId}/logs`)
  assert.equal(v1.status, 200, JSON.stringify(v1.body))
  assert.ok(Array.isArray(v1.body.logs) && Array.isArray(v1.body.logEntries), JSON.stringify(v1.body))
  assert.equal((await api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs?direction=up`)).status, 400)
  assert.equal((await api('GET', '/v2/sandboxes/nosuchsandbox/logs')).status, 404)
})

test('a failing step fails the build with its output; nothing is left behind', async () => {
  const broken = Template({ fileContextPath: ctxDir }).fromTemplate(base).copy('app', 'app').runCmd('echo about-to-fail; exit 7')
  const err = await Template.build(broken, `broken-${run}`, { cpuCount: 1, memoryMB: 512 }).catch((e) => e)
  assert.ok(err instanceof BuildError, `want BuildError, got ${err}`)
  assert.match(err.message, /step 2 .*exit code 7/s)
  assert.match(err.message, /about-to-fail/)
  // The build's sandbox is gone (it is listed while it runs).
  let left = []
  const deadline = Date.now() + 15_000
  do {
    left = (await Sandbox.list().nextItems()).filter((s) => (s.metadata ?? {})['sandman.template-build']?.startsWith(`broken-${run}/`))
    if (left.length === 0) break
    await new Promise((r) => setTimeout(r, 200))
  } while (Date.now() < deadline)
  assert.deepEqual(left.map((s) => s.sandboxId), [])
  await assert.rejects(Sandbox.create(`broken-${run}`, { timeoutMs: 60_000 }), /no finished build/)
})

test('a template from a private image: fromImage with credentials; wrong ones fail the build, saying so', async () => {
  const image = env('SANDMAN_PRIVATE_IMAGE')
  const user = env('SANDMAN_PRIVATE_USER')
  const priv = `private-${run}`
  const built = Template().fromImage(image, { username: user, password: env('SANDMAN_PRIVATE_PASSWORD') })
    .runCmd('echo built-from-private > /etc/private-marker')
  await Template.build(built, priv, { cpuCount: 1, memoryMB: 256 })
  const sbx = await Sandbox.create(priv, { timeoutMs: 60_000 })
  killed.push(sbx)
  // busybox has no bash, which commands.run uses: read the file.
  assert.equal(await sbx.files.read('/etc/private-marker'), 'built-from-private\n')
  await sbx.kill()

  const wrong = Template().fromImage(image, { username: user, password: 'wrong' }).runCmd('echo again > /etc/again')
  await assert.rejects(Template.build(wrong, `${priv}-wrong`, { cpuCount: 1, memoryMB: 256 }),
    (e) => e instanceof BuildError && /unauthorized|credentials/i.test(e.message))
})
