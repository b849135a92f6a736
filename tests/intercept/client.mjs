// A Node client: node's own fetch, through HTTPS_PROXY with undici's ProxyAgent (Node 20's fetch does not
// read the proxy variables by itself), trusting NODE_EXTRA_CA_CERTS. `node client.mjs PLAN.json OUT.json`.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(process.env.UNDICI_FROM || import.meta.url);
const { ProxyAgent } = require("undici");
const dispatcher = new ProxyAgent(process.env.HTTPS_PROXY);
const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
const results = [];
for (const item of plan) {
  const init = { method: item.method, headers: { ...item.headers }, dispatcher };
  if (item.json) {
    init.body = JSON.stringify(item.json);
    init.headers["content-type"] = "application/json";
    init.headers["accept-encoding"] = "identity";
  }
  try {
    const r = await fetch(item.url, init);
    const body = Buffer.from(await r.arrayBuffer());
    results.push({ name: item.name, status: r.status, body: body.toString("base64") });
  } catch (e) {
    results.push({ name: item.name, error: String(e), detail: String(e.cause || "") });
  }
}
writeFileSync(process.argv[3], JSON.stringify(results));
