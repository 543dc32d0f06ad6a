// File metadata (envd 0.6.2), the watch options of envd 0.6.3 and 0.6.4,
// and writing as a user where only root may make the parent, with the
// official SDK against sandman-gateway. Metadata and watches run on the
// base template (default user `user`, as E2B's). Writing as `user` where
// only root may make the parent runs on the root template, whose image has
// the same user `user`: a missing directory is made for a user only by a
// daemon that runs as root, as envd always does, and the base template's
// daemon runs as its image's user. Run by e2e/e2b_e2e_test.go (see
// sdk.test.mjs for the environment).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, InvalidArgumentError, SandboxError } from 'e2b'
import { env, until } from './lib.mjs'

const run = Date.now().toString(36)

let sbx // the base template's
let rootSbx // the root template's
before(async () => {
  ;[sbx, rootSbx] = await Promise.all([
    Sandbox.create(env('SANDMAN_BASE_TEMPLATE'), { timeoutMs: 300_000, metadata: { run, role: 'files' } }),
    Sandbox.create(env('SANDMAN_TEMPLATE'), { timeoutMs: 300_000, metadata: { run, role: 'files-root' } }),
  ])
})
after(async () => {
  await Promise.all([sbx, rootSbx].filter(Boolean).map((s) => s.kill().catch(() => {})))
})

// xattrs is what the sandbox's own tools see on p: its user.* attributes.
async function xattrs(p) {
  const r = await sbx.commands.run(
    `python3 -c 'import os,sys,json; p=sys.argv[1]; print(json.dumps({n: os.getxattr(p, n).decode() for n in sorted(os.listxattr(p)) if n.startswith("user.")}))' ${p}`)
  return JSON.parse(r.stdout)
}

test('the sandbox reports an envd version with file metadata, watch entries and network mounts', async () => {
  // The SDK gates each by this version (0.6.2, 0.6.3, 0.6.4).
  const { envdVersion } = await sbx.getInfo()
  const v = envdVersion.split('.').map(Number)
  assert.ok(v[0] > 0 || v[1] > 6 || (v[1] === 6 && v[2] >= 4), `envdVersion ${envdVersion}, want at least 0.6.4`)
})

test('file metadata: write, getInfo, list, rename keeps it, overwrite replaces or clears it', async () => {
  const dir = `/home/user/meta-${run}`
  const p = `${dir}/a.txt`
  const want = { author: 'mish', purpose: 'e2e run' }
  // Keys are lowercased, as envd does.
  const w = await sbx.files.write(p, 'one', { metadata: { Author: 'mish', purpose: 'e2e run' } })
  assert.deepEqual(w.metadata, want)
  assert.deepEqual((await sbx.files.getInfo(p)).metadata, want)
  assert.deepEqual(await xattrs(p), { 'user.e2b.author': 'mish', 'user.e2b.purpose': 'e2e run' })
  const listed = await sbx.files.list(dir)
  assert.deepEqual(listed.map((e) => [e.name, e.metadata]), [['a.txt', want]])

  const q = `${dir}/moved/b.txt`
  const moved = await sbx.files.rename(p, q)
  assert.deepEqual(moved.metadata, want)
  assert.deepEqual((await sbx.files.getInfo(q)).metadata, want)

  // Another write replaces it; one without metadata clears it, and keeps
  // what the sandbox's own tools set.
  await sbx.files.write(q, 'two', { metadata: { version: '2' } })
  assert.deepEqual((await sbx.files.getInfo(q)).metadata, { version: '2' })
  await sbx.commands.run(`python3 -c 'import os; os.setxattr("${q}", "user.tool", b"kept")'`)
  const cleared = await sbx.files.write(q, 'three')
  assert.equal(cleared.metadata, undefined)
  assert.equal((await sbx.files.getInfo(q)).metadata, undefined)
  assert.deepEqual(await xattrs(q), { 'user.tool': 'kept' })
  assert.equal(await sbx.files.read(q), 'three')

  // Many files at once (multipart) and a gzip-compressed stream (octet-stream) carry it too.
  const many = await sbx.files.write([{ path: `${dir}/m1.txt`, data: '1' }, { path: `${dir}/m2.txt`, data: '2' }], { metadata: { batch: '7' } })
  assert.deepEqual(many.map((f) => f.metadata), [{ batch: '7' }, { batch: '7' }])
  await sbx.files.write(`${dir}/gz.txt`, new Blob(['zipped']).stream(), { gzip: true, metadata: { coding: 'gzip' } })
  assert.deepEqual((await sbx.files.getInfo(`${dir}/gz.txt`)).metadata, { coding: 'gzip' })
  assert.equal(await sbx.files.read(`${dir}/gz.txt`), 'zipped')
})

