// Sandbox ports and signed file URLs through sandman-gateway, with the
// official SDK: a web server in a sandbox reached through getHost (by Host
// header, as E2B's <port>-<sandboxID>.<domain> routing, and in the
// single-endpoint mode with E2b-Sandbox-Id/E2b-Sandbox-Port), with and
// without the traffic access token; maskRequestHost; a port nothing listens
// on and one the sandbox's firewall closes (the e2e gateway opens ports
// 1024-65535: e2e/e2b_e2e_test.go); signed upload and download URLs, an
// expired one and another sandbox's. Env as sdk.test.mjs says.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { Sandbox } from 'e2b'
import { env, until } from './lib.mjs'

// The root template: a server below 1024 needs root, and the base
// template's daemon runs as its user.
const template = env('SANDMAN_TEMPLATE')
const gateway = new URL(env('E2B_SANDBOX_URL'))

const made = []
after(async () => {
  await Promise.all(made.map((s) => s.kill().catch(() => {})))
})
async function create(opts = {}) {
  const s = await Sandbox.create(template, { timeoutMs: 300_000, ...opts })
  made.push(s)
  return s
}

// request sends one HTTP/1.1 request to the gateway's address with the
// headers given (Host among them: fetch cannot set it) and answers
// {status, body, ms}.
function request(path, { method = 'GET', headers = {}, body } = {}) {
  const start = performance.now()
  return new Promise((resolve, reject) => {
    const req = http.request({ host: gateway.hostname, port: gateway.port, path, method, headers, agent: false }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString(), ms: performance.now() - start }))
    })
    req.on('error', reject)
    req.setTimeout(20_000, () => req.destroy(new Error(`${method} ${path}: no answer in 20 s`)))
    req.end(body)
  })
}

// byHost and byHeaders reach port of sandbox s the two ways the gateway
// routes: getHost's name in Host, or the single-endpoint headers.
const byHost = (s, port, path = '/', headers = {}) => request(path, { headers: { host: s.getHost(port), ...headers } })
const byHeaders = (s, port, path = '/', headers = {}) =>
  request(path, { headers: { 'E2b-Sandbox-Id': s.sandboxId, 'E2b-Sandbox-Port': String(port), ...headers } })

// The sandbox's web server answers what it saw: its Host, the
// X-Forwarded-Host the gateway added, the path, and whether a traffic
// token reached it.
const server = `
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = json.dumps({"host": self.headers.get("Host"), "xfh": self.headers.get("X-Forwarded-Host"),
                        "path": self.path, "token": self.headers.get("e2b-traffic-access-token")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
`
async function serve(s, port) {
  await s.files.write('/tmp/echo.py', server)
  await s.commands.run(`python3 /tmp/echo.py ${port}`, { background: true })
}

async function reachable(s, port, headers = {}) {
  let last
  await until(`the server on port ${port}`, 20_000, async () => {
    last = await byHeaders(s, port, '/ping', headers)
    return last.status === 200
  }, () => JSON.stringify(last))
}

test('a public sandbox: any port through getHost, by Host and by headers', async () => {
  const s = await create()
  assert.equal(s.trafficAccessToken, undefined, 'a public sandbox has no traffic token')
  await serve(s, 8000)
  await reachable(s, 8000)
  const h = s.getHost(8000)
  assert.match(h, new RegExp(`^8000-${s.sandboxId}\\.`))
  const viaHost = await byHost(s, 8000, '/a/b?c=1')
  assert.equal(viaHost.status, 200, viaHost.body)
  assert.deepEqual(JSON.parse(viaHost.body), { host: h, xfh: null, path: '/a/b?c=1', token: null })
  const viaHeaders = await byHeaders(s, 8000, '/x')
  assert.equal(viaHeaders.status, 200, viaHeaders.body)
  assert.equal(JSON.parse(viaHeaders.body).path, '/x')
  // The daemon's port by name is still the daemon, which wants its token.
  const daemon = await byHost(s, 49983, '/envs')
  assert.equal(daemon.status, 401, daemon.body)
})

test('allowPublicTraffic false: only the traffic access token opens the ports', async () => {
  const s = await create({ network: { allowPublicTraffic: false, maskRequestHost: 'localhost:${PORT}' } })
  const other = await create({ network: { allowPublicTraffic: false } })
  assert.ok(s.trafficAccessToken, 'create returns a traffic token')
  assert.notEqual(s.trafficAccessToken, s.envdAccessToken)
  assert.notEqual(s.trafficAccessToken, other.trafficAccessToken)
  const again = await Sandbox.connect(s.sandboxId)
  assert.equal(again.trafficAccessToken, s.trafficAccessToken, 'connect returns the same traffic token')
  await serve(s, 8000)
  const token = { 'e2b-traffic-access-token': s.trafficAccessToken }
  await reachable(s, 8000, token)
  for (const [how, get] of [['host', byHost], ['headers', byHeaders]]) {
    const none = await get(s, 8000)
    assert.equal(none.status, 403, `${how}, no token: ${none.body}`)
    assert.match(JSON.parse(none.body).message, /Token header 'e2b-traffic-access-token' is missing/)
    for (const wrong of [other.trafficAccessToken, s.envdAccessToken]) {
      const r = await get(s, 8000, '/', { 'e2b-traffic-access-token': wrong })
      assert.equal(r.status, 403, `${how}, a wrong token: ${r.body}`)
      assert.match(JSON.parse(r.body).message, /is invalid/)
    }
    const ok = await get(s, 8000, '/in', token)
    assert.equal(ok.status, 200, `${how}, its token: ${ok.body}`)
    const seen = JSON.parse(ok.body)
    // maskRequestHost: the server sees the mask, the asked host beside it.
    assert.equal(seen.host, 'localhost:8000')
    assert.equal(seen.xfh, how === 'host' ? s.getHost(8000) : `${gateway.host}`)
    assert.equal(seen.token, null, 'the token is not passed to the sandbox')
  }
  // And the SDK's own calls do not need it.
  assert.equal((await s.commands.run('echo ok')).stdout, 'ok\n')
})

