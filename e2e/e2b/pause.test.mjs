// Pause and resume through the official E2B SDK: a sandbox of a gVisor
// template keeps a process's memory across pause and connect (which
// resumes it); a runc sandbox's pause is refused, saying why; E2B's
// lifecycle (onTimeout 'pause', autoResume) pauses at the timeout and
// resumes on a call or connect. Run by
// e2e/e2b_e2e_test.go with the other *.test.mjs files; see sdk.test.mjs for
// the environment.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { env, until } from './lib.mjs'

const gvisor = env('SANDMAN_GVISOR_TEMPLATE')
const runc = env('SANDMAN_TEMPLATE')

const made = []
after(async () => {
  for (const s of made) await s.kill().catch(() => {})
})
// done kills a test's sandboxes once it passed (after() kills those of a
// test that failed): the pool is small, and paused sandboxes hold slots.
const done = (...sandboxes) => Promise.all(sandboxes.map((s) => s.kill().catch(() => {})))

// keeper holds 16 MiB of random bytes: each time /tmp/ask appears it
// writes their digest, its pid and how many times it was asked to
// /tmp/answer. Random bytes cannot be made again: the same digest after a
// resume is the same memory.
const keeper = `
import hashlib, os, time
data = bytearray(os.urandom(16 << 20))
n = 0
while True:
    if os.path.exists("/tmp/ask"):
        n += 1
        with open("/tmp/answer.tmp", "w") as f:
            f.write("%s %d %d" % (hashlib.sha256(data).hexdigest(), os.getpid(), n))
        os.rename("/tmp/answer.tmp", "/tmp/answer")
        os.remove("/tmp/ask")
    time.sleep(0.05)
`

const ask = async (sbx) => {
  await sbx.commands.run('rm -f /tmp/answer; touch /tmp/ask')
  let answer = ''
  await until('the keeper to answer', 30_000, async () => {
    const r = await sbx.commands.run('cat /tmp/answer 2>/dev/null || true')
    answer = r.stdout
    return answer !== ''
  }, () => answer)
  return answer.split(' ')
}

test('pause keeps a gVisor sandbox running state; connect resumes it where it was', async (t) => {
  const sbx = await Sandbox.create(gvisor, { timeoutMs: 300_000 })
  made.push(sbx)
  await sbx.files.write('/tmp/keeper.py', keeper)
  await sbx.commands.run('python3 /tmp/keeper.py', { background: true })
  const [digest, pid, n] = await ask(sbx)
  assert.equal(n, '1')

  let begin = Date.now()
  assert.equal(await sbx.pause(), true, 'pause of a running sandbox')
  t.diagnostic(`paused in ${Date.now() - begin} ms`)
  assert.equal(await sbx.pause(), false, 'pause of a paused sandbox')
  assert.equal((await sbx.getInfo()).state, 'paused')
  const paused = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
  assert.ok(paused.some((s) => s.sandboxId === sbx.sandboxId), `paused list: ${JSON.stringify(paused.map((s) => s.sandboxId))}`)
  const running = await Sandbox.list({ query: { state: ['running'] } }).nextItems()
  assert.ok(!running.some((s) => s.sandboxId === sbx.sandboxId), 'a paused sandbox listed as running')

  begin = Date.now()
  const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 })
  t.diagnostic(`connect resumed it in ${Date.now() - begin} ms`)
  assert.equal((await back.getInfo()).state, 'running')
  const [digest2, pid2, n2] = await ask(back)
  assert.equal(digest2, digest, 'the memory after the resume')
  assert.equal(pid2, pid, 'the process after the resume')
  assert.equal(n2, '2', 'the count went on')
  const r = await back.commands.run('echo resumed')
  assert.equal(r.stdout, 'resumed\n')
  await done(sbx)
})

