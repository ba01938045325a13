// Load test pages in headless Chromium (Playwright); print what each page shows, as JSON.
// argv: chromium executable, then one or more page URLs.
import { chromium } from "playwright-core";

const [executablePath, ...urls] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath, headless: true });
const results = {};
try {
  for (const url of urls) {
    const page = await browser.newPage();
    const console_ = [];
    page.on("console", (message) => console_.push(message.text()));
    await page.goto(url);
    await page.waitForSelector("#http[data-done]", { timeout: 30000 });
    await page.waitForSelector("#ws[data-done]", { timeout: 30000 });
    results[url] = {
      http: await page.textContent("#http"),
      ws: await page.textContent("#ws"),
      console: console_,
    };
    await page.close();
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(results));
