// The dashboard in headless Chromium (Playwright): the issue-23 flow, as a person would do it.
// argv: chromium executable, then the path of a JSON file naming the gateway, the sign-in
// link, anvil, the webhook receiver, addresses, a REST key, axe-core's script and where to
// put the screenshot.  Prints what it saw as JSON (the Python test judges it).
import { readFileSync } from "node:fs";
import { chromium } from "playwright-core";

const [executablePath, configPath] = process.argv.slice(2);
const cfg = JSON.parse(readFileSync(configPath, "utf8"));
const axeSource = readFileSync(cfg.axe, "utf8");
const out = { consoleErrors: [], axe: {}, steps: [] };
const step = (name, data = {}) => out.steps.push({ name, ...data });

async function rpc(url, method, params, headers = {}) {
  const answer = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...headers },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }),
  });
  return { status: answer.status, body: await answer.json().catch(() => null) };
}

function watch(page, label) {
  page.on("console", (message) => {
    if (message.type() === "error") {
      out.consoleErrors.push(`${label}: ${message.text()} (${message.location()?.url ?? page.url()})`);
    }
  });
  page.on("pageerror", (error) => out.consoleErrors.push(`${label}: ${error.message}`));
  page.on("dialog", (dialog) => dialog.accept());
}

async function axe(page, name) {
  await page.evaluate(axeSource);
  const result = await page.evaluate(async () =>
    // eslint-disable-next-line no-undef
    (await axe.run(document, { resultTypes: ["violations"] })).violations.map((v) => ({
      id: v.id, impact: v.impact, nodes: v.nodes.length, help: v.help,
      targets: v.nodes.slice(0, 3).map((n) => n.target.join(" ")),
    })),
  );
  out.axe[name] = result;
}

async function tabTo(page, test, limit = 60) {
  for (let i = 0; i < limit; i++) {
    await page.keyboard.press("Tab");
    if (await page.evaluate(test)) return true;
  }
  return false;
}

