// The dashboard end to end, in headless Chromium: `sluice serve` on rules of its own, the page
// loaded at 1400 px wide, traffic sent, and the page must show the decisions move on plots with
// axes, a token bucket as its rate and burst, no column cut off, and a failed reload appear.
// Run by scripts/test, which installs Chromium and playwright-core:
//
//   SLUICE_BIN=target/debug/sluice PLAYWRIGHT_DIR=target/browser-test CHROMIUM=/usr/bin/chromium \
//     node crates/sluice/tests/browser/dashboard.mjs target/dashboard.png
//
// Every wait is bounded and waits for a condition, never for a time.
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const require = createRequire(resolve(process.env.PLAYWRIGHT_DIR, "node_modules") + "/");
const { chromium } = require("playwright-core");
const screenshot = process.argv[2] || "dashboard.png";
const WAIT = 20_000;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on("error", reject);
  });
}

async function until(what, check) {
  const deadline = Date.now() + WAIT;
  for (;;) {
    try {
      if (await check()) return;
    } catch {}
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise(r => setTimeout(r, 50));
  }
}

const dir = mkdtempSync(join(tmpdir(), "sluice-dashboard-"));
const rules = join(dir, "rules.yaml");
writeFileSync(rules, `domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3, alignment: first_request}
  - key: spender
    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 20, burst: 40}
`);
// A user name as long as real ones get (an email, a UUID): its counter key has no space to
// wrap at.
const alice = "alice-" + "0123456789abcdef".repeat(5) + "@example.com";

// Every table cell lies within its section: none is cut off or pushed out of view, and the page
// needs no sideways scrolling.
async function nothingClipped(page) {
  const clipped = await page.evaluate(() => {
    const out = [];
    for (const cell of document.querySelectorAll("th, td")) {
      const box = cell.closest("section").getBoundingClientRect();
      const r = cell.getBoundingClientRect();
      if (r.width > 0 && (r.left < box.left - 0.5 || r.right > box.right + 0.5)) {
        out.push(`"${cell.textContent}" (${Math.round(r.left)}-${Math.round(r.right)} in ` +
          `${Math.round(box.left)}-${Math.round(box.right)})`);
      }
    }
    if (document.documentElement.scrollWidth > window.innerWidth) {
      out.push(`the page is ${document.documentElement.scrollWidth} px wide`);
    }
    return out;
  });
  if (clipped.length) throw new Error("clipped at 1400 px: " + clipped.join(", "));
}
const [http, grpc] = [await freePort(), await freePort()];
const server = spawn(process.env.SLUICE_BIN, ["serve", "--config", rules,
  "--http-addr", `127.0.0.1:${http}`, "--grpc-addr", `127.0.0.1:${grpc}`,
  "--reload-debounce", "50ms"], { stdio: "inherit", env: { ...process.env, SLUICE_LOG: "warn" } });
const base = `http://127.0.0.1:${http}`;
let browser;
let failed = false;
try {
  await until("sluice to answer /healthz", async () => (await fetch(base + "/healthz")).ok);
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ["--no-sandbox"] });
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const errors = [];
  page.on("pageerror", e => errors.push(String(e)));
  await page.goto(base + "/dashboard");
  const text = sel => page.textContent(sel);
  await until("the page to show live data", async () => (await text("#status")).startsWith("live"));
  if ((await text("#decisions-total")) !== "0") throw new Error("decisions before any traffic");

  // 5 requests for one user at 3 an hour: 3 allowed, 2 limited. The window starts at the first
  // request: one aligned to the clock could end among the five and let a fourth through.
  for (let i = 0; i < 5; i++) {
    await fetch(base + "/json", { method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ domain: "shop", descriptors: [{ entries: [{ key: "user", value: alice }] }] }) });
  }
  await until("the counts on the page to move", async () =>
    (await text("#allowed-total")) === "3" && (await text("#limited-total")) === "2");
  if ((await text("#decisions-total")) !== "5") throw new Error("the total is not 5");
  await until("alice among the most limited", async () => (await text("#top")).includes("user=" + alice));

  // The plot has its axes: decisions per second from 0 to the top, and the time below.
  const axes = page.locator("#rules-activity .plot").first();
  const y = await axes.locator(".y-axis").textContent();
  if (!/^\d+\/s0$/.test(y)) throw new Error(`the plot's y axis reads "${y}"`);
  const x = await axes.locator(".x-axis span").allTextContents();
  if (x.length !== 2 || x.some(t => !/\d:\d\d/.test(t))) throw new Error(`the x axis reads ${x}`);
  // The bucket is shown as what it is, not as "40 per second".
  if (!(await text("#rules")).includes("20 per second, burst 40")) throw new Error("the bucket's limit");
  await nothingClipped(page);

  // An invalid rule file: the reload fails, the page says where, the old rules stay.
  writeFileSync(rules, "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 3}\n");
  await until("the failed reload on the page", async () =>
    ((await page.textContent("#reloads li.failed")) || "").includes("rules.yaml:4:"));
  const rows = await page.locator("#rules tr").count();
  if (rows !== 2) throw new Error(`the old rules should stay in force, the page lists ${rows} rows`);
  await nothingClipped(page);
  await page.screenshot({ path: screenshot, fullPage: true });
  if (errors.length) throw new Error("errors in the page: " + errors.join("; "));
  console.log(`dashboard: counts moved on plots with axes, nothing clipped at 1400 px, the ` +
    `failed reload shows; screenshot in ${screenshot}`);
} catch (e) {
  failed = true;
  console.error("dashboard test failed:", e.message);
} finally {
  if (browser) await browser.close();
  server.kill("SIGTERM");
  rmSync(dir, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