test('Sandbox.fork: forks go on from the running sandbox memory and processes, then diverge; the source runs on', async (t) => {
  const sbx = await Sandbox.create(gvisor, { timeoutMs: 300_000 })
  made.push(sbx)
  await sbx.files.write('/tmp/keeper.py', keeper)
  await sbx.commands.run('python3 /tmp/keeper.py', { background: true })
  const [digest, pid, n] = await ask(sbx)
  assert.equal(n, '1')

  const begin = Date.now()
  const forks = await Sandbox.fork(sbx.sandboxId, { count: 2, timeoutMs: 120_000 })
  t.diagnostic(`2 forks running in ${Date.now() - begin} ms`)
  assert.equal(forks.length, 2)
  for (const f of forks) {
    assert.ok(f instanceof Sandbox, `a fork failed: ${f}`)
    made.push(f)
  }
  assert.equal(new Set([sbx.sandboxId, ...forks.map((f) => f.sandboxId)]).size, 3, 'each fork has its own ID')
  for (const f of forks) {
    assert.deepEqual(await ask(f), [digest, pid, '2'], `fork ${f.sandboxId}: the memory and process it started from`)
  }
  await forks[0].files.write('/tmp/mine', 'fork 0')
  assert.equal(await forks[1].files.exists('/tmp/mine'), false, 'a fork sees another fork file')
  assert.equal(await sbx.files.exists('/tmp/mine'), false, 'the source sees a fork file')
  assert.deepEqual(await ask(sbx), [digest, pid, '2'], 'the source after the forks')
  assert.equal((await forks[1].getInfo()).templateId, (await sbx.getInfo()).templateId)
  await done(sbx, ...forks)
})

test('pausing a runc sandbox is refused with the reason, and it runs on', async () => {
  const sbx = await Sandbox.create(runc, { timeoutMs: 120_000 })
  made.push(sbx)
  await assert.rejects(sbx.pause(), /CRIU/)
  await assert.rejects(Sandbox.fork(sbx.sandboxId), /CRIU/)
  assert.equal((await sbx.getInfo()).state, 'running')
  const r = await sbx.commands.run('echo alive')
  assert.equal(r.stdout, 'alive\n')
  await done(sbx)
})

// The lifecycle's timeouts are shortened with setTimeout once the sandbox
// is set up, so that no call is under way when the timeout comes.
const pausedAtTimeout = async (sbx) => {
  await sbx.setTimeout(2_000)
  await until('the sandbox paused at its timeout', 60_000, async () => (await sbx.getInfo()).state === 'paused')
}

test('lifecycle onTimeout pause pauses at the timeout; autoResume resumes on the next call for the timeout again', async (t) => {
  const sbx = await Sandbox.create(gvisor, { timeoutMs: 120_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  made.push(sbx)
  assert.deepEqual((await sbx.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: true })
  await sbx.files.write('/tmp/keeper.py', keeper)
  await sbx.commands.run('python3 /tmp/keeper.py', { background: true })
  const [digest, pid, n] = await ask(sbx)
  assert.equal(n, '1')
  await pausedAtTimeout(sbx)

  const begin = Date.now()
  const [digest2, pid2, n2] = await ask(sbx)
  t.diagnostic(`the first call after the pause resumed it and was answered in ${Date.now() - begin} ms`)
  assert.deepEqual([digest2, pid2, n2], [digest, pid, '2'], 'the memory and process after the resume')
  const info = await sbx.getInfo()
  assert.equal(info.state, 'running')
  const left = info.endAt.getTime() - Date.now()
  assert.ok(left > 60_000 && left <= 121_000, `after the resume it ends in ${left} ms, want its timeout (120 s) again`)
  await done(sbx)
})

test('lifecycle onTimeout pause without autoResume stays paused until connect', async () => {
  const sbx = await Sandbox.create(gvisor, { timeoutMs: 120_000, lifecycle: { onTimeout: 'pause' } })
  made.push(sbx)
  assert.deepEqual((await sbx.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: false })
  const pid = (await sbx.commands.run('sleep 1000 >/dev/null 2>&1 & echo $!')).stdout.trim()
  await pausedAtTimeout(sbx)
  const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
  assert.equal((await back.getInfo()).state, 'running')
  const r = await back.commands.run(`kill -0 ${pid} && echo alive`)
  assert.equal(r.stdout, 'alive\n', 'the process started before the pause')
  await done(sbx)
  await assert.rejects(Sandbox.create(runc, { lifecycle: { onTimeout: 'pause' } }), /runc/)
})
