// A chaingate bench report in headless Chromium (Playwright): what its charts draw, as JSON,
// and a screenshot.  argv: chromium executable, report URL, PNG path, page width, and the
// height of the page's top to take (0: the whole page).
import { chromium } from "playwright-core";

const [executablePath, url, png, width, height] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath, headless: true });
try {
  const page = await browser.newPage({ viewport: { width: Number(width), height: 900 } });
  const requests = [];
  page.on("request", (request) => requests.push(request.url()));
  await page.goto(url);
  const charts = await page.$$eval("svg", (svgs) =>
    svgs.map((svg) => {
      const box = svg.getBoundingClientRect();
      return {
        title: svg.getAttribute("aria-label"),
        width: box.width,
        height: box.height,
        lines: svg.querySelectorAll("polyline").length,
        bars: svg.querySelectorAll("rect").length,
      };
    }),
  );
  const top = Number(height || 0);
  await page.screenshot(
    { path: png, fullPage: true, ...(top ? { clip: { x: 0, y: 0, width: Number(width), height: top } } : {}) },
  );
  console.log(JSON.stringify({ charts, requests }));
} finally {
  await browser.close();
}
