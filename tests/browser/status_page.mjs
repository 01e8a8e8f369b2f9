// The status page in a real browser: signs in with the bearer token, waits
// for the local host, says `ready`, then reads `SANDBOX JOB` on stdin and
// waits, without reloading, for the sandbox to show and the job to run and
// end. Keeps a screenshot; prints {render_ms, navigations, ended,
// failures, gpu_charts} as JSON.
//
// node status_page.mjs BASE_URL TOKEN SHOT_DIR
import { createRequire } from 'node:module';
import { createInterface } from 'node:readline';
import { join } from 'node:path';

const require = createRequire(import.meta.url);
const { chromium } = require(process.env.PLAYWRIGHT_CORE);
const [base, token, shotDir] = process.argv.slice(2);
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
const failures = [];
page.on('pageerror', (e) => failures.push(e.message));
page.on('console', (m) => { if (m.type() === 'error') failures.push(m.text()); });

await page.goto(`${base}/`);
await page.fill('#proof', token);
const started = Date.now();
await page.click('button');
await page.waitForSelector('[data-host="local"] figure', { timeout: 20000 });
const renderMs = Date.now() - started;
let navigations = 0;
page.on('framenavigated', (frame) => { if (frame === page.mainFrame()) navigations += 1; });
console.log('ready');

const [sandbox, job] = (await lines.next()).value.trim().split(' ');
await page.waitForSelector(`[data-sandbox="${sandbox}"]`, { timeout: 20000 });
await page.waitForSelector(`[data-job="${job}"][data-state="running"]`, { timeout: 20000 });
await page.screenshot({ path: join(shotDir, 'status-page.png'), fullPage: true });
await page.waitForSelector(`[data-job="${job}"]:not([data-state="running"])`, { timeout: 30000 });
const ended = await page.getAttribute(`[data-job="${job}"]`, 'data-state');
const gpuCharts = await page.locator('[data-host="local"] figcaption', { hasText: 'GPU' }).count();
await browser.close();
console.log(JSON.stringify({ render_ms: renderMs, navigations, ended, failures, gpu_charts: gpuCharts }));
