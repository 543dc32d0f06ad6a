// What the SDK tests share: their environment and polling.

// env is an environment variable e2e/e2b_e2e_test.go sets.
export const env = (k) => {
  const v = process.env[k]
  if (!v) throw new Error(`${k} is not set (run through e2e/e2b_e2e_test.go)`)
  return v
}

// until polls cond every 100 ms for at most ms; seen() says what was seen
// instead, for the failure.
export async function until(what, ms, cond, seen = () => '') {
  const end = Date.now() + ms
  for (;;) {
    if (await cond()) return
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}; seen: ${seen()}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}