test('file metadata the file cannot hold fails the write, and writes nothing', async () => {
  const p = `/home/user/meta-${run}/refused.txt`
  // Past envd's limit of 4096 bytes a file: the sandbox says so (400).
  const big = Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`k${i}`, 'v'.repeat(240)]))
  await assert.rejects(sbx.files.write(p, 'x', { metadata: big }), (e) => e instanceof InvalidArgumentError && /4096/.test(e.message))
  assert.equal(await sbx.files.exists(p), false)
  // A device cannot hold it either.
  await assert.rejects(sbx.files.write('/dev/null', 'x', { metadata: { a: 'b' } }), (e) => e instanceof InvalidArgumentError && /character device/.test(e.message))
})

test('watchDir with includeEntry (0.6.3) and allowNetworkMounts (0.6.4)', async () => {
  const dir = `/home/user/watch-${run}`
  await sbx.files.makeDir(dir)
  const events = []
  const w = await sbx.files.watchDir(dir, (e) => events.push(e), { includeEntry: true, allowNetworkMounts: true })
  try {
    await sbx.files.write(`${dir}/seen.txt`, 'x', { metadata: { seen: 'yes' } })
    const written = (e) => e.name === 'seen.txt' && e.type === 'write' && e.entry
    await until('a write event with its entry', 10_000, () => events.some(written), () => JSON.stringify(events))
    const e = events.find(written)
    assert.equal(e.entry.path, `${dir}/seen.txt`)
    assert.equal(e.entry.owner, 'user')
    assert.deepEqual(e.entry.metadata, { seen: 'yes' })
  } finally {
    await w.stop()
  }
})

test('write([...]) as user, one file under a new top-level directory: made and handed to the user', async () => {
  const top = `/newtop-${run}`
  const files = [
    ...Array.from({ length: 8 }, (_, i) => ({ path: `/home/user/many-${run}/f${i}.txt`, data: `f${i}` })),
    { path: `${top}/a.txt`, data: 'a' },
    { path: `${top}/deeper/b.txt`, data: 'b' },
  ]
  const out = await rootSbx.files.write(files, { user: 'user' })
  assert.deepEqual(out.map((f) => f.path), files.map((f) => f.path))
  const r = await rootSbx.commands.run(`stat -c '%n %U:%G' /; stat -c '%n %U:%G %a' ${top} ${top}/a.txt ${top}/deeper ${top}/deeper/b.txt; cat ${top}/deeper/b.txt`)
  assert.equal(r.stdout, [
    '/ root:root',
    `${top} user:user 755`,
    `${top}/a.txt user:user 644`,
    `${top}/deeper user:user 755`,
    `${top}/deeper/b.txt user:user 644`,
    'b',
  ].join('\n'))
  // The user may now write there on its own, as on E2B.
  assert.equal((await rootSbx.commands.run(`echo more > ${top}/c.txt && cat ${top}/c.txt`, { user: 'user' })).stdout, 'more\n')
  // makeDir and rename do the same.
  assert.equal(await rootSbx.files.makeDir(`/mk-${run}/sub`, { user: 'user' }), true)
  await rootSbx.files.rename(`${top}/a.txt`, `/mv-${run}/a.txt`, { user: 'user' })
  assert.equal((await rootSbx.commands.run(`stat -c '%U' /mk-${run} /mk-${run}/sub /mv-${run} /mv-${run}/a.txt`)).stdout, 'user\nuser\nuser\nuser\n')
})

test('as user, an existing directory of root\'s stays root\'s', async () => {
  // Writing straight into /etc needs the user's own permission (E2B's
  // envd would write it as root); nothing there changes hands.
  await assert.rejects(rootSbx.files.write('/etc/sandman-e2e.txt', 'x', { user: 'user' }), (e) => e instanceof SandboxError && /permission denied/.test(e.message))
  assert.equal(await rootSbx.files.exists('/etc/sandman-e2e.txt'), false)
  // A new directory under it is made and handed over; /etc is not.
  await rootSbx.files.write(`/etc/sandman-${run}/x.txt`, 'x', { user: 'user' })
  const r = await rootSbx.commands.run(`stat -c '%U' /etc /etc/sandman-${run} /etc/sandman-${run}/x.txt`)
  assert.equal(r.stdout, 'root\nuser\nuser\n')
  // Under root's 0700 /root nothing is made: the user cannot reach it.
  await assert.rejects(rootSbx.files.write(`/root/new-${run}/x.txt`, 'x', { user: 'user' }), (e) => e instanceof SandboxError && /permission denied/.test(e.message))
  assert.equal((await rootSbx.commands.run(`test -e /root/new-${run} && echo there || echo absent`, { user: 'root' })).stdout, 'absent\n')
})