const browser = await chromium.launch({ executablePath, headless: true });
let page;
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: cfg.base });
  page = await context.newPage();
  watch(page, "desktop");

  // 1. Sign in through the one-time link.
  await page.goto(cfg.link); // a page with a button: opening the link uses nothing
  await Promise.all([page.waitForNavigation(), page.click("#use-link button[type=submit]")]);
  out.signedIn = new URL(page.url()).pathname === "/dashboard/" &&
    (await page.textContent("h1")) === "Overview";
  step("signed in", { url: page.url() });

  // 2. Keyboard only: create a key, copy it.
  await page.goto(`${cfg.base}/dashboard/keys`);
  out.keyboard = {};
  out.keyboard.reachedName = await tabTo(page, () => document.activeElement?.id === "key-name");
  await page.keyboard.type("browser key");
  out.keyboard.reachedSubmit = await tabTo(page, () =>
    document.activeElement?.matches("#create-key button[type=submit]"));
  step("keyboard", { ...out.keyboard });
  await Promise.all([page.waitForNavigation(), page.keyboard.press("Enter")]);
  const key = (await page.textContent("#new-key")).trim();
  out.keyboard.created = key.startsWith("svc_test_");
  out.keyboard.reachedCopy = await tabTo(page, () =>
    document.activeElement?.matches("button[data-copy]"));
  await page.keyboard.press("Enter");
  await page.waitForFunction(() =>
    document.querySelector("[data-copied]")?.textContent.length > 0);
  out.keyboard.copyNote = await page.textContent("[data-copied]");
  await axe(page, "keys (a key just created)");

  // 3. The key works on the JSON-RPC path; revoked, it is refused within a second.
  const rpcUrl = `${cfg.base}/v1/rpc/ethereum/devnet`;
  out.rpcBefore = (await rpc(rpcUrl, "eth_blockNumber", [], { "X-API-Key": key })).status;
  await page.goto(`${cfg.base}/dashboard/keys`);
  const row = page.locator("tr", { hasText: "browser key" });
  out.keyboard.reachedRevoke = await tabTo(page, () =>
    document.activeElement?.getAttribute("aria-label") === "Revoke key browser key", 80);
  const revokedAt = Date.now();
  await Promise.all([page.waitForNavigation(), page.keyboard.press("Enter")]);
  let status = 0;
  while (Date.now() - revokedAt < 3000) {
    status = (await rpc(rpcUrl, "eth_blockNumber", [], { "X-API-Key": key })).status;
    if (status === 401) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  out.rpcAfter = status;
  out.revokeMs = Date.now() - revokedAt;
  out.revokedShown = await row.locator("td", { hasText: "revoked" }).count();

  // 4. A webhook to the local receiver; a transfer; the delivery in the log; a replay.
  await page.goto(`${cfg.base}/dashboard/webhooks`);
  await page.fill("#wh-url", cfg.receiver);
  await page.selectOption("#wh-chain", "ethereum");
  await page.selectOption("#wh-type", cfg.eventType);
  await page.fill("#wh-config", JSON.stringify({ addresses: [cfg.watched] }));
  await Promise.all([page.waitForNavigation(), page.click("#create-webhook button[type=submit]")]);
  const secret = (await page.textContent("#signing-secret")).trim();
  const hookPath = await page.getAttribute("#created-title a", "href");
  out.webhook = { secret: secret.startsWith("whsec_"), id: hookPath.split("/").pop() };
  await axe(page, "webhooks (a webhook just created)");
  const sent = await rpc(cfg.anvil, "eth_sendTransaction",
    [{ from: cfg.sender, to: cfg.watched, value: "0x1" }]);
  out.webhook.tx = sent.body?.result;
  const deadline = Date.now() + 30000;
  let delivered = 0;
  while (Date.now() < deadline) {
    await page.goto(`${cfg.base}${hookPath}`);
    delivered = await page.locator("#attempts tr.attempt td.status", { hasText: "200" }).count();
    if (delivered > 0) break;
    await new Promise((r) => setTimeout(r, 250));
  }
  out.webhook.deliveredInLog = delivered;
  const eventRow = page.locator("#events tbody tr").first();
  out.webhook.eventId = await eventRow.getAttribute("data-event-id");
  await Promise.all([page.waitForNavigation(), eventRow.getByRole("button", { name: /Replay/ }).click()]);
  out.webhook.replayNotice = await page.textContent("[role=status]");
  let attempts = 0;
  while (Date.now() < deadline + 15000) {
    await page.goto(`${cfg.base}${hookPath}?event_id=${out.webhook.eventId}`);
    attempts = await page.locator("#attempts tr.attempt td.status", { hasText: "200" }).count();
    if (attempts >= 2) break;
    await new Promise((r) => setTimeout(r, 250));
  }
  out.webhook.attemptsInLog = attempts;
  await axe(page, "webhook detail and delivery log");
  // Pause, then resume.
  await Promise.all([page.waitForNavigation(), page.click("button:text-is('Pause')")]);
  out.webhook.paused = (await page.textContent("#hook-status")).trim();
  await Promise.all([page.waitForNavigation(), page.click("button:text-is('Resume')")]);
  out.webhook.resumed = (await page.textContent("#hook-status")).trim();

  // A webhook whose URL carries markup: shown as text, never run.
  await page.goto(`${cfg.base}/dashboard/webhooks`);
  await page.fill("#wh-url", `${cfg.receiver}?name=<script>alert(1)</script>`);
  await page.fill("#wh-config", JSON.stringify({ addresses: [cfg.watched] }));
  await Promise.all([page.waitForNavigation(), page.click("#create-webhook button[type=submit]")]);
  await page.goto(`${cfg.base}/dashboard/webhooks`);
  out.escaped = {
    scripts: await page.locator("script").count(),
    shown: (await page.textContent("#webhooks")).includes("<script>alert(1)</script>"),
  };

  // 5. A gas policy: its ledger on the page equals the REST answer.
  await page.goto(`${cfg.base}/dashboard/policies`);
  await page.fill("#policy-name", "browser policy");
  await page.selectOption("#policy-chain", "ethereum");
  await Promise.all([page.waitForNavigation(), page.click("#create-policy button[type=submit]")]);
  const policyId = new URL(page.url()).pathname.split("/").pop();
  const shown = {};
  for (const field of await page.locator("#ledger [data-field]").all()) {
    shown[await field.getAttribute("data-field")] = (await field.textContent()).trim();
  }
  const rest = await fetch(`${cfg.base}/v1/gas/policies/${policyId}`, {
    headers: { "X-API-Key": cfg.apiKey },
  }).then((r) => r.json());
  out.policy = { id: policyId, shown, rest: rest.spend };
  await axe(page, "gas policy");

  // 6. Some traffic for the charts, then every page: no console error, axe clean.
  for (let i = 0; i < 40; i++) {
    const method = ["eth_blockNumber", "eth_chainId", "eth_getBalance"][i % 3];
    await rpc(rpcUrl, method, method === "eth_getBalance" ? [cfg.watched, "latest"] : [],
      { "X-API-Key": cfg.apiKey });
  }
  await new Promise((r) => setTimeout(r, 2500)); // a usage flush and a latency sample
  const pages = {
    "overview (hour)": "/dashboard/?range=hour",
    "overview (day)": "/dashboard/?range=day",
    "overview (30 days)": "/dashboard/?range=month",
    "usage": "/dashboard/usage",
    "keys": "/dashboard/keys",
    "webhooks": "/dashboard/webhooks",
    "webhook": hookPath,
    "policies": "/dashboard/policies",
    "policy": `/dashboard/policies/${policyId}`,
    "wallets": "/dashboard/wallets",
    "bundler": `/dashboard/bundler?sender=${cfg.watched}`,
    "reference": "/dashboard/reference",
    "account": "/dashboard/account",
    "operator": "/dashboard/operator",
  };
  out.pageStatus = {};
  for (const [name, path] of Object.entries(pages)) {
    const answer = await page.goto(`${cfg.base}${path}`);
    out.pageStatus[name] = answer.status();
    if (cfg.shots) {
      await page.screenshot({ path: `${cfg.shots}/${name.replace(/\W+/g, "-")}.png`, fullPage: true });
    }
    await axe(page, name);
  }
  // The operator's view of one account (the operator page was the last one visited).
  const accountPath = await page.getAttribute("#accounts a", "href");
  out.pageStatus["operator: an account"] = (await page.goto(`${cfg.base}${accountPath}`)).status();
  await axe(page, "operator: an account");
  await page.goto(`${cfg.base}/dashboard/?range=hour`);
  out.overview = {
    requests: await page.textContent("#total-requests"),
    charts: await page.locator("svg.chart").count(),
    lines: await page.locator("svg.chart polyline, svg.chart circle").count(),
  };
  await page.screenshot({ path: cfg.screenshot, fullPage: true });

  // 7. A narrow (390 px) viewport: no sideways scrolling, the key form usable.
  const narrow = await browser.newContext({
    viewport: { width: 390, height: 844 }, storageState: await context.storageState(),
  });
  const phone = await narrow.newPage();
  watch(phone, "390px");
  out.narrow = {};
  for (const path of ["/dashboard/", "/dashboard/keys", "/dashboard/webhooks", hookPath]) {
    await phone.goto(`${cfg.base}${path}`);
    out.narrow[path] = await phone.evaluate(() => document.documentElement.scrollWidth);
    if (out.narrow[path] > 390) {
      // What sticks out: for the failure message.
      out.narrowWide = out.narrowWide || {};
      out.narrowWide[path] = await phone.evaluate(() => {
        // Which block, hidden, brings the page back to the viewport's width.
        const found = [];
        for (const e of document.querySelectorAll("main > *, main section > *")) {
          const before = e.style.display;
          e.style.display = "none";
          if (document.documentElement.scrollWidth <= 390) {
            found.push(`${e.tagName.toLowerCase()}#${e.id}.${e.className}`);
          }
          e.style.display = before;
        }
        return found;
      });
    }
  }
  await phone.goto(`${cfg.base}/dashboard/keys`);
  const box = await phone.locator("#create-key button[type=submit]").boundingBox();
  out.narrow.submitInside = box !== null && box.x >= 0 && box.x + box.width <= 390;
  await phone.fill("#key-name", "phone key");
  await Promise.all([phone.waitForNavigation(), phone.click("#create-key button[type=submit]")]);
  out.narrow.created = (await phone.textContent("#new-key")).trim().startsWith("svc_test_");
  await narrow.close();
} catch (error) {
  // What went wrong, where the page was and what it showed: the test prints it.
  out.error = String(error.stack || error);
  if (page) {
    out.errorUrl = page.url();
    out.errorFocus = await page.evaluate(() =>
      document.activeElement?.outerHTML?.slice(0, 200)).catch(() => null);
    out.errorText = (await page.textContent("main").catch(() => "")).slice(0, 1500);
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