// A TLS server: a self-signed certificate made in the sandbox, served by
// the same handler.
const tlsServer = `
import http.server, json, ssl, subprocess, sys
subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=sandbox",
                "-keyout", "/tmp/key.pem", "-out", "/tmp/cert.pem"], check=True, capture_output=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = json.dumps({"tls": True, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/tmp/cert.pem", "/tmp/key.pem")
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
srv.serve_forever()
`

test('httpsPorts: a server that speaks TLS is reached through getHost; getInfo shows the network', async () => {
  const s = await create({ network: { httpsPorts: [8443] } })
  await s.files.write('/tmp/tls.py', tlsServer)
  await s.commands.run('python3 /tmp/tls.py 8443', { background: true })
  let last
  await until('the TLS server on port 8443', 30_000, async () => {
    last = await byHost(s, 8443, '/secure')
    return last.status === 200
  }, () => JSON.stringify(last))
  assert.deepEqual(JSON.parse(last.body), { tls: true, path: '/secure' })
  const info = await Sandbox.getInfo(s.sandboxId)
  assert.deepEqual(info.network.httpsPorts, [8443])
  assert.equal(info.network.allowPublicTraffic, true)
  // The pool has 6 slots: this file's sandboxes otherwise live to its end.
  await s.kill()
})

test('a port nothing listens on, and one the sandbox firewall closes, answer 502 at once', async () => {
  const s = await create()
  // A server below 1024: the gateway's ports start at 1024, so the
  // sandbox's firewall refuses the gateway there.
  await serve(s, 81)
  await until('the server on port 81 inside the sandbox', 20_000, async () =>
    (await s.commands.run('curl -s -o /dev/null -w %{http_code} http://127.0.0.1:81/ || true')).stdout === '200')
  for (const [port, want] of [[8001, /The sandbox is running but port is not open/], [81, /closed by the sandbox's ingress rules/]]) {
    for (const get of [byHost, byHeaders]) {
      const r = await get(s, port)
      assert.equal(r.status, 502, `port ${port}: ${r.body}`)
      const body = JSON.parse(r.body)
      assert.match(body.message, want)
      assert.equal(body.sandboxId, s.sandboxId)
      assert.equal(body.port, String(port))
      assert.ok(r.ms < 3000, `port ${port} answered after ${r.ms} ms`)
    }
  }
})

test('signed upload and download URLs; expired ones and other sandboxes\' are refused', async () => {
  const s = await create()
  const other = await create()
  const sandbox = { 'E2b-Sandbox-Id': s.sandboxId }
  const upload = async (url, headers = sandbox) => {
    const form = new FormData()
    form.append('file', new Blob(['signed hello\n']), 'up.txt')
    const r = await fetch(url, { method: 'POST', body: form, headers })
    return { status: r.status, body: await r.text() }
  }
  const up = await s.uploadUrl('/tmp/up.txt', { useSignatureExpiration: 120 })
  const u = new URL(up)
  assert.ok(u.searchParams.get('signature')?.startsWith('v1_'), up)
  assert.ok(u.searchParams.get('signature_expiration'), up)
  const done = await upload(up)
  assert.equal(done.status, 200, done.body)
  assert.equal(await s.files.read('/tmp/up.txt'), 'signed hello\n')

  const down = await s.downloadUrl('/tmp/up.txt')
  const got = await fetch(down, { headers: sandbox })
  assert.equal(got.status, 200)
  assert.equal(await got.text(), 'signed hello\n')
  // By host name, as a URL under the sandbox domain would be.
  const named = await request(new URL(down).pathname + new URL(down).search, { headers: { host: s.getHost(49983) } })
  assert.equal(named.status, 200, named.body)
  assert.equal(named.body, 'signed hello\n')

  const expired = await s.downloadUrl('/tmp/up.txt', { useSignatureExpiration: -10 })
  const late = await fetch(expired, { headers: sandbox })
  assert.equal(late.status, 401)
  assert.match((await late.json()).message, /expired/)
  // Another sandbox's signature for the same path, sent to this one.
  const foreign = await other.downloadUrl('/tmp/up.txt')
  const wrong = await fetch(foreign, { headers: sandbox })
  assert.equal(wrong.status, 401)
  assert.match((await wrong.json()).message, /not this sandbox's/)
  // A download's signature does not upload; another path's does not read.
  assert.equal((await upload(down)).status, 401)
  const otherPath = new URL(down)
  otherPath.searchParams.set('path', '/etc/passwd')
  assert.equal((await fetch(otherPath, { headers: sandbox })).status, 401)
  // Without a sandbox named, the single endpoint cannot tell which: the
  // request is the control API's, which has no /files.
  assert.equal((await fetch(down)).status, 404)
})
